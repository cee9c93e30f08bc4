"""The durable-queue operations of the in-memory store (the reference for
:class:`~dagwerk.store.DagQueueStore`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from dagwerk.backends.requests import check_claim, check_string
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.store import (
    DeadLetter,
    Delivery,
    LeasedDelivery,
    TaskAttemptRef,
    TaskFailureResult,
    validate_plugin_names,
    validate_run_preference,
    validate_seconds,
    validate_worker_id,
)

from ._base import MemoryStoreBase
from ._state import QueueRow

MAX_DELIVERIES_REASON = "max_deliveries"
_REINJECTABLE = (TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.CRASHED)


@dataclass(frozen=True, slots=True)
class _RowFilter:
    """Which rows a dequeue may lease (``None``: any queue, any plugin) and
    whose run's rows it takes first."""

    queues: frozenset[str] | None
    plugins: frozenset[str] | None
    prefer_run: str | None

    def admits(self, row: QueueRow) -> bool:
        return (self.queues is None or row.queue in self.queues) and (
            self.plugins is None or row.plugin in self.plugins
        )


class QueueMixin(MemoryStoreBase):
    def dequeue(
        self,
        worker_id: str,
        *,
        limit: int,
        lease_seconds: float,
        queues: Sequence[str] | None = None,
        wait_seconds: float = 0.0,
        plugins: Collection[str] | None = None,
        prefer_run: str | None = None,
    ) -> list[LeasedDelivery]:
        lease, names, patience = check_claim(worker_id, limit, lease_seconds, queues, wait_seconds)
        served = validate_plugin_names(plugins)
        wanted = _RowFilter(
            None if names is None else frozenset(names),
            None if served is None else frozenset(served),
            validate_run_preference(prefer_run),
        )
        deadline = time.monotonic() + patience
        with self._lock:
            while True:
                leased = self._lease(worker_id, limit, lease, wanted)
                remaining = deadline - time.monotonic()
                if leased or remaining <= 0:
                    return leased
                # Woken by an enqueue or release; a delayed row becomes
                # available without a notification, so the wait is sliced.
                self._work.wait(min(remaining, 0.05))

    def take_dead_lettered(self) -> list[TaskAttemptRef]:
        with self._lock:
            taken, self._dead_lettered = self._dead_lettered, []
            return taken

    def _lease(
        self, worker_id: str, limit: int, lease: float, wanted: _RowFilter
    ) -> list[LeasedDelivery]:
        now = float(self._clock())
        prefer = wanted.prefer_run
        candidates = sorted(
            (
                (row.run_id != prefer, row.priority, row.available_at, row.seq, delivery_id)
                for delivery_id, row in self._queue.items()
                if row.available_at <= now and wanted.admits(row)
            ),
            key=lambda item: (item[0], -item[1], item[2], item[3]),
        )
        leased: list[LeasedDelivery] = []
        for *_, delivery_id in candidates:
            if len(leased) == limit:
                break
            row = self._queue[delivery_id]
            if row.delivery_count >= self.max_deliveries:
                self._bury(delivery_id, MAX_DELIVERIES_REASON, now, crash=True)
                continue
            offered_at = row.available_at
            row.lease_owner = worker_id
            row.lease_expires_at = row.available_at = now + lease
            row.delivery_count += 1
            delivery = self._deliveries[delivery_id]
            task = self._tasks.get(delivery.task_id)
            if (
                task is not None
                and task.attempt_id == delivery.attempt_id
                and task.status is TaskStatus.QUEUED
            ):
                # The worker that may claim it; a reclaiming lease keeps the
                # worker that lost the attempt.
                task.worker_id = worker_id
            leased.append(_leased(delivery, row, worker_id, offered_at))
        return leased

    def ack(self, delivery_id: str, worker_id: str) -> bool:
        validate_worker_id(worker_id)
        with self._lock:
            row = self._queue.get(delivery_id)
            if row is None or row.lease_owner != worker_id:
                return False
            return self._remove_row(delivery_id) is not None

    def nack(
        self,
        delivery_id: str,
        worker_id: str,
        *,
        delay: float = 0.0,
        poison: bool = False,
        reason: str = "",
    ) -> bool:
        validate_worker_id(worker_id)
        wait = validate_seconds(delay, "delay", positive=False)
        check_string(reason, "reason")
        with self._lock:
            row = self._queue.get(delivery_id)
            if row is None or row.lease_owner != worker_id:
                return False
            now = float(self._clock())
            if poison:
                self._bury(delivery_id, reason or "poison", now)
                return True
            row.lease_owner = None
            row.lease_expires_at = None
            row.available_at = now + wait
            self._work.notify_all()
            return True

    def extend_lease(self, delivery_id: str, worker_id: str, lease_seconds: float) -> bool:
        validate_worker_id(worker_id)
        lease = validate_seconds(lease_seconds, "lease_seconds", positive=True)
        with self._lock:
            row = self._queue.get(delivery_id)
            now = float(self._clock())
            if (
                row is None
                or row.lease_owner != worker_id
                or row.lease_expires_at is None
                or row.lease_expires_at <= now
            ):
                return False
            row.lease_expires_at = row.available_at = now + lease
            return True

    def list_dead_letters(self, run_id: str | None = None) -> list[DeadLetter]:
        with self._lock:
            return [
                letter
                for letter in self._dead_letters.values()
                if run_id is None or letter.run_id == run_id
            ]

    def reinject_dead_letter(self, dead_letter_id: str) -> str | None:
        with self._lock:
            letter = self._dead_letters.get(dead_letter_id)
            if letter is None or letter.reinjected_attempt_id is not None:
                return None
            task = self._tasks.get(letter.task_id)
            if task is None:
                return None
            run = self._owned(task)
            if (
                run is None
                or run.status is not RunStatus.RUNNING
                or task.attempt_id != letter.attempt_id
                or task.generation != letter.generation
                or task.status not in _REINJECTABLE
            ):
                return None
            # Only the fresh attempt may be offered from now on, with a fresh
            # delivery budget.
            self._drop_rows(task.task_id)
            task.lost_deliveries = 0
            outcome = (
                TaskStatus.CANCELLED if task.status is TaskStatus.QUEUED else TaskStatus.CRASHED
            )
            new_attempt = self._replace_attempt(
                run, task, outcome=outcome, error=task.error or f"dead-lettered: {letter.reason}"
            )
            self._bump(run, task.node_index)
            self._dead_letters[dead_letter_id] = _replace_letter(letter, new_attempt)
            return new_attempt

    def _bury(self, delivery_id: str, reason: str, now: float, *, crash: bool = False) -> None:
        """Park one row; with ``crash`` its task, when the row's attempt is still
        current and unfinished, becomes CRASHED in the same commit."""
        row = self._queue[delivery_id]
        delivery = self._remove_row(delivery_id)
        assert delivery is not None
        letter = _dead_letter(delivery, row, reason, now)
        self._dead_letters[letter.dead_letter_id] = letter
        if crash:
            self._crash_dead_lettered(delivery, reason)

    def _crash_dead_lettered(self, delivery: Delivery, reason: str) -> None:
        task = self._tasks.get(delivery.task_id)
        if task is None or task.attempt_id != delivery.attempt_id:
            return
        run = self._owned(task)
        if (
            run is None
            or run.status is not RunStatus.RUNNING
            or task.status not in (TaskStatus.QUEUED, TaskStatus.RUNNING)
        ):
            return
        task.error = f"dead-lettered: {reason}"
        self._set_status(run, task, TaskStatus.CRASHED)
        self._bump(run, task.node_index)
        task.failure = TaskFailureResult(
            task_id=task.task_id,
            attempt_id=task.attempt_id,
            run_id=run.run_id,
            node_index=task.node_index,
            generation=task.generation,
            status=TaskStatus.CRASHED,
        )
        self._dead_lettered.append(TaskAttemptRef(task.task_id, task.attempt_id))


def _leased(delivery: Delivery, row: QueueRow, worker_id: str, offered_at: float) -> LeasedDelivery:
    assert row.lease_expires_at is not None
    return LeasedDelivery(
        delivery_id=delivery.delivery_id,
        task_id=delivery.task_id,
        attempt_id=delivery.attempt_id,
        generation=delivery.generation,
        run_id=delivery.run_id,
        node_index=delivery.node_index,
        launch_id=delivery.launch_id,
        queue=row.queue,
        priority=row.priority,
        delivery_count=row.delivery_count,
        worker_id=worker_id,
        lease_expires_at=row.lease_expires_at,
        offered_at=offered_at,
    )


def _dead_letter(delivery: Delivery, row: QueueRow, reason: str, now: float) -> DeadLetter:
    return DeadLetter(
        dead_letter_id=uuid.uuid4().hex,
        delivery_id=delivery.delivery_id,
        task_id=delivery.task_id,
        attempt_id=delivery.attempt_id,
        generation=delivery.generation,
        run_id=delivery.run_id,
        node_index=delivery.node_index,
        launch_id=delivery.launch_id,
        queue=row.queue,
        priority=row.priority,
        delivery_count=row.delivery_count,
        reason=reason,
        dead_at=now,
        reinjected_attempt_id=None,
    )


def _replace_letter(letter: DeadLetter, attempt_id: str) -> DeadLetter:
    return replace(letter, reinjected_attempt_id=attempt_id)
