"""What an :class:`~dagwerk.engine.Engine` reads of its store, and its
retention and monitoring; the base of the engine's method groups."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from dagwerk.budgets import AccountUsage
from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import (
    RunStatus,
)
from dagwerk.models import DagNode, NodeLaunch
from dagwerk.runtime.backstop import (
    Backstop,
    diagnose_stored_run,
)
from dagwerk.runtime.retention import RetentionSummary, delete_runs
from dagwerk.stall import RunDiagnosis
from dagwerk.store import (
    DeadLetter,
    RunRecord,
    StallRecord,
    TaskJournal,
    TaskRecord,
)
from dagwerk.store_logs import TaskLogLine
from dagwerk.store_retention import DEFAULT_RETENTION_BATCH

from ._logs import read_logs
from ._results import (
    MAX_TREE_RUNS,
    RunLineage,
    RunNotFoundError,
    RunProgress,
    RunResult,
    read_lineage,
    read_progress,
    read_result,
)

if TYPE_CHECKING:
    from dagwerk.health import HealthState
    from dagwerk.metrics import Metrics
from ._errors import (
    UnknownNodeError,
    UnsupportedOperationError,
)
from ._schedules import EngineSchedules


class EngineReads:
    """The reads of an engine's store: runs, tasks, attempts, journals,
    stalls, dead letters, logs, retention and monitoring."""

    _store: Any
    _capabilities: StoreCapabilities
    _schedules: EngineSchedules | None

    # --- inspection --------------------------------------------------------------

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run's record, or ``None``."""
        record: RunRecord | None = self._store.get_run(run_id)
        return record

    def result(self, run_id: str) -> RunResult:
        """The run's status, error and published outputs, whatever its state."""
        return read_result(self._store, run_id, self._capabilities.run_outputs)

    def progress(self, run_id: str) -> RunProgress:
        """Node and task counts of the run's active generation."""
        return read_progress(self._store, run_id)

    def nodes(self, run_id: str) -> list[DagNode]:
        """The node definitions stored with the run."""
        nodes: list[DagNode] | None = self._store.get_run_nodes(run_id)
        if nodes is None:
            raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
        return nodes

    def node_launches(self, run_id: str) -> Mapping[int, NodeLaunch]:
        """The launches of the run's active generation, keyed by node index
        (a node that has not been planned yet has none)."""
        self._require_run(run_id)
        launches: Mapping[int, NodeLaunch] = self._store.list_node_launches(run_id)
        return launches

    def diagnose(self, run_id: str) -> RunDiagnosis:
        """Why each node of the run has or has not run, and whether the run is
        stalled, read from the store's durable state (``dagwerk show --why``).
        Read-only."""
        diagnosis = diagnose_stored_run(self._store, run_id)
        if diagnosis is None:
            raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
        return diagnosis

    def lineage(self, run_id: str, *, max_runs: int = MAX_TREE_RUNS) -> RunLineage:
        """The run's link to the task that started it (``None``: a root run)
        and the tree of child runs started under it, with at most
        ``max_runs`` runs in all.

        Raises :class:`UnsupportedOperationError` for a store that keeps no
        child runs (it does not implement :class:`~dagwerk.store.DagChildStore`).
        """
        self._require_run(run_id)
        children = self._capabilities.children
        if children is None:
            raise UnsupportedOperationError(
                "this store keeps no child runs (it does not implement DagChildStore)"
            )
        return read_lineage(self._store, children, run_id, max_runs=max_runs)

    def budget_usage(self, run_id: str) -> tuple[AccountUsage, ...]:
        """What every budget account the run draws on has used: its own
        account first, then its ancestors'. Empty for a run without budgets
        and on a store without budgets."""
        self._require_run(run_id)
        budgets = self._capabilities.budgets
        return () if budgets is None else tuple(budgets.get_run_budget(run_id))

    def list_runs(
        self,
        status: RunStatus | str | None = None,
        limit: int = 50,
        *,
        schedule: str | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first, optionally only those with ``status``; with
        ``schedule``, only that schedule's runs (scheduled and backfilled),
        newest tick first."""
        runs = self._capabilities.runs
        if runs is None:
            raise UnsupportedOperationError(
                "this store cannot list runs (it does not implement DagRunStore)"
            )
        wanted = RunStatus(status) if status is not None else None
        if schedule is not None:
            return self._schedule_runs(schedule, wanted, limit)
        return runs.list_runs(status=wanted, limit=limit)

    def _schedule_runs(self, name: str, status: RunStatus | None, limit: int) -> list[RunRecord]:
        schedules = self._require_schedules()
        record = schedules.get(name)
        found: list[RunRecord] = []
        until: int | None = None
        while len(found) < limit:
            page = schedules.store.list_schedule_fires(record.schedule_id, limit=500, until=until)
            for fire in page:
                run = None if fire.run_id is None else self.get_run(fire.run_id)
                if run is not None and (status is None or run.status is status):
                    found.append(run)
                    if len(found) == limit:
                        break
            if len(page) < 500:
                break
            until = page[-1].tick - 1
        return found

    def list_tasks(self, run_id: str, *, include_invalidated: bool = False) -> list[TaskRecord]:
        """The run's tasks in creation order (active generation unless asked)."""
        self._require_run(run_id)
        tasks: list[TaskRecord] = self._store.list_tasks(
            run_id, include_invalidated=include_invalidated
        )
        return tasks

    def list_attempts(self, task_id: str) -> list[Any]:
        """The task's attempts, oldest first (needs a ``DagRunStore``)."""
        runs = self._capabilities.runs
        if runs is None:
            raise UnsupportedOperationError(
                "this store cannot list attempts (it does not implement DagRunStore)"
            )
        return list(runs.list_attempts(task_id))

    def task_journals(self, run_id: str) -> Mapping[str, TaskJournal]:
        """What the run's tasks recorded (``ctx.step`` results, waits with
        their responses, child runs), keyed by task ID, for the tasks that
        recorded a step or a wait; empty on a store that keeps no such
        records (no :class:`~dagwerk.store.DurableTaskStore`)."""
        durable = self._capabilities.durable
        return {} if durable is None else durable.list_run_journals(run_id)

    def task_journal(self, task_id: str) -> TaskJournal | None:
        """What one task recorded (``ctx.step`` results, waits with their
        responses, child runs) in its current generation; ``None`` for an
        unknown task or a store that keeps no such records."""
        durable = self._capabilities.durable
        return None if durable is None else durable.get_task_journal(task_id)

    def list_stalls(self) -> list[StallRecord]:
        """The stalls a backstop recorded, oldest detection first (none on a
        store that records no stalls)."""
        backstop = self._capabilities.backstop
        return [] if backstop is None else backstop.list_stalls()

    def list_dead_letters(self, run_id: str | None = None) -> list[DeadLetter]:
        """Dead letters in the order they were parked (re-injected ones included)."""
        letters: list[DeadLetter] = self._store.list_dead_letters(run_id)
        return letters

    # --- retention ---------------------------------------------------------------

    def delete_runs(
        self,
        older_than: float | timedelta | str,
        *,
        statuses: Collection[RunStatus | str] | None = None,
        dry_run: bool = False,
        batch_size: int = DEFAULT_RETENTION_BATCH,
    ) -> RetentionSummary:
        """Delete every run that finished more than ``older_than`` ago (seconds,
        a timedelta or an age such as ``"30d"``) with one of ``statuses``
        (default: every terminal status), with everything stored for it.

        A parent takes its child runs with it; a child is deleted only with
        its parent, and a lineage only when all its runs are terminal. Deletes
        ``batch_size`` runs per transaction, so workers keep running; safe to
        call from several processes at once. ``dry_run`` deletes nothing and
        counts the runs it would delete."""
        retention = self._capabilities.retention
        if retention is None:
            raise UnsupportedOperationError("this store cannot delete runs")
        return delete_runs(
            retention,
            older_than=older_than,
            statuses=statuses,
            dry_run=dry_run,
            batch_size=batch_size,
        )

    def logs(
        self,
        run_id: str,
        *,
        task_id: str | None = None,
        node: str | None = None,
        attempt: int | None = None,
        after: int = 0,
        limit: int | None = None,
    ) -> list[TaskLogLine]:
        """The lines the run's plugins logged, in stored order: of one task,
        one node (its slug) and one attempt number where given, after the line
        whose ``line_id`` is ``after`` (to follow a running run), at most
        ``limit`` of them. Needs a store that keeps task logs (every built-in one)."""
        store = self._capabilities.task_logs
        if store is None:
            raise UnsupportedOperationError("this store keeps no task logs")
        self._require_run(run_id)
        node_index = None if node is None else self._indices(run_id, [node])[0]
        return read_logs(
            store,
            run_id,
            task_id=task_id,
            node_index=node_index,
            attempt=attempt,
            after=after,
            limit=limit,
        )

    def monitoring(self, backstop: Backstop | None = None) -> tuple[Metrics, HealthState]:
        """The Prometheus metrics (``/metrics``) and the health state
        (``/healthz``) of this engine's store, for a server to expose; give
        both to the workers it runs as observers. ``backstop`` is the pass
        whose age the health state checks."""
        from dagwerk.health import HealthState
        from dagwerk.metrics import Metrics

        return Metrics(store=self._store), HealthState(self._store, backstop=backstop)

    def reinject(self, dead_letter_id: str) -> str | None:
        """Give a dead letter's task a fresh attempt; the new attempt ID or ``None``."""
        attempt: str | None = self._store.reinject_dead_letter(dead_letter_id)
        return attempt

    # --- helpers -----------------------------------------------------------------

    def _require_run(self, run_id: str) -> None:
        if self._store.get_run_status(run_id) is None:
            raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")

    def _indices(self, run_id: str, slugs: Sequence[str]) -> list[int]:
        if isinstance(slugs, str):
            slugs = [slugs]
        by_slug = {node.slug: index for index, node in enumerate(self.nodes(run_id))}
        unknown = [slug for slug in slugs if slug not in by_slug]
        if unknown:
            raise UnknownNodeError(
                f"run {run_id!r} has no node {unknown[0]!r} (nodes: {', '.join(by_slug)})",
                field="nodes",
            )
        return [by_slug[slug] for slug in slugs]

    def _require_schedules(self) -> EngineSchedules:
        if self._schedules is None:
            raise UnsupportedOperationError(
                "this store cannot keep schedules (it does not implement ScheduleStore)"
            )
        return self._schedules
