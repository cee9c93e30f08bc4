"""The worker's batched path over a :class:`~dagwerk.store.BatchQueueStore`.

Per batch, instead of about ten transactions per delivery:

1. one ``claim_deliveries``: the leases and the claims (on SQLite one
   commit); rows whose claim was refused take the one-by-one path;
2. the reads every attempt would repeat, once per run (:class:`BatchReads`):
   lineage link, budget, and the outputs of all its attempts' plans;
3. every attempt's abort signal is registered, then each run's status is
   read once: a cancellation that committed after the claim still stops the
   attempt before its plugin starts (WK-15);
4. the plugins run in parallel (up to ``concurrency``);
5. one ``complete_and_ack`` for every attempt that returned outputs, then one
   reconcile per run whose launch completed (:func:`complete_attempts`);
   failures, timeouts, waits and cancellations settle one by one.
   Where that is one unit of work (SQLite), the unit also claims the next
   batch (step 1 of the next round), so it sees the launches just made
   without a transaction of its own; a stopping worker gives such claims
   back (nack) as it does for the attempts it aborts.

The lease taken by the claim already runs to the ownership bound
(``lease_seconds + lease_grace``, WK-03); only a task whose timeout is
longer extends it. Nothing is acknowledged before its transition commits.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING

from dagwerk.budgets import BudgetExhaustedError
from dagwerk.completions import complete_attempts
from dagwerk.constants import RunStatus
from dagwerk.errors import DagwerkError
from dagwerk.runtime.actor import LoopHandedOver
from dagwerk.runtime.attempts import Attempt, BatchReads
from dagwerk.runtime.budget_guard import check_output_limit
from dagwerk.runtime.executors import AttemptJob, ExecutionOutcome, OutcomeKind, ThreadExecutor
from dagwerk.runtime.traced import (
    attempts_settled,
    attempts_settling,
    batch_stored,
    now_ns,
)
from dagwerk.store import (
    BatchQueueStore,
    ClaimedDelivery,
    CompletionRequest,
    OutputPublicationError,
    TaskCompletionResult,
    TaskRecord,
)

if TYPE_CHECKING:
    from dagwerk.runtime.worker import Worker

__all__ = ["process_batch"]

_LOG = logging.getLogger("dagwerk.runtime.worker")


def process_batch(worker: Worker, store: BatchQueueStore, wait_seconds: float) -> int | None:
    """Claim and run one batch; the number of rows leased, or ``None`` when
    nothing was leased (the caller then sweeps). The batch is the one the
    previous batch's completions claimed ahead, if any."""
    claims = worker._take_claimed_ahead() or _claim(worker, store, wait_seconds)
    worker._settle_dead_lettered()
    if not claims:
        return None
    claimed = [c for c in claims if c.task is not None]
    for refused in (c for c in claims if c.task is None):
        # Run not RUNNING, a stale attempt, or a redelivery of a RUNNING task
        # whose holder died: the one-by-one path decides (and recovers).
        worker._handle(refused.delivery)
    if claimed:
        _run_claimed(worker, claimed)
    return len(claims)


def _claim(worker: Worker, store: BatchQueueStore, wait_seconds: float) -> list[ClaimedDelivery]:
    return store.claim_deliveries(
        worker.worker_id,
        limit=worker.concurrency,
        lease_seconds=worker.lease_bound(None),
        queues=worker.queues,
        wait_seconds=wait_seconds,
        plugins=worker.served_plugins(),
        prefer_run=worker.prefer_run,
    )


def _run_claimed(worker: Worker, claimed: list[ClaimedDelivery]) -> None:
    plans: dict[str, list[TaskRecord]] = defaultdict(list)
    for claim in claimed:
        assert claim.task is not None
        plans[claim.delivery.run_id].append(claim.task)
    reads = BatchReads(
        worker.store,
        plans,
        child_store=worker.child_store,
        budget_store=worker.budget_store,
        recent_outputs=worker.capabilities.recent_outputs,
        links=worker.run_links,
    )
    leased_bound = worker.lease_bound(None)
    attempts: list[Attempt] = []
    for claim in claimed:
        try:
            attempt = worker._prepare(
                claim.delivery, claim.task, reads=reads, leased_bound=leased_bound
            )
        except Exception as exc:  # one bad delivery never stops the batch
            _failed_in_worker(worker, claim, exc)
            continue
        if attempt is not None:
            attempts.append(attempt)
    for attempt in attempts:
        worker._register(attempt)
        worker.monitor.add(attempt)
    try:
        runnable = _still_running(worker, attempts)
        if _inlinable(worker, runnable):
            outcomes = [_execute_inline(worker, runnable[0], attempts)]
        else:
            outcomes = _execute_all(worker, runnable)
    except LoopHandedOver:
        raise  # the rest of this batch was finished by the thread it went to
    except BaseException:
        _forget(worker, attempts)
        raise
    _finish(worker, runnable, outcomes, attempts)


def _finish(
    worker: Worker,
    runnable: list[Attempt],
    outcomes: list[ExecutionOutcome | Exception],
    attempts: list[Attempt],
) -> None:
    worker.task_logs.flush()  # the attempts' lines are stored before they settle
    attempts_settling(worker.tracing, runnable, outcomes)
    try:
        _settle_all(worker, runnable, outcomes)
    finally:
        attempts_settled(worker.tracing, runnable)
        _forget(worker, attempts)


def _forget(worker: Worker, attempts: list[Attempt]) -> None:
    for attempt in attempts:
        worker.monitor.remove(attempt)
        worker._unregister(attempt)


def _inlinable(worker: Worker, runnable: list[Attempt]) -> bool:
    """A lone attempt of the built-in thread executor, in the actor's loop:
    its plugin runs on the loop thread itself (``runtime/_inline.py``)."""
    return (
        len(runnable) == 1
        and type(worker.executor) is ThreadExecutor
        and worker.actor.in_loop_thread()
    )


def _execute_inline(
    worker: Worker, attempt: Attempt, attempts: list[Attempt]
) -> ExecutionOutcome | Exception:
    try:
        ctx = worker._start_attempt(attempt)
    except Exception as exc:  # e.g. a failing secret resolver
        return exc
    entry = attempt.entry
    job = AttemptJob(attempt.spec.fn, attempt.inputs, ctx, attempt.timeout, entry.signal)

    def finish_elsewhere(outcome: ExecutionOutcome) -> None:
        # Settled (timeout, abort) while the plugin still runs on this
        # thread: the batch and the loop go on in another one.
        def rest() -> bool:
            entry.finish()
            _finish(worker, [attempt], [outcome], attempts)
            worker._step_finished()
            return True

        worker.actor.hand_over(rest)

    try:
        return worker.inline.run(job, finish_elsewhere)
    finally:
        entry.finish()


def _failed_in_worker(worker: Worker, claim: ClaimedDelivery, exc: Exception) -> None:
    delivery = claim.delivery
    _LOG.exception("delivery %s failed in the worker", delivery.delivery_id, exc_info=exc)
    worker.queue.nack(delivery.delivery_id, worker.worker_id, delay=worker.poll_interval)
    worker._report(delivery, "error", f"{type(exc).__name__}: {exc}")


def _still_running(worker: Worker, attempts: list[Attempt]) -> list[Attempt]:
    """Read each run's status once, after every signal is registered."""
    statuses: dict[str, RunStatus | Exception | None] = {}
    runnable: list[Attempt] = []
    for attempt in attempts:
        delivery = attempt.delivery
        if delivery.run_id not in statuses:
            try:
                statuses[delivery.run_id] = worker._read_status(delivery.run_id)
            except Exception as exc:
                statuses[delivery.run_id] = exc
        status = statuses[delivery.run_id]
        if isinstance(status, Exception):
            worker._crash_unreadable(delivery, status)
        elif status is not RunStatus.RUNNING:
            worker._ack(delivery, "cancelled", f"run is {status}")
        else:
            runnable.append(attempt)
    return runnable


def _execute_all(worker: Worker, attempts: list[Attempt]) -> list[ExecutionOutcome | Exception]:
    executor = worker.executor
    if type(executor) is ThreadExecutor and attempts:
        return _execute_threaded(worker, executor, attempts)

    def run(attempt: Attempt) -> ExecutionOutcome | Exception:
        try:
            return worker._run(attempt, watch=False)
        except Exception as exc:
            return exc

    if len(attempts) <= 1:
        return [run(attempt) for attempt in attempts]
    futures = [worker._pool.submit(run, attempt) for attempt in attempts[1:]]
    # The loop thread runs one attempt itself rather than idle.
    first = run(attempts[0])
    return [first, *(future.result() for future in futures)]


def _execute_threaded(
    worker: Worker, executor: ThreadExecutor, attempts: list[Attempt]
) -> list[ExecutionOutcome | Exception]:
    """The built-in thread executor runs the whole batch: one plugin thread
    per attempt, supervised by the loop thread (no thread per attempt waits)."""
    results: list[ExecutionOutcome | Exception | None] = []
    jobs: list[AttemptJob] = []
    for attempt in attempts:
        try:
            ctx = worker._start_attempt(attempt)
        except Exception as exc:  # e.g. a failing secret resolver: this attempt only
            results.append(exc)
            continue
        results.append(None)
        jobs.append(
            AttemptJob(attempt.spec.fn, attempt.inputs, ctx, attempt.timeout, attempt.entry.signal)
        )
    try:
        outcomes = iter(executor.execute_many(jobs, clock=worker.clock))
    finally:
        for attempt in attempts:
            attempt.entry.finish()
    return [next(outcomes) if result is None else result for result in results]


def _settle_all(
    worker: Worker, attempts: list[Attempt], outcomes: list[ExecutionOutcome | Exception]
) -> None:
    done: list[Attempt] = []
    for attempt, outcome in zip(attempts, outcomes, strict=True):
        delivery = attempt.delivery
        if isinstance(outcome, Exception):
            _LOG.error("delivery %s failed in the worker", delivery.delivery_id, exc_info=outcome)
            worker.queue.nack(delivery.delivery_id, worker.worker_id, delay=worker.poll_interval)
            worker._report(delivery, "error", f"{type(outcome).__name__}: {outcome}")
        elif outcome.kind is OutcomeKind.OK:
            if check_output_limit(worker, delivery, outcome.outputs):
                done.append(attempt)
        else:
            worker._handle_settle(attempt, outcome)
    if done:
        _complete_all(worker, done, {id(a): o for a, o in zip(attempts, outcomes, strict=True)})


def _complete_all(
    worker: Worker, done: list[Attempt], outcomes: dict[int, ExecutionOutcome | Exception]
) -> None:
    requests = []
    for attempt in done:
        outcome = outcomes[id(attempt)]
        assert isinstance(outcome, ExecutionOutcome)
        requests.append(
            CompletionRequest(
                attempt.delivery.task_id,
                attempt.delivery.attempt_id,
                outcome.outputs,
                attempt.delivery.delivery_id,
                attempt.delivery.run_id,
            )
        )
    # Where the completions commit in one unit of work, the next batch is
    # claimed in it too: it sees the launches just made, and the worker saves
    # a transaction per batch. The claims count only once the unit commits.
    ahead: list[ClaimedDelivery] = []
    store = worker._batch_store
    announcer = None if store is None else worker.capabilities.claim_ahead
    expected: list[bool] = []

    def expect() -> None:
        # The unit's launches may then insert the tasks this claim would
        # take first as already claimed (SQLite; see sql/_ahead.py).
        if announcer is not None and not worker._stopped:
            expected.append(
                announcer.expect_claim(
                    worker.worker_id,
                    limit=worker.concurrency,
                    lease_seconds=worker.lease_bound(None),
                    queues=worker.queues,
                    plugins=worker.served_plugins(),
                )
            )

    def claim_ahead() -> None:
        # Once announced, the claim is made even by a stopping worker: it
        # hands over what the launches claimed, which the stop gives back.
        if store is not None and (any(expected) or not worker._stopped):
            ahead.extend(_claim(worker, store, 0.0))

    stored_from = now_ns()
    try:
        results = complete_attempts(
            worker.store,
            worker.worker_id,
            requests,
            callbacks=worker.callbacks,
            before=expect,
            then=claim_ahead,
        )
    except Exception:
        # Nothing of the batch committed (or it did and the reconcile failed,
        # which the completions' exact repeats redo): settle one by one.
        _LOG.exception("a batch of %d completions failed; settling one by one", len(done))
        for attempt in done:
            outcome = outcomes[id(attempt)]
            assert isinstance(outcome, ExecutionOutcome)
            worker._handle_settle(attempt, outcome)
        return
    batch_stored(worker.tracing, done, "complete_attempts", stored_from)
    worker._claimed_ahead.extend(ahead)
    for attempt, result in zip(done, results, strict=True):
        delivery = attempt.delivery
        if isinstance(result, TaskCompletionResult):
            worker._report(delivery, "completed")
        elif result is None:
            worker._report(delivery, "discarded")
        elif isinstance(result, OutputPublicationError):
            worker._ack(delivery, "discarded")  # the task failed with the store's text
        elif isinstance(result, BudgetExhaustedError):
            worker._fail(delivery, result)  # the completion wrote nothing
        else:
            assert isinstance(result, DagwerkError)
            _LOG.error("completion of %s refused: %s", delivery.task_id, result)
            worker.queue.nack(delivery.delivery_id, worker.worker_id, delay=worker.poll_interval)
            worker._report(delivery, "error", f"{type(result).__name__}: {result}")
