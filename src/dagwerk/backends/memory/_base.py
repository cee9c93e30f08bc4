"""Shared state and helpers of the in-memory store (private).

Every public method of :class:`MemoryStore` takes ``self._lock`` for its whole
body and is one "transaction": it validates everything first, then mutates,
so a rejected call changes nothing. Status changes go through
:meth:`MemoryStoreBase._set_status`, which checks the transition table and
keeps the per-run counters that make the failure policies cheap.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from itertools import count

from dagwerk.backends.requests import check_store_settings
from dagwerk.constants import NodeDisposition, RunStatus, TaskStatus
from dagwerk.limits import DEFAULT_LIMITS, Limits
from dagwerk.models import EmittedOutput
from dagwerk.store import (
    AttemptRecord,
    DeadLetter,
    Delivery,
    TaskAttemptRef,
    TaskRecoveryResult,
)
from dagwerk.topology import RunTopology
from dagwerk.transitions import check_task_transition

from ._state import QueueRow, RunState, TaskState, WaitEntry, WaitState

_UNFINISHED = frozenset(
    {TaskStatus.PENDING, TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.WAITING}
)
_FAILURES = frozenset({TaskStatus.FAILED, TaskStatus.CRASHED})
# Statuses that settle the current attempt: its finished_at is set on entry.
_SETTLED = frozenset(
    {
        TaskStatus.COMPLETED,
        TaskStatus.FAILED,
        TaskStatus.CRASHED,
        TaskStatus.CANCELLED,
        TaskStatus.WAITING,
    }
)


class MemoryStoreBase:
    """Holds the state; the mixins implement the protocol methods."""

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
        max_deliveries: int = 3,
        default_queue: str = "default",
        default_priority: int = 0,
    ) -> None:
        check_store_settings(max_deliveries, default_queue, default_priority)
        self.limits: Limits = limits if limits is not None else DEFAULT_LIMITS
        self.max_deliveries = max_deliveries
        self.default_queue = default_queue
        self.default_priority = default_priority
        self._clock = clock
        self._lock = threading.RLock()
        # Notified on every new or released queue row: wakes waiting dequeues.
        self._work = threading.Condition(self._lock)
        # Tasks crashed by dead-lettering, until take_dead_lettered drains them.
        self._dead_lettered: list[TaskAttemptRef] = []
        self._runs: dict[str, RunState] = {}
        self._tasks: dict[str, TaskState] = {}
        # (task_id, wait_id) -> record; kept after resolution and invalidation (WT-16).
        self._waits: dict[tuple[str, str], WaitEntry] = {}
        # (task_id, abandoned attempt, generation) -> first recovery result (WT-13).
        self._recoveries: dict[tuple[str, str, int], TaskRecoveryResult] = {}
        # Deliverable outbox rows in creation order; task -> its row ids.
        self._deliveries: dict[str, Delivery] = {}
        self._task_rows: dict[str, list[str]] = {}
        # Queue state of each deliverable row, and the parked rows (in order).
        self._queue: dict[str, QueueRow] = {}
        self._dead_letters: dict[str, DeadLetter] = {}
        self._seq = count()

    # -- identities ----------------------------------------------------------

    def _new_attempt_id(self) -> str:
        return uuid.uuid4().hex

    def _next_seq(self) -> int:
        return next(self._seq)

    # -- lookups -------------------------------------------------------------

    def _topology(self, run: RunState) -> RunTopology:
        # Built lazily: a stored definition is validated by start_run before
        # any operation that needs the graph can succeed.
        if run.topology is None:
            run.topology = RunTopology.build(list(run.nodes), limits=self.limits)
        return run.topology

    def _owned(self, task: TaskState) -> RunState | None:
        """The task's run if the task belongs to its node's active launch and
        generation (FN-11), else ``None``."""
        run = self._runs.get(task.run_id)
        if run is None or task.invalidated:
            return None
        launch = run.launches.get(task.node_index)
        if (
            launch is None
            or launch.launch_id != task.launch_id
            or launch.generation != task.generation
            or run.generations[task.node_index] != task.generation
            or task.plan.generation != task.generation
        ):
            return None
        return run

    def _current_running(self, task_id: str, attempt_id: str) -> tuple[RunState, TaskState] | None:
        """The run and task if ``attempt_id`` owns a RUNNING task of an active
        launch in a RUNNING run."""
        task = self._tasks.get(task_id)
        if task is None:
            return None
        run = self._owned(task)
        if (
            run is None
            or run.status is not RunStatus.RUNNING
            or task.status is not TaskStatus.RUNNING
            or task.attempt_id != attempt_id
        ):
            return None
        return run, task

    # -- mutations (callers have validated everything) ------------------------

    def _set_status(self, run: RunState, task: TaskState, new: TaskStatus) -> None:
        old = task.status
        check_task_transition(old, new)
        task.status = new
        if new is TaskStatus.RUNNING:
            task.started_at = float(self._clock())
            task.finished_at = None
        elif new in _SETTLED and task.finished_at is None:
            # A WAITING attempt that is cancelled keeps the time it settled.
            task.finished_at = float(self._clock())
        if not task.invalidated:
            run.counts[old] -= 1
            run.counts[new] += 1
            if new in _FAILURES:
                run.failed_tasks[task.task_id] = task.seq
            elif old in _FAILURES:
                run.failed_tasks.pop(task.task_id, None)

    def _enqueue(
        self,
        run: RunState,
        task: TaskState,
        *,
        available_at: float | None = None,
        delivery_count: int = 0,
    ) -> None:
        """Write the outbox row for the task's current attempt, on the node's
        queue with the node's priority (the store's defaults when unset)."""
        delivery = Delivery(
            delivery_id=uuid.uuid4().hex,
            task_id=task.task_id,
            attempt_id=task.attempt_id,
            generation=task.generation,
            run_id=run.run_id,
            node_index=task.node_index,
            launch_id=task.launch_id,
        )
        node = run.nodes[task.node_index]
        self._deliveries[delivery.delivery_id] = delivery
        self._task_rows.setdefault(task.task_id, []).append(delivery.delivery_id)
        self._queue[delivery.delivery_id] = QueueRow(
            seq=self._next_seq(),
            queue=node.queue if node.queue != "default" else self.default_queue,
            priority=node.priority if node.priority else self.default_priority,
            available_at=float(self._clock()) if available_at is None else available_at,
            run_id=run.run_id,
            plugin=node.plugin,
            delivery_count=delivery_count,
        )
        self._work.notify_all()

    def _replace_attempt(
        self,
        run: RunState,
        task: TaskState,
        *,
        outcome: TaskStatus | None = None,
        error: str | None = None,
        resumed_from: str | None = None,
        available_at: float | None = None,
        delivery_count: int = 0,
    ) -> str:
        """A new QUEUED attempt with its outbox row, in the caller's transaction.

        The replaced attempt is archived with ``outcome`` (default: the task's
        status) and ``error`` (default: the task's error).
        """
        task.past_attempts.append(
            AttemptRecord(
                attempt_id=task.attempt_id,
                number=task.attempt_number,
                status=outcome if outcome is not None else task.status,
                error=error if error is not None else task.error,
                worker_id=task.worker_id,
                resumed_from_wait_id=task.resumed_from_wait_id,
                started_at=task.started_at,
                # An unfinished attempt ends as it is replaced.
                finished_at=(
                    task.finished_at if task.finished_at is not None else float(self._clock())
                ),
            )
        )
        task.started_at = None
        task.finished_at = None
        if resumed_from is not None:
            task.resumed_from_wait_id = resumed_from
        task.attempt_id = self._new_attempt_id()
        task.attempt_number += 1
        task.worker_id = None
        task.error = None
        task.failure = None
        if task.status is not TaskStatus.QUEUED:
            self._set_status(run, task, TaskStatus.QUEUED)
        self._enqueue(run, task, available_at=available_at, delivery_count=delivery_count)
        return task.attempt_id

    def _drop_rows(self, task_id: str) -> None:
        for delivery_id in self._task_rows.pop(task_id, ()):
            self._deliveries.pop(delivery_id, None)
            self._queue.pop(delivery_id, None)

    def _remove_row(self, delivery_id: str) -> Delivery | None:
        """Remove one outbox row and its queue state; the row, if it existed."""
        delivery = self._deliveries.pop(delivery_id, None)
        if delivery is None:
            return None
        self._queue.pop(delivery_id, None)
        rows = self._task_rows.get(delivery.task_id)
        if rows is not None:
            rows.remove(delivery_id)
        return delivery

    def _stop_task(self, run: RunState, task: TaskState) -> None:
        """Invalidate the task's active wait, cancel it if unfinished, and drop
        its deliveries."""
        if task.active_wait_id is not None:
            wait = self._waits[(task.task_id, task.active_wait_id)]
            wait.state = WaitState.INVALIDATED
            task.active_wait_id = None
        if task.status in _UNFINISHED:
            self._set_status(run, task, TaskStatus.CANCELLED)
        self._drop_rows(task.task_id)

    def _bump(self, run: RunState, node_index: int) -> None:
        run.node_revisions[node_index] += 1

    def _token(self, run: RunState, node_index: int) -> str:
        """A token covering the run epoch, the node's generation and the state
        revision of each of its sources: any change makes it stale."""
        sources = sorted(set(self._topology(run).dependencies[node_index]))
        revisions = ",".join(f"{s}:{run.node_revisions[s]}" for s in sources)
        return f"{run.run_id}|{run.epoch}|{node_index}|{run.generations[node_index]}|{revisions}"

    # -- hooks of the child-run and budget mixins -------------------

    def _after_terminate(self, run: RunState, status: RunStatus, error: str | None) -> None:
        """Called inside a run's terminal transition, after its own writes."""
        return None

    def _charge_completion(
        self, run: RunState, task: TaskState, outputs: tuple[EmittedOutput, ...]
    ) -> None:
        """Called by a completion after its outputs validated, before any write;
        raises to refuse the completion."""
        return None

    def _failed_nodes(self, run: RunState) -> set[int]:
        """Active nodes with a FAILED planning launch or a FAILED/CRASHED task."""
        nodes = {
            index
            for index, launch in run.launches.items()
            if launch.disposition is NodeDisposition.FAILED
        }
        nodes.update(self._tasks[task_id].node_index for task_id in run.failed_tasks)
        return nodes
