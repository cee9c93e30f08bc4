"""Settlement: what the worker does with a delivery once it knows the outcome.

A :class:`Settler` is the one place that acknowledges, fails, retries,
times out, parks (wait) and cancels, for both delivery paths (one by one
and batched). Every transition is fenced by the attempt ID in the store, so
a late or cancelled attempt changes nothing (WK-14), and nothing is
acknowledged before its transition commits; a settlement whose commit
failed with a transient store fault is held by the worker's fault gate
(:mod:`dagwerk.runtime.faults`) and committed once the store answers
again, with its delivery still leased. It records what it did as a
:class:`~dagwerk.runtime.observer.DeliveryReport` in the ``reports`` it is
given (a bounded deque: the worker's latest) and tells the observers.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Sequence

from dagwerk.budgets import BudgetExhaustedError
from dagwerk.models import EmittedOutput
from dagwerk.orchestrator import (
    OrchestratorCallbacks,
    complete_attempt,
    on_task_crashed,
    on_task_failed,
    settle_crashed_task,
)
from dagwerk.runtime.attempts import Attempt
from dagwerk.runtime.budget_guard import BudgetGuard
from dagwerk.runtime.children import ChildRuns
from dagwerk.runtime.clock import Clock
from dagwerk.runtime.errors import NonRetryableError, TaskTimedOut
from dagwerk.runtime.faults import FaultGate, FaultKind, classify, log_failure
from dagwerk.runtime.observer import DeliveryReport, WorkerObserver, notify
from dagwerk.runtime.outcomes import ExecutionOutcome, OutcomeKind
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.roles import WorkerStore
from dagwerk.runtime.task_logs import TaskLogWriter
from dagwerk.runtime.traced import attempts_settled, attempts_settling
from dagwerk.store import DagQueueStore, DelayedRetryStore, LeasedDelivery
from dagwerk.tracing import WorkerTracing
from dagwerk.waiting import wait_task

__all__ = ["STOPPING", "Settler", "describe_error"]

_LOG = logging.getLogger("dagwerk.runtime.worker")

STOPPING = "worker stopping"
"""The abort reason of an attempt the worker's stop aborted."""


class Settler:
    """Settles the deliveries of one worker (``worker_id``) in ``store``.

    ``retry_store`` (``None``: a failure is final, as in the seed) reserves
    retries; ``budget`` checks the output byte limit, ``children`` commits
    waits for child runs. ``poll_interval`` delays a delivery that failed in
    the worker before it is offered again.
    """

    def __init__(
        self,
        store: WorkerStore,
        queue: DagQueueStore,
        *,
        worker_id: str,
        callbacks: OrchestratorCallbacks,
        clock: Clock,
        rng: random.Random,
        retry_store: DelayedRetryStore | None,
        budget: BudgetGuard,
        children: ChildRuns,
        observers: Sequence[WorkerObserver],
        reports: deque[DeliveryReport],
        poll_interval: float,
        task_logs: TaskLogWriter,
        tracing: WorkerTracing | None,
        faults: FaultGate,
    ) -> None:
        self._store = store
        self.faults = faults
        self._task_logs = task_logs
        self._tracing = tracing
        self._queue = queue
        self._worker_id = worker_id
        self.callbacks = callbacks
        self._clock = clock
        self._rng = rng
        self._retry_store = retry_store
        self._budget = budget
        self._children = children
        self._observers = observers
        self._poll_interval = poll_interval
        self.reports = reports

    # --- the replies ------------------------------------------------------------------

    def report(self, delivery: LeasedDelivery, action: str, detail: str = "") -> None:
        """Record ``action`` for ``delivery`` and tell the observers."""
        report = DeliveryReport(delivery.delivery_id, delivery.task_id, action, detail)
        self.reports.append(report)
        notify(self._observers, "delivery_handled", report, delivery)

    def ack(self, delivery: LeasedDelivery, action: str, detail: str = "") -> None:
        """Acknowledge the delivery and report ``action``."""
        self._queue.ack(delivery.delivery_id, self._worker_id)
        self.report(delivery, action, detail)

    def release(self, delivery: LeasedDelivery) -> None:
        """Give the delivery back unsettled (the worker stops): its redelivery
        recovers the task under a new attempt."""
        self._queue.nack(delivery.delivery_id, self._worker_id)
        self.report(delivery, "released", STOPPING)

    def give_back(self, delivery: LeasedDelivery, action: str, error: BaseException) -> None:
        """Offer the delivery again after ``poll_interval`` and report
        ``action`` with ``error``: it failed in the worker, not in its plugin."""
        self._queue.nack(delivery.delivery_id, self._worker_id, delay=self._poll_interval)
        self.report(delivery, action, f"{type(error).__name__}: {error}")

    def fail(self, delivery: LeasedDelivery, error: BaseException) -> None:
        """Fail the task with ``error`` (its run's failure policy follows), then ack."""
        on_task_failed(
            self._store,
            task_id=delivery.task_id,
            expected_attempt_id=delivery.attempt_id,
            error_message=describe_error(error),
            callbacks=self.callbacks,
        )
        self.ack(delivery, "failed", describe_error(error))

    def crash_unreadable(self, delivery: LeasedDelivery, exc: BaseException) -> None:
        """The run became unreadable after the claim: the attempt is closed as
        CRASHED rather than stranded RUNNING (WK-15)."""
        log_failure(self.faults, _LOG, exc, f"reading run {delivery.run_id} after the claim")
        reason = f"run unreadable after claim: {type(exc).__name__}: {exc}"
        try:
            on_task_crashed(
                self._store,
                task_id=delivery.task_id,
                expected_attempt_id=delivery.attempt_id,
                error_message=reason,
                callbacks=self.callbacks,
            )
        except Exception:
            # Still unreadable: leave the lease to expire; the redelivery recovers.
            self.report(delivery, "unreadable", reason)
            return
        self.ack(delivery, "crashed", reason)

    def settle_dead_lettered(self) -> None:
        """Apply the failure policy to tasks this process's dequeue crashed by
        dead-lettering (the crash committed with the dead letter)."""
        for ref in self._queue.take_dead_lettered():
            try:
                settle_crashed_task(self._store, ref.task_id, callbacks=self.callbacks)
            except Exception:
                _LOG.exception("settling dead-lettered task %s failed", ref.task_id)
            report = DeliveryReport("", ref.task_id, "dead_lettered", "max_deliveries")
            self.reports.append(report)
            notify(self._observers, "delivery_handled", report, None)

    def check_output(self, delivery: LeasedDelivery, outputs: Sequence[EmittedOutput]) -> bool:
        """The worker's output byte limit; False when it failed the task."""
        return self._budget.check_output(self, delivery, outputs)

    # --- an attempt's outcome ---------------------------------------------------------

    def settle_safely(self, attempt: Attempt, outcome: ExecutionOutcome) -> None:
        """:meth:`settle`; a transient store fault holds the settlement (see
        :meth:`hold`), any other error in the worker gives the delivery back."""
        try:
            self.settle(attempt, outcome)
        except Exception as exc:
            self.hold(attempt, outcome, exc)

    def hold(self, attempt: Attempt, outcome: ExecutionOutcome, error: Exception) -> None:
        """Settling ``attempt`` failed with ``error``: a transient store fault
        keeps the settlement for the fault gate to commit once the store
        answers (the delivery stays leased; the attempt ID fences the late
        commit, so a task recovered meanwhile is settled by its new attempt
        only); any other error gives the delivery back."""
        delivery = attempt.delivery
        self.hold_or_give_back(
            delivery,
            error,
            f"settling task {delivery.task_id}",
            lambda: self.settle(attempt, outcome),
        )

    def hold_or_give_back(
        self,
        delivery: LeasedDelivery,
        error: Exception,
        what: str,
        retry: Callable[[], None] | None = None,
    ) -> None:
        """``what`` failed with ``error`` in the worker. A transient store
        fault holds ``retry`` (default: giving the delivery back) for the
        fault gate; a fatal one leaves the delivery leased (the worker
        stops; the lease expires); any other error gives the delivery back."""

        def gave_up(exc: Exception) -> None:
            _LOG.error("delivery %s failed in the worker", delivery.delivery_id, exc_info=exc)
            self.give_back(delivery, "error", exc)

        if classify(error) is FaultKind.FATAL:
            self.faults.note(error, what)
            return
        if retry is None:
            retry = lambda: self.give_back(delivery, "error", error)  # noqa: E731
        if not self.faults.hold(error, what, retry, gave_up):
            gave_up(error)

    def settle(self, attempt: Attempt, outcome: ExecutionOutcome) -> None:
        """Commit what ``outcome`` means for ``attempt``: complete, wait,
        cancel, retry, time out or fail; then ack (or release) its delivery.
        The attempt's log lines are stored first."""
        self._task_logs.flush()
        attempts_settling(self._tracing, [attempt], [outcome])
        try:
            self._settle(attempt, outcome)
        finally:
            attempts_settled(self._tracing, [attempt])

    def _settle(self, attempt: Attempt, outcome: ExecutionOutcome) -> None:
        delivery = attempt.delivery
        if outcome.kind is OutcomeKind.OK:
            self._complete(delivery, outcome)
        elif outcome.kind is OutcomeKind.WAIT:
            self._wait(attempt, outcome)
        elif outcome.kind is OutcomeKind.CANCELLED:
            reason = attempt.entry.signal.reason
            if reason == STOPPING:
                # Nothing is settled: the delivery goes back, and its redelivery
                # recovers the task under a new attempt.
                self.release(delivery)
            else:
                self.ack(delivery, "cancelled", reason or "")
        else:
            self._failed(delivery, outcome, attempt.task.attempt_number, attempt.policy)

    def _complete(self, delivery: LeasedDelivery, outcome: ExecutionOutcome) -> None:
        if not self.check_output(delivery, outcome.outputs):
            return
        try:
            # The store's completion record says whether this attempt won
            # (an exact repeat returns the first record), so no read follows.
            won = complete_attempt(
                self._store,
                task_id=delivery.task_id,
                expected_attempt_id=delivery.attempt_id,
                outputs=outcome.outputs,
                callbacks=self.callbacks,
            )
        except BudgetExhaustedError as exc:
            # The completion wrote nothing; the task fails without retry.
            self.fail(delivery, exc)
            return
        self.ack(delivery, "completed" if won is not None else "discarded")

    def _wait(self, attempt: Attempt, outcome: ExecutionOutcome) -> None:
        delivery, wait_id = attempt.delivery, outcome.wait_id
        assert wait_id is not None
        ctx = attempt.ctx
        if ctx is not None and self._children.settle_wait(self, delivery, ctx, wait_id):
            return
        waited = wait_task(
            self._store,
            delivery.task_id,
            wait_id,
            expected_attempt_id=delivery.attempt_id,
            expected_generation=delivery.generation,
        )
        self.ack(delivery, "waited" if waited else "stale", wait_id)

    def _failed(
        self,
        delivery: LeasedDelivery,
        outcome: ExecutionOutcome,
        attempt: int,
        policy: RetryPolicy,
    ) -> None:
        error: BaseException
        if outcome.kind is OutcomeKind.TIMEOUT:
            error = TaskTimedOut(f"task timed out ({outcome.detail})")
        else:
            error = outcome.error or RuntimeError("Unknown error")
        if (
            outcome.retryable
            and self._retry_store is not None
            and policy.should_retry(error, attempt)
        ):
            self._reserve_retry(self._retry_store, delivery, error, attempt, policy)
        elif outcome.kind is OutcomeKind.TIMEOUT:
            # A timeout that cannot be retried is recorded as a crash (decisions.md).
            on_task_crashed(
                self._store,
                task_id=delivery.task_id,
                expected_attempt_id=delivery.attempt_id,
                error_message=describe_error(error),
                callbacks=self.callbacks,
            )
            self.ack(delivery, "timed_out", describe_error(error))
        else:
            self.fail(delivery, error)

    def _reserve_retry(
        self,
        store: DelayedRetryStore,
        delivery: LeasedDelivery,
        error: BaseException,
        attempt: int,
        policy: RetryPolicy,
    ) -> None:
        # One commit records the failure and reserves the next attempt with a
        # delayed delivery, so no finaliser can close the run in between (WK-13).
        delay = policy.next_delay(attempt, self._rng)
        new_attempt = store.try_fail_task_with_retry(
            delivery.task_id,
            describe_error(error),
            expected_attempt_id=delivery.attempt_id,
            available_at=self._clock.time() + delay,
        )
        if new_attempt is None:
            self.ack(delivery, "stale", "failure not accepted")
            return
        self.ack(delivery, "retried", f"attempt {attempt} failed; retry in {delay:.3f}s")


def describe_error(error: BaseException) -> str:
    """An error as a task's stored error text."""
    if isinstance(error, NonRetryableError | TaskTimedOut):
        return str(error)
    return f"{type(error).__name__}: {error}"
