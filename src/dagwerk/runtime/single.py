"""The worker's one-by-one delivery path (WK-15).

Per delivery: read the run (not RUNNING: nothing runs) → claim the attempt
→ register it with the attempt monitor (its abort signal now fires on
cancellation and on the worker's stop) → read the run again (an unreadable
run crashes the attempt) → prepare (inputs, guards) → execute with the
deadline → settle → acknowledge.

A delivery whose task is still RUNNING under the same attempt was
redelivered because its previous holder lost the lease: the new holder
recovers the task (a new attempt; the old attempt's late settle is stale)
and the store carries the lost-delivery count forward, so a task that keeps
killing its worker reaches the dead-letter queue after ``max_deliveries``.

The batched path (:mod:`dagwerk.runtime.batch`) hands this path the
deliveries whose batched claim was refused, and runs its attempts' plugins
through :meth:`OneByOne.run`.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.execution import claim_task, recover_task
from dagwerk.runtime.attempts import Attempt
from dagwerk.runtime.clock import Clock
from dagwerk.runtime.executors import ExecutionOutcome, Executor
from dagwerk.runtime.faults import log_failure
from dagwerk.runtime.monitor import AttemptMonitor
from dagwerk.runtime.preparation import AttemptPreparer
from dagwerk.runtime.roles import WorkerStore
from dagwerk.runtime.settlement import Settler
from dagwerk.runtime.status import RunStatusReader
from dagwerk.store import LeasedDelivery

__all__ = ["OneByOne", "run_attempt"]

_LOG = logging.getLogger("dagwerk.runtime.worker")


def run_attempt(
    attempt: Attempt, preparer: AttemptPreparer, executor: Executor, clock: Clock
) -> ExecutionOutcome:
    """Run the attempt's plugin with its deadline and abort signal; the
    attempt is marked finished however the call ends."""
    entry = attempt.entry
    try:
        ctx = preparer.start(attempt)
        return executor.execute(
            attempt.spec.fn,
            attempt.inputs,
            ctx,
            timeout=attempt.timeout,
            signal=entry.signal,
            clock=clock,
        )
    finally:
        entry.finish()


class OneByOne:
    """Handles deliveries one at a time (several in parallel on ``pool``)."""

    def __init__(
        self,
        store: WorkerStore,
        *,
        status: RunStatusReader,
        settler: Settler,
        preparer: AttemptPreparer,
        monitor: AttemptMonitor,
        executor: Executor,
        clock: Clock,
        pool: ThreadPoolExecutor,
    ) -> None:
        self._store = store
        self._status = status
        self._settler = settler
        self._preparer = preparer
        self._monitor = monitor
        self._executor = executor
        self._clock = clock
        self._pool = pool

    def serve(self, batch: list[LeasedDelivery]) -> None:
        """Handle every delivery of a leased batch (in parallel when several)."""
        if len(batch) == 1:
            self.handle(batch[0])
            return
        for future in [self._pool.submit(self.handle, d) for d in batch]:
            future.result()

    def handle(self, delivery: LeasedDelivery) -> None:
        """Claim, run and settle one leased delivery; an error in the worker
        gives the delivery back instead of stopping the loop."""
        try:
            self._handle(delivery)
        except Exception as exc:  # one bad delivery never stops the loop
            self._settler.hold_or_give_back(delivery, exc, f"handling task {delivery.task_id}")

    def run(self, attempt: Attempt) -> ExecutionOutcome:
        """Run a registered attempt's plugin (see :func:`run_attempt`)."""
        return run_attempt(attempt, self._preparer, self._executor, self._clock)

    def _handle(self, delivery: LeasedDelivery) -> None:
        settler = self._settler
        # First run check: a cancelled or finished run admits nothing.
        try:
            status = self._status.read(delivery.run_id)
        except Exception as exc:
            # Unreadable before the claim: nothing ran, so the delivery goes
            # back (acking it would strand the QUEUED task).
            log_failure(settler.faults, _LOG, exc, f"reading run {delivery.run_id}")
            settler.give_back(delivery, "unreadable", exc)
            return
        if status is not RunStatus.RUNNING:
            settler.ack(delivery, "closed", f"run is {status}")
            return
        claimed = claim_task(
            self._store,
            delivery.task_id,
            expected_attempt_id=delivery.attempt_id,
            expected_generation=delivery.generation,
        )
        if claimed is None:
            self._unclaimable(delivery)
            return
        self._execute(delivery)

    def _unclaimable(self, delivery: LeasedDelivery) -> None:
        settler = self._settler
        task = self._store.get_task(delivery.task_id)
        if task is None or task.attempt_id != delivery.attempt_id or task.invalidated:
            settler.ack(delivery, "stale")
            return
        if task.status == TaskStatus.RUNNING:
            # Redelivered while RUNNING: the previous lease holder died or lost
            # its lease, and this delivery now holds it (WK-05). The task is
            # recovered under a new attempt, so a late settle of the old one is
            # stale; the store carries the lost-delivery count forward.
            recovered = recover_task(
                self._store,
                task.task_id,
                expected_attempt_id=task.attempt_id,
                expected_generation=task.generation,
            )
            detail = recovered.recovered_attempt_id if recovered is not None else "refused"
            settler.ack(delivery, "recovered", detail)
            return
        settler.ack(delivery, "not_claimable", task.status.value)

    def _execute(self, delivery: LeasedDelivery) -> None:
        attempt = self._preparer.prepare(delivery, self._store.get_task(delivery.task_id))
        if attempt is None:
            return
        # Registered before the final read, so a cancellation that commits
        # after the read still aborts the attempt (WK-15).
        self._monitor.add(attempt)
        try:
            try:
                status = self._status.read(delivery.run_id)
            except Exception as exc:
                self._settler.crash_unreadable(delivery, exc)
                return
            if status is not RunStatus.RUNNING:
                self._settler.ack(delivery, "cancelled", f"run is {status}")
                return
            self._settler.settle_safely(attempt, self.run(attempt))
        finally:
            self._monitor.remove(attempt)
