"""The backstop operations of the in-memory store (the reference for
:class:`~dagwerk.store.BackstopStore`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagwerk.backends.requests import check_name, check_stall
from dagwerk.constants import NodeDisposition, RunStatus, TaskStatus
from dagwerk.store import QueueStats, StallRecord, validate_seconds

from ._base import MemoryStoreBase
from ._state import TaskState


class GatedMixin(MemoryStoreBase):
    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        # lease name -> (holder, expires_at)
        self._leases: dict[str, tuple[str, float]] = {}
        self._stalls: dict[str, StallRecord] = {}

    def try_acquire_lease(self, name: str, holder: str, seconds: float) -> bool:
        check_name(name, "name")
        check_name(holder, "holder")
        span = validate_seconds(seconds, "seconds", positive=True)
        with self._lock:
            now = float(self._clock())
            current = self._leases.get(name)
            if current is not None and current[0] != holder and current[1] > now:
                return False
            self._leases[name] = (holder, now + span)
            return True

    def release_lease(self, name: str, holder: str) -> bool:
        with self._lock:
            current = self._leases.get(name)
            if current is None or current[0] != holder:
                return False
            del self._leases[name]
            return True

    def repair_missing_deliveries(self, run_id: str) -> list[str]:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.status is not RunStatus.RUNNING:
                return []
            parked = {
                (letter.task_id, letter.attempt_id)
                for letter in self._dead_letters.values()
                if letter.run_id == run_id and letter.reinjected_attempt_id is None
            }
            repaired: list[str] = []
            for task_id in run.task_ids:
                task = self._tasks[task_id]
                if task.status is not TaskStatus.QUEUED or self._owned(task) is not run:
                    continue
                if self._attempt_has_row(task):
                    continue
                if (task_id, task.attempt_id) in parked:
                    continue
                self._enqueue(run, task, delivery_count=task.lost_deliveries)
                repaired.append(task_id)
            return repaired

    def running_without_delivery(self, run_id: str) -> list[tuple[str, str]]:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return []
            found: list[tuple[str, str]] = []
            for task_id in run.task_ids:
                task = self._tasks[task_id]
                if task.invalidated or task.status is not TaskStatus.RUNNING:
                    continue
                if not self._attempt_has_row(task):
                    found.append((task_id, task.attempt_id))
            return found

    def has_live_node(self, run_id: str) -> bool:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return False
            failed: set[int] = set()
            live: set[int] = set()
            for task_id in run.task_ids:
                task = self._tasks[task_id]
                if task.invalidated:
                    continue
                if task.status in (TaskStatus.FAILED, TaskStatus.CRASHED):
                    failed.add(task.node_index)
                elif task.status is TaskStatus.RUNNING or (
                    task.status is TaskStatus.QUEUED and self._attempt_has_row(task)
                ):
                    live.add(task.node_index)
            return any(
                index in run.launches
                and run.launches[index].disposition is NodeDisposition.LAUNCHED
                for index in live - failed
            )

    def _attempt_has_row(self, task: TaskState) -> bool:
        """Whether the task's current attempt has a queue row (caller holds the lock)."""
        rows = self._task_rows.get(task.task_id, ())
        return any(self._deliveries[row].attempt_id == task.attempt_id for row in rows)

    def wait_ages(self, run_id: str) -> Mapping[str, float]:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.status is not RunStatus.RUNNING:
                return {}
            now = float(self._clock())
            ages: dict[str, float] = {}
            for task_id in run.task_ids:
                task = self._tasks[task_id]
                if (
                    task.status is not TaskStatus.WAITING
                    or task.active_wait_id is None
                    or self._owned(task) is not run
                ):
                    continue
                wait = self._waits[(task_id, task.active_wait_id)]
                ages[task_id] = max(0.0, now - wait.waited_at)
            return ages

    def try_record_stall(self, run_id: str, reason: str, held_nodes: tuple[int, ...]) -> bool:
        held = check_stall(run_id, reason, held_nodes)
        with self._lock:
            if run_id not in self._runs:
                return False
            found = self._stalls.get(run_id)
            detected = float(self._clock()) if found is None else found.detected_at
            self._stalls[run_id] = StallRecord(run_id, reason, held, detected)
            return found is None

    def clear_stall(self, run_id: str) -> bool:
        with self._lock:
            return self._stalls.pop(run_id, None) is not None

    def list_stalls(self) -> list[StallRecord]:
        with self._lock:
            return sorted(self._stalls.values(), key=lambda s: (s.detected_at, s.run_id))

    def queue_stats(self) -> list[QueueStats]:
        with self._lock:
            now = float(self._clock())
            depth: dict[str, int] = {}
            oldest: dict[str, float] = {}
            for row in self._queue.values():
                depth.setdefault(row.queue, 0)
                if row.lease_expires_at is None or row.lease_expires_at <= now:
                    depth[row.queue] += 1
                if row.available_at <= now:
                    oldest[row.queue] = min(
                        oldest.get(row.queue, row.available_at), row.available_at
                    )
            return [QueueStats(name, depth[name], oldest.get(name)) for name in sorted(depth)]

    def run_status_counts(self) -> Mapping[RunStatus, int]:
        with self._lock:
            counts: dict[RunStatus, int] = {}
            for run in self._runs.values():
                counts[run.status] = counts.get(run.status, 0) + 1
            return counts
