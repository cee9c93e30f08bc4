"""The dashboard's reads of an :class:`~dagwerk.engine.Engine` (``RunViewStore``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dagwerk.constants import (
    RunStatus,
    TaskStatus,
)
from dagwerk.lineage import RunLink
from dagwerk.models import ResolvedOutput
from dagwerk.store import (
    NodeTaskStats,
    RunCursor,
    RunPage,
    TaskRecord,
    TaskWait,
    WorkerRecord,
)

from ._views import RunViews

if TYPE_CHECKING:
    pass
from ._reads import EngineReads


class ViewMethods(EngineReads):
    """Paged runs and tasks, per-node counts and the other reads of the dashboard."""

    _views: RunViews

    # --- views (the dashboard's reads; RunViewStore) -------------------------------

    def list_runs_page(
        self,
        *,
        status: RunStatus | str | None = None,
        pipeline: str | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        after: RunCursor | str | None = None,
        limit: int = 50,
    ) -> RunPage:
        """One page of runs, newest first, filtered by status, pipeline name
        and creation time (``created_after`` inclusive, ``created_before``
        exclusive, epoch seconds). ``after`` is an earlier page's ``next``
        (or its :meth:`~dagwerk.store.RunCursor.encode` token); keyset
        paging, so a page costs the same however deep it is. Bad filters raise
        :class:`~dagwerk.store.InvalidStoreValueError` naming the field."""
        return self._views.runs_page(
            status=status,
            pipeline=pipeline,
            created_after=created_after,
            created_before=created_before,
            after=after,
            limit=limit,
        )

    def run_status_counts_since(self, since: float) -> Mapping[RunStatus, int]:
        """How many runs created at or after ``since`` are in each status."""
        return self._views.run_status_counts_since(since)

    def run_task_counts(self, run_ids: Sequence[str]) -> Mapping[str, Mapping[TaskStatus, int]]:
        """Task counts by status of each run's active generation (unknown runs absent)."""
        return self._views.run_task_counts(run_ids)

    def node_stats(self, run_id: str) -> list[NodeTaskStats]:
        """Per launched node: its launch's disposition, task counts by
        status, attempts and time span."""
        return self._views.node_stats(run_id)

    def list_tasks_page(
        self,
        run_id: str,
        *,
        node: str | None = None,
        status: TaskStatus | str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> list[TaskRecord]:
        """Up to ``limit`` tasks of the run's active generation in creation
        order, of node ``node`` (a slug) and ``status`` when given, after the
        task ID ``after``."""
        index = None if node is None else self._indices(run_id, [node])[0]
        return self._views.tasks_page(
            run_id, node_index=index, status=status, after=after, limit=limit
        )

    def get_task(self, task_id: str) -> TaskRecord | None:
        """The task's record (invalidated tasks included), or ``None``."""
        task: TaskRecord | None = self._store.get_task(task_id)
        return task

    def task_waits(self, task_id: str) -> list[TaskWait]:
        """Every wait the task entered, oldest first, with its state and response."""
        return self._views.task_waits(task_id)

    def task_outputs(self, task_id: str) -> list[ResolvedOutput]:
        """The outputs the task published under the runtime's IDs (``TASK_ID/N``)."""
        return self._views.task_outputs(task_id)

    def node_outputs(
        self, run_id: str, node_index: int, *, limit: int = 20
    ) -> list[ResolvedOutput]:
        """The first ``limit`` outputs node ``node_index`` published (active generation)."""
        return self._views.node_outputs(run_id, node_index, limit)

    def run_input(self, run_id: str) -> object:
        """The run's stored input (laid over the pipeline's defaults)."""
        return self._views.run_input(run_id)

    def list_workers(self) -> list[WorkerRecord]:
        """Workers seen recently, newest heartbeat first (none on a store
        that records no workers)."""
        return self._views.workers()

    def run_link(self, run_id: str) -> RunLink | None:
        """The parent of a child run (``None`` for a top-level run)."""
        return self._views.run_link(run_id)

    def child_runs(self, run_id: str) -> list[str]:
        """IDs of the run's child runs, in creation order."""
        return self._views.child_runs(run_id)
