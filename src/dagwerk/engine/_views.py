"""What the dashboard and the HTTP API read about runs and tasks.

:class:`RunViews` answers through the store's declared capabilities only
(:class:`~dagwerk.store.RunViewStore` and friends); :class:`~dagwerk.Engine`
exposes each of its methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagwerk.budgets import AccountUsage
from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.errors import DagwerkError
from dagwerk.json import JsonValue
from dagwerk.lineage import RunLink
from dagwerk.models import ResolvedOutput
from dagwerk.runtime.backstop import diagnose_stored_run
from dagwerk.stall import RunDiagnosis
from dagwerk.store import (
    NodeTaskStats,
    RunCursor,
    RunPage,
    RunQuery,
    RunViewStore,
    TaskQuery,
    TaskRecord,
    TaskWait,
    WorkerRecord,
)

from ._results import RunNotFoundError

__all__ = ["RunViews", "ViewsUnsupportedError"]


class ViewsUnsupportedError(DagwerkError, RuntimeError):
    """The engine's store does not implement :class:`~dagwerk.store.RunViewStore`."""

    code = "store_operation_unsupported"


class RunViews:
    """Read-only views over one store; every method reads, none writes."""

    def __init__(self, store: Any, capabilities: StoreCapabilities) -> None:
        self.store = store
        self.capabilities = capabilities

    @property
    def views(self) -> RunViewStore:
        found = self.capabilities.views
        if found is None:
            raise ViewsUnsupportedError(
                "this store has no dashboard views (it does not implement RunViewStore)"
            )
        return found

    def runs_page(
        self,
        *,
        status: RunStatus | str | None = None,
        pipeline: str | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        after: RunCursor | str | None = None,
        limit: int = 50,
    ) -> RunPage:
        cursor = RunCursor.decode(after) if isinstance(after, str) else after
        query = RunQuery(
            status=status,  # type: ignore[arg-type]  # RunQuery converts and checks it
            pipeline=pipeline,
            created_after=created_after,
            created_before=created_before,
            after=cursor,
            limit=limit,
        )
        return self.views.list_runs_page(query)

    def run_status_counts_since(self, since: float) -> Mapping[RunStatus, int]:
        return self.views.run_status_counts_since(since)

    def run_task_counts(self, run_ids: Sequence[str]) -> Mapping[str, Mapping[TaskStatus, int]]:
        return self.views.run_task_counts(run_ids)

    def node_stats(self, run_id: str) -> list[NodeTaskStats]:
        found = self.views.node_task_stats(run_id)
        if found is None:
            raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
        return found

    def tasks_page(
        self,
        run_id: str,
        *,
        node_index: int | None = None,
        status: TaskStatus | str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> list[TaskRecord]:
        query = TaskQuery(node_index=node_index, status=status, after=after, limit=limit)  # type: ignore[arg-type]
        return self.views.list_tasks_page(run_id, query)

    def task_waits(self, task_id: str) -> list[TaskWait]:
        return self.views.list_task_waits(task_id)

    def task_outputs(self, task_id: str) -> list[ResolvedOutput]:
        return self.views.list_task_outputs(task_id)

    def node_outputs(self, run_id: str, node_index: int, limit: int) -> list[ResolvedOutput]:
        ids = tuple(self.store.get_output_ids(run_id, node_index)[:limit])
        resolved: Mapping[str, ResolvedOutput] = (
            self.store.resolve_outputs(run_id, ids) if ids else {}
        )
        return [resolved[i] for i in ids if i in resolved]

    def run_input(self, run_id: str) -> JsonValue:
        found = self.views.get_run_input(run_id)
        if found is None:
            raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
        return found

    def diagnose(self, run_id: str) -> RunDiagnosis:
        found = diagnose_stored_run(self.store, run_id)
        if found is None:
            raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
        return found

    def workers(self) -> list[WorkerRecord]:
        presence = self.capabilities.presence
        return [] if presence is None else presence.list_workers()

    def run_link(self, run_id: str) -> RunLink | None:
        children = self.capabilities.children
        return None if children is None else children.get_run_link(run_id)

    def child_runs(self, run_id: str) -> list[str]:
        children = self.capabilities.children
        return [] if children is None else children.list_child_runs(run_id)

    def budget_usage(self, run_id: str) -> tuple[AccountUsage, ...]:
        budgets = self.capabilities.budgets
        return () if budgets is None else budgets.get_run_budget(run_id)
