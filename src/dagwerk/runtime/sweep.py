"""The idle sweep of stale tasks (WK-17..WK-21).

A RUNNING task whose delivery still exists is recovered by redelivery: once
its lease expires any worker leases the row and reclaims the task. The sweep
covers the rest: a RUNNING task with no queue row at all (its row was acked,
parked or lost), which no redelivery will ever reach.

It reads only the RUNNING tasks without a queue row of each RUNNING run
(``running_without_delivery`` of the built-in stores), not every task of
the run: an idle worker beside one wide run read 100,000 task records per
sweep before.

The sweep runs from an idle worker at most once per lease duration; the first
idle tick sweeps, the throttle clock advances after the sweep, and
overlapping sweeps are suppressed. Per stale task it re-reads the task and,
in the seed's write order (OB-06), lets the store advance the attempt and
write the new attempt's queue row and status in one commit
(``try_recover_task``, fenced by the attempt ID: of two concurrent sweeps
one requeues and the other replays the same result). A task already at its
attempt bound is crashed as abandoned and the run follows its failure
policy. A sweep failure is reported, never raised.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.execution import recover_task
from dagwerk.orchestrator import OrchestratorCallbacks, on_task_crashed
from dagwerk.runtime.clock import Clock
from dagwerk.store import DagRunStore, DagStore, RunningTasksStore

__all__ = ["StaleSweeper", "SweepReport", "SweptStore"]

_LOG = logging.getLogger("dagwerk.runtime.sweep")

# Runs examined per sweep; the sweep is a backstop, not a scan of history.
SWEEP_RUN_LIMIT = 1_000
SWEEP_REPORTS_KEPT = 10_000
"""How many of its latest :class:`SweepReport` a worker's sweeper keeps."""


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one sweep did with one task: ``requeued``, ``abandoned``,
    ``skipped`` or ``failed`` (``sweep_failed`` for the whole pass)."""

    task_id: str
    action: str
    detail: str = ""


class SweptStore(DagStore, DagRunStore, Protocol):
    """What the sweep reads and writes: runs, tasks, deliveries, recoveries."""


def _running_without_delivery(
    store: SweptStore, finder: RunningTasksStore | None, run_id: str
) -> list[tuple[str, str]]:
    """``(task_id, attempt_id)`` of the run's RUNNING tasks whose attempt has
    no queue row; a task with one is reclaimed by its redelivery (WK-18: the
    lease is live or due). The built-in stores answer from the RUNNING rows
    alone (``finder``, their ``running_without_delivery``); any other store
    is read in full."""
    if finder is not None:
        return finder.running_without_delivery(run_id)
    rows = {(d.task_id, d.attempt_id) for d in store.list_deliveries(run_id)}
    return [
        (record.task_id, record.attempt_id)
        for record in store.list_tasks(run_id)
        if record.status is TaskStatus.RUNNING and (record.task_id, record.attempt_id) not in rows
    ]


class StaleSweeper:
    """The throttled sweep of one worker: at most once per ``lease_seconds``;
    a task at ``max_deliveries`` attempts (or its retry bound) is abandoned."""

    def __init__(
        self,
        store: SweptStore,
        *,
        running_tasks: RunningTasksStore | None,
        clock: Clock,
        lease_seconds: float,
        max_deliveries: int,
        callbacks: OrchestratorCallbacks,
    ) -> None:
        self._store = store
        self._running_tasks = running_tasks
        self._clock = clock
        self._lease_seconds = lease_seconds
        self._max_deliveries = max_deliveries
        self.callbacks = callbacks
        self._lock = threading.Lock()
        self._running = False
        self._last: float | None = None
        # The latest only: a long-lived worker must not grow with every sweep.
        self.reports: deque[SweepReport] = deque(maxlen=SWEEP_REPORTS_KEPT)

    def maybe_sweep(self) -> list[SweepReport]:
        """Sweep if no sweep ran within the last lease duration and none is
        running; the reports of this sweep (empty when throttled)."""
        clock = self._clock
        with self._lock:
            now = clock.monotonic()
            if self._running or (self._last is not None and now - self._last < self._lease_seconds):
                return []
            self._running = True
        try:
            found = self.sweep()
        finally:
            with self._lock:
                # The throttle clock advances after the sweep (WK-17).
                self._last = clock.monotonic()
                self._running = False
        self.reports.extend(found)
        return found

    def sweep(self) -> list[SweepReport]:
        """One unthrottled pass over the RUNNING runs."""
        store = self._store
        try:
            runs = store.list_runs(status=RunStatus.RUNNING, limit=SWEEP_RUN_LIMIT)
        except Exception as exc:
            _LOG.exception("stale sweep failed")
            return [SweepReport("", "sweep_failed", f"{type(exc).__name__}: {exc}")]
        reports: list[SweepReport] = []
        for run in runs:
            try:
                stale = _running_without_delivery(store, self._running_tasks, run.run_id)
            except Exception as exc:
                reports.append(SweepReport("", "failed", f"{type(exc).__name__}: {exc}"))
                continue
            for task_id, attempt_id in stale:
                try:
                    reports.append(self._sweep_task(task_id, attempt_id))
                except Exception as exc:  # one task never stops the pass (WK-19)
                    _LOG.exception("sweeping task %s failed", task_id)
                    reports.append(SweepReport(task_id, "failed", f"{type(exc).__name__}: {exc}"))
        return reports

    def _sweep_task(self, task_id: str, attempt_id: str) -> SweepReport:
        store = self._store
        fresh = store.get_task(task_id)
        if (
            fresh is None
            or fresh.status is not TaskStatus.RUNNING
            or fresh.attempt_id != attempt_id
        ):
            return SweepReport(task_id, "skipped", "no longer running")
        nodes = store.get_run_nodes(fresh.run_id)
        if nodes is None:
            return SweepReport(task_id, "skipped", "run missing")
        node = nodes[fresh.node_index]
        bound = self._max_deliveries
        if node.retry is not None:
            bound = max(bound, node.retry.max_attempts)
        if fresh.attempt_number >= bound:
            reason = f"abandoned after {fresh.attempt_number} attempts"
            on_task_crashed(
                store,
                task_id=task_id,
                expected_attempt_id=attempt_id,
                error_message=reason,
                callbacks=self.callbacks,
            )
            return SweepReport(task_id, "abandoned", reason)
        recovered = recover_task(
            store, task_id, expected_attempt_id=attempt_id, expected_generation=fresh.generation
        )
        if recovered is None:
            return SweepReport(task_id, "skipped", "recovery refused")
        return SweepReport(task_id, "requeued", recovered.recovered_attempt_id)
