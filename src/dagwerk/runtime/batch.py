"""The worker's batched path over a :class:`~dagwerk.store.BatchQueueStore`.

Per batch, instead of about ten transactions per delivery:

1. one ``claim_deliveries`` of up to ``concurrency`` rows: the leases and
   the claims (on SQLite one commit); when it came back full, a second one
   claims ahead the rows of plugins the worker can start within the claim
   ahead's horizon (:mod:`dagwerk.runtime.claim_ahead`; thread executor
   only). Rows whose claim was refused take the one-by-one path;
2. the reads every attempt would repeat, once per run (:class:`BatchReads`):
   lineage link, budget, and the outputs of all its attempts' plans;
3. every attempt's abort signal is registered, then each run's status is
   read once: a cancellation that committed after the claim still stops the
   attempt before its plugin starts (WK-15);
4. the plugins run in parallel (up to ``concurrency`` at once), each
   plugin call timed for the claim ahead;
5. one ``complete_and_ack`` for every attempt that returned outputs, from
   whichever runner thread it returned on (a group commit), then one
   reconcile per run whose launch completed (:func:`complete_attempts`);
   failures, timeouts, waits and cancellations settle one by one. Results
   that returned while others still run settle as such a group once they
   waited ``FLUSH_SECONDS`` (thread executor; ``runtime/_batch_exec.py``),
   the rest when the batch ends.
   Where that is one unit of work (SQLite), the unit also claims the next
   batch (step 1 of the next round), so it sees the launches just made
   without a transaction of its own; a stopping worker gives such claims
   back (nack) as it does for the attempts it aborts.

The lease taken by the claim already runs to the ownership bound
(``lease_seconds + lease_grace``, WK-03); only a task whose timeout is
longer extends it. Nothing is acknowledged before its transition commits.
Settlement goes through the worker's :class:`~dagwerk.runtime.settlement.Settler`,
preparation through its :class:`~dagwerk.runtime.preparation.AttemptPreparer`,
as on the one-by-one path (:mod:`dagwerk.runtime.single`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from dagwerk.budgets import BudgetExhaustedError
from dagwerk.capabilities import StoreCapabilities
from dagwerk.completions import complete_attempts
from dagwerk.constants import RunStatus
from dagwerk.errors import DagwerkError
from dagwerk.lineage import RunLink
from dagwerk.orchestrator import OrchestratorCallbacks
from dagwerk.runtime._inline import InlineRunner
from dagwerk.runtime.actor import AdvancementActor, LoopHandedOver
from dagwerk.runtime.attempts import Attempt, BatchReads
from dagwerk.runtime.claim_ahead import ClaimAheadPolicy
from dagwerk.runtime.clock import Clock
from dagwerk.runtime.executors import (
    AttemptJob,
    ExecutionOutcome,
    Executor,
    OutcomeKind,
    ThreadExecutor,
)
from dagwerk.runtime.monitor import AttemptMonitor
from dagwerk.runtime.preparation import AttemptPreparer
from dagwerk.runtime.roles import WorkerStore
from dagwerk.runtime.settings import WorkerSettings
from dagwerk.runtime.settlement import Settler
from dagwerk.runtime.single import OneByOne
from dagwerk.runtime.status import RunStatusReader
from dagwerk.runtime.task_logs import TaskLogWriter
from dagwerk.runtime.traced import attempts_settled, attempts_settling, batch_stored, now_ns
from dagwerk.store import (
    BatchQueueStore,
    ClaimedDelivery,
    CompletionRequest,
    OutputPublicationError,
    TaskCompletionResult,
    TaskRecord,
)
from dagwerk.tracing import WorkerTracing

__all__ = ["BatchPath"]

_LOG = logging.getLogger("dagwerk.runtime.worker")


class BatchPath:
    """The batched delivery path of one worker over ``batch_store``.

    ``served`` names the plugins the worker leases rows of; ``stopping`` is
    set once the worker's stop began; ``step_finished`` is called when a
    step handed over to another loop thread ends there.
    """

    def __init__(
        self,
        store: WorkerStore,
        batch_store: BatchQueueStore,
        capabilities: StoreCapabilities,
        settings: WorkerSettings,
        *,
        worker_id: str,
        served: Callable[[], frozenset[str]],
        callbacks: OrchestratorCallbacks,
        clock: Clock,
        status: RunStatusReader,
        settler: Settler,
        preparer: AttemptPreparer,
        monitor: AttemptMonitor,
        single: OneByOne,
        executor: Executor,
        inline: InlineRunner,
        actor: AdvancementActor,
        pool: ThreadPoolExecutor,
        links: dict[str, RunLink | None],
        stopping: threading.Event,
        step_finished: Callable[[], None],
        task_logs: TaskLogWriter,
        tracing: WorkerTracing | None,
    ) -> None:
        self._store = store
        self._task_logs = task_logs
        self._tracing = tracing
        self._batch_store = batch_store
        self._claim_ahead = capabilities.claim_ahead
        self._child_store = capabilities.children
        self._budget_store = capabilities.budgets
        self._recent_outputs = capabilities.recent_outputs
        self._settings = settings
        self._worker_id = worker_id
        self._served = served
        self.callbacks = callbacks
        self._clock = clock
        self._status = status
        self._settler = settler
        self._preparer = preparer
        self._monitor = monitor
        self._single = single
        self._executor = executor
        self._inline = inline
        self._actor = actor
        self._pool = pool
        self._links = links
        self._stopping = stopping
        self._step_finished = step_finished
        # Deliveries the last batch's completions claimed for the next batch.
        self.claimed_ahead: list[ClaimedDelivery] = []
        # Claims beyond the concurrency: only where the batch's runners are
        # bounded by it (the built-in thread executor) and attempts are timed.
        self.ahead = ClaimAheadPolicy(
            concurrency=settings.concurrency,
            limit=settings.claim_ahead if type(executor) is ThreadExecutor else 0,
            horizon=settings.claim_ahead_horizon,
        )

    def process(self, wait_seconds: float) -> int | None:
        """Claim and run one batch; the number of rows leased, or ``None`` when
        nothing was leased (the caller then sweeps). The batch is the one the
        previous batch's completions claimed ahead, if any."""
        claims = self._take_claimed_ahead() or self._claim(wait_seconds)
        self._settler.settle_dead_lettered()
        if not claims:
            return None
        claimed = [c for c in claims if c.task is not None]
        for refused in (c for c in claims if c.task is None):
            # Run not RUNNING, a stale attempt, or a redelivery of a RUNNING task
            # whose holder died: the one-by-one path decides (and recovers).
            self._single.handle(refused.delivery)
        if claimed:
            self._run_claimed(claimed)
        return len(claims)

    def release_claimed_ahead(self) -> None:
        """Give back what was claimed for a batch that will not run: as for an
        attempt the stop aborted, the delivery goes back and its redelivery
        recovers the task under a new attempt."""
        claims = self._take_claimed_ahead()
        for n, claim in enumerate(claims):
            delivery = claim.delivery
            try:
                self._settler.release(delivery)
            except Exception as exc:
                left = len(claims) - n
                if self._settler.faults.note(exc, f"giving back {left} deliveries claimed ahead"):
                    # The store is at fault: the rest come back when their
                    # leases end, as a stopped worker's do.
                    return
                _LOG.exception("releasing delivery %s failed", delivery.delivery_id)

    def _take_claimed_ahead(self) -> list[ClaimedDelivery]:
        taken, self.claimed_ahead = self.claimed_ahead, []
        return taken

    def _claim(self, wait_seconds: float) -> list[ClaimedDelivery]:
        settings = self._settings
        served = self._served()
        claims = self._batch_store.claim_deliveries(
            self._worker_id,
            limit=settings.concurrency,
            lease_seconds=settings.lease_bound(None),
            queues=settings.queues,
            wait_seconds=wait_seconds,
            plugins=served,
            prefer_run=settings.prefer_run,
        )
        if len(claims) < settings.concurrency or self._stopping.is_set():
            return claims  # the queue is drained (or the worker stops): nothing ahead
        announcer = self._claim_ahead
        if announcer is not None and announcer.handed_over_all_available():
            # The claim handed over what the completions' launches claimed,
            # and they saw nothing else available: no queue read finds more.
            return claims
        count, plugins = self.ahead.plan(served)
        if count:
            claims.extend(
                self._batch_store.claim_deliveries(
                    self._worker_id,
                    limit=count,
                    lease_seconds=settings.lease_bound(None),
                    queues=settings.queues,
                    plugins=plugins,
                    prefer_run=settings.prefer_run,
                )
            )
        return claims

    def _run_claimed(self, claimed: list[ClaimedDelivery]) -> None:
        plans: dict[str, list[TaskRecord]] = defaultdict(list)
        for claim in claimed:
            assert claim.task is not None
            plans[claim.delivery.run_id].append(claim.task)
        reads = BatchReads(
            self._store,
            plans,
            child_store=self._child_store,
            budget_store=self._budget_store,
            recent_outputs=self._recent_outputs,
            links=self._links,
        )
        leased_bound = self._settings.lease_bound(None)
        attempts: list[Attempt] = []
        for claim in claimed:
            try:
                attempt = self._preparer.prepare(
                    claim.delivery, claim.task, reads=reads, leased_bound=leased_bound
                )
            except Exception as exc:  # one bad delivery never stops the batch
                self._failed_in_worker(claim, exc)
                continue
            if attempt is not None:
                attempt.alone = claim.alone
                attempts.append(attempt)
        for attempt in attempts:
            self._monitor.add(attempt)
        flushed: set[int] = set()  # id() of the attempts settled early
        try:
            runnable = self._still_running(attempts)
            if self._inlinable(runnable):
                outcomes = [self._execute_inline(runnable[0], attempts)]
            else:
                outcomes = self._execute_all(runnable, flushed)
        except LoopHandedOver:
            raise  # the rest of this batch was finished by the thread it went to
        except BaseException:
            self._forget(attempts)
            raise
        if flushed:
            rest = [(a, o) for a, o in zip(runnable, outcomes, strict=True) if id(a) not in flushed]
            runnable, outcomes = [a for a, _ in rest], [o for _, o in rest]
            attempts = [a for a in attempts if id(a) not in flushed]
        self._finish(runnable, outcomes, attempts)

    def _finish(
        self,
        runnable: list[Attempt],
        outcomes: list[ExecutionOutcome | Exception],
        attempts: list[Attempt],
        *,
        claim_next: bool = True,
    ) -> None:
        self._task_logs.flush()  # the attempts' lines are stored before they settle
        attempts_settling(self._tracing, runnable, outcomes)
        try:
            self._settle_all(runnable, outcomes, claim_next=claim_next)
        finally:
            attempts_settled(self._tracing, runnable)
            self._forget(attempts)

    def _forget(self, attempts: list[Attempt]) -> None:
        for attempt in attempts:
            self._monitor.remove(attempt)

    def _inlinable(self, runnable: list[Attempt]) -> bool:
        """A lone attempt of the built-in thread executor, in the actor's loop:
        its plugin runs on the loop thread itself (``runtime/_inline.py``)."""
        return (
            len(runnable) == 1
            and type(self._executor) is ThreadExecutor
            and self._actor.in_loop_thread()
        )

    def _execute_inline(
        self, attempt: Attempt, attempts: list[Attempt]
    ) -> ExecutionOutcome | Exception:
        try:
            ctx = self._preparer.start(attempt)
        except Exception as exc:  # e.g. a failing secret resolver
            return exc
        entry = attempt.entry
        job = AttemptJob(attempt.spec.fn, attempt.inputs, ctx, attempt.timeout, entry.signal)

        def finish_elsewhere(outcome: ExecutionOutcome) -> None:
            # Settled (timeout, abort) while the plugin still runs on this
            # thread: the batch and the loop go on in another one.
            def rest() -> bool:
                entry.finish()
                self._finish([attempt], [outcome], attempts)
                self._step_finished()
                return True

            self._actor.hand_over(rest)

        started = time.monotonic()
        try:
            outcome = self._inline.run(job, finish_elsewhere)
        finally:
            entry.finish()
        self.ahead.observe(attempt.node.plugin, time.monotonic() - started)
        return outcome

    def _failed_in_worker(self, claim: ClaimedDelivery, exc: Exception) -> None:
        delivery = claim.delivery
        self._settler.hold_or_give_back(delivery, exc, f"preparing task {delivery.task_id}")

    def _still_running(self, attempts: list[Attempt]) -> list[Attempt]:
        """Read each run's status once, after every signal is registered."""
        statuses: dict[str, RunStatus | Exception | None] = {}
        runnable: list[Attempt] = []
        for attempt in attempts:
            delivery = attempt.delivery
            if delivery.run_id not in statuses:
                try:
                    statuses[delivery.run_id] = self._status.read(delivery.run_id)
                except Exception as exc:
                    statuses[delivery.run_id] = exc
            status = statuses[delivery.run_id]
            if isinstance(status, Exception):
                self._settler.crash_unreadable(delivery, status)
            elif status is not RunStatus.RUNNING:
                self._settler.ack(delivery, "cancelled", f"run is {status}")
            else:
                runnable.append(attempt)
        return runnable

    def _execute_all(
        self, attempts: list[Attempt], flushed: set[int]
    ) -> list[ExecutionOutcome | Exception]:
        """Every attempt's outcome; the thread executor's settle early (their
        ``id()`` in ``flushed``) when they return while others still run."""
        executor = self._executor
        if type(executor) is ThreadExecutor and attempts:
            return self._execute_threaded(executor, attempts, flushed)

        def run(attempt: Attempt) -> ExecutionOutcome | Exception:
            try:
                return self._single.run(attempt)
            except Exception as exc:
                return exc

        if len(attempts) <= 1:
            return [run(attempt) for attempt in attempts]
        futures = [self._pool.submit(run, attempt) for attempt in attempts[1:]]
        # The loop thread runs one attempt itself rather than idle.
        first = run(attempts[0])
        return [first, *(future.result() for future in futures)]

    def _execute_threaded(
        self, executor: ThreadExecutor, attempts: list[Attempt], flushed: set[int]
    ) -> list[ExecutionOutcome | Exception]:
        """The built-in thread executor runs the whole batch: one plugin thread
        per attempt, supervised by the loop thread (no thread per attempt waits).
        Results that returned while others still run are settled from the
        supervisor in a group commit of their own (:meth:`_flush_returned`),
        without claiming the next batch."""
        results: list[ExecutionOutcome | Exception | None] = []
        jobs: list[AttemptJob] = []
        started: list[Attempt] = []
        for attempt in attempts:
            try:
                ctx = self._preparer.start(attempt)
            except Exception as exc:  # e.g. a failing secret resolver: this attempt only
                results.append(exc)
                continue
            results.append(None)
            started.append(attempt)
            jobs.append(
                AttemptJob(
                    attempt.spec.fn, attempt.inputs, ctx, attempt.timeout, attempt.entry.signal
                )
            )
        durations: list[float | None] = [None] * len(jobs)

        def observe(index: int, seconds: float) -> None:
            durations[index] = seconds

        def flush(returned: list[tuple[int, ExecutionOutcome]]) -> None:
            self._flush_returned([(started[i], outcome) for i, outcome in returned], flushed)

        try:
            outcomes = iter(
                executor.execute_many(
                    jobs,
                    clock=self._clock,
                    parallelism=self._settings.concurrency,
                    observe=observe,
                    flush=flush,
                )
            )
        finally:
            for attempt in attempts:
                attempt.entry.finish()
        for attempt, seconds in zip(started, durations, strict=True):
            if seconds is not None:
                self.ahead.observe(attempt.node.plugin, seconds)
        return [next(outcomes) if result is None else result for result in results]

    def _flush_returned(
        self, returned: list[tuple[Attempt, ExecutionOutcome]], flushed: set[int]
    ) -> None:
        """Settle the attempts whose plugins returned while others of their
        batch still run, without waiting for those (the next batch is claimed
        with the batch's last completions only)."""
        attempts: list[Attempt] = []
        outcomes: list[ExecutionOutcome | Exception] = []
        for attempt, outcome in returned:
            attempt.entry.finish()
            attempts.append(attempt)
            outcomes.append(outcome)
            flushed.add(id(attempt))
        try:
            self._finish(attempts, outcomes, attempts, claim_next=False)
        except Exception:  # the batch's other attempts are still supervised
            _LOG.exception("settling %d early results of a batch failed", len(attempts))

    def _settle_all(
        self,
        attempts: list[Attempt],
        outcomes: list[ExecutionOutcome | Exception],
        *,
        claim_next: bool = True,
    ) -> None:
        settler = self._settler
        done: list[Attempt] = []
        for attempt, outcome in zip(attempts, outcomes, strict=True):
            delivery = attempt.delivery
            if isinstance(outcome, Exception):
                _LOG.error(
                    "delivery %s failed in the worker", delivery.delivery_id, exc_info=outcome
                )
                settler.give_back(delivery, "error", outcome)
            elif outcome.kind is OutcomeKind.OK:
                if settler.check_output(delivery, outcome.outputs):
                    done.append(attempt)
            else:
                settler.settle_safely(attempt, outcome)
        if done:
            self._complete_all(
                done,
                {id(a): o for a, o in zip(attempts, outcomes, strict=True)},
                claim_next=claim_next,
            )

    def _complete_all(
        self,
        done: list[Attempt],
        outcomes: dict[int, ExecutionOutcome | Exception],
        *,
        claim_next: bool = True,
    ) -> None:
        settler = self._settler
        settings = self._settings
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
                    ends_launch=attempt.alone,
                )
            )
        # Where the completions commit in one unit of work, the next batch is
        # claimed in it too: it sees the launches just made, and the worker saves
        # a transaction per batch. The claims count only once the unit commits.
        ahead: list[ClaimedDelivery] = []
        announcer = self._claim_ahead
        expected: list[bool] = []

        def expect() -> None:
            # The unit's launches may then insert the tasks this claim would
            # take first as already claimed (SQLite; see sql/_ahead.py).
            if claim_next and announcer is not None and not self._stopping.is_set():
                expected.append(
                    announcer.expect_claim(
                        self._worker_id,
                        limit=settings.concurrency,
                        lease_seconds=settings.lease_bound(None),
                        queues=settings.queues,
                        plugins=self._served(),
                    )
                )

        def claim_ahead() -> None:
            # Once announced, the claim is made even by a stopping worker: it
            # hands over what the launches claimed, which the stop gives back.
            if any(expected) or (claim_next and not self._stopping.is_set()):
                ahead.extend(self._claim(0.0))

        stored_from = now_ns()
        try:
            results = complete_attempts(
                self._store,
                self._worker_id,
                requests,
                callbacks=self.callbacks,
                before=expect,
                then=claim_ahead,
            )
        except Exception as exc:
            # Nothing of the batch committed (or it did and the reconcile failed,
            # which the completions' exact repeats redo): settle one by one, or,
            # while the store is at fault, once it answers again.
            if settler.faults.note(exc, f"committing {len(done)} completions"):
                for attempt in done:
                    outcome = outcomes[id(attempt)]
                    assert isinstance(outcome, ExecutionOutcome)
                    settler.hold(attempt, outcome, exc)
                return
            _LOG.exception("a batch of %d completions failed; settling one by one", len(done))
            for attempt in done:
                outcome = outcomes[id(attempt)]
                assert isinstance(outcome, ExecutionOutcome)
                settler.settle_safely(attempt, outcome)
            return
        batch_stored(self._tracing, done, "complete_attempts", stored_from)
        self.claimed_ahead.extend(ahead)
        for attempt, result in zip(done, results, strict=True):
            delivery = attempt.delivery
            if isinstance(result, TaskCompletionResult):
                settler.report(delivery, "completed")
            elif result is None:
                settler.report(delivery, "discarded")
            elif isinstance(result, OutputPublicationError):
                settler.ack(delivery, "discarded")  # the task failed with the store's text
            elif isinstance(result, BudgetExhaustedError):
                settler.fail(delivery, result)  # the completion wrote nothing
            else:
                assert isinstance(result, DagwerkError)
                _LOG.error("completion of %s refused: %s", delivery.task_id, result)
                settler.give_back(delivery, "error", result)
