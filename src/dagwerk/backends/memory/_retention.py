"""Retention of the in-memory store (the reference for
:class:`~dagwerk.store_retention.RunRetentionStore`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection

from dagwerk.constants import RUN_TERMINAL_STATUSES, RunStatus
from dagwerk.store_durable import StepRecord
from dagwerk.store_logs import TaskLogLine
from dagwerk.store_retention import (
    DEFAULT_RETENTION_BATCH,
    Lineage,
    RetentionBatch,
    RetentionCursor,
    check_retention_request,
    choose_lineages,
)
from dagwerk.store_schedules import ScheduleFire

from ._children import ChildrenMixin
from ._gated import GatedMixin
from ._schedules import HeldKey


class RetentionMixin(ChildrenMixin, GatedMixin):
    # Records of the durable, logs and schedules mixins of the same store,
    # which a run's deletion takes with it.
    _steps: dict[str, dict[str, StepRecord]]
    _task_logs: dict[str, list[TaskLogLine]]
    _traceparents: dict[str, str]
    _fires: dict[str, dict[int, ScheduleFire]]
    _run_fires: dict[str, ScheduleFire]
    _keys: dict[str, HeldKey]

    def delete_finished_runs(
        self,
        *,
        older_than: float,
        statuses: Collection[RunStatus | str] | None = None,
        limit: int = DEFAULT_RETENTION_BATCH,
        after: RetentionCursor | None = None,
        dry_run: bool = False,
    ) -> RetentionBatch:
        request = check_retention_request(
            older_than=older_than, statuses=statuses, limit=limit, after=after, dry_run=dry_run
        )
        wanted = frozenset(request.statuses)
        with self._lock:
            cutoff = float(self._clock()) - request.older_than
            roots = sorted(
                RetentionCursor(run.finished_at, run.run_id)
                for run in self._runs.values()
                if run.finished_at is not None
                and run.finished_at < cutoff
                and run.status in wanted
                and not self._has_stored_parent(run.run_id)
                and (
                    request.after is None
                    or RetentionCursor(run.finished_at, run.run_id) > request.after
                )
            )
            examined = roots[: request.limit]
            lineages = []
            for root in examined:
                runs = self._lineage(root.run_id)
                deletable = all(self._runs[r].status in RUN_TERMINAL_STATUSES for r in runs)
                lineages.append(Lineage(root, runs, deletable))
            choice = choose_lineages(
                lineages, limit=request.limit, exhausted=len(roots) <= request.limit
            )
            deleted = tuple(run_id for lineage in choice.delete for run_id in lineage.runs)
            rows: Counter[str] = Counter()
            if request.dry_run:
                rows["runs"] = len(deleted)
            else:
                for run_id in deleted:
                    self._delete_run(run_id, rows)
        return RetentionBatch(
            deleted, {k: v for k, v in rows.items() if v}, choice.passed, choice.after
        )

    def _has_stored_parent(self, run_id: str) -> bool:
        link = self._links.get(run_id)
        return link is not None and link.parent_run_id in self._runs

    def _lineage(self, root: str) -> tuple[str, ...]:
        """``root`` and every stored run below it, parents before children."""
        found = [root]
        for run_id in found:  # grows while walked: breadth first
            found.extend(c for c in self._children.get(run_id, ()) if c in self._runs)
        return tuple(found)

    def _delete_run(self, run_id: str, rows: Counter[str]) -> None:
        """Every record of ``run_id``, counted per kind (named as the SQL
        stores name their tables)."""
        run = self._runs.pop(run_id)
        rows["runs"] += 1
        rows["nodes"] += len(run.nodes)
        rows["launches"] += len(run.launches)
        rows["outputs"] += len(run.outputs)
        task_ids = set(run.task_ids)
        for task_id in run.task_ids:
            task = self._tasks.pop(task_id, None)
            if task is None:
                continue
            rows["tasks"] += 1
            rows["attempts"] += len(task.past_attempts)
            rows["attempt_tracebacks"] += len(task.tracebacks)
            rows["steps"] += len(self._steps.pop(task_id, ()))
            for wait_id in task.wait_ids:
                if self._waits.pop((task_id, wait_id), None) is not None:
                    rows["waits"] += 1
            rows["deliveries"] += len(self._task_rows.get(task_id, ()))
            self._drop_rows(task_id)
        for recovery in [k for k in self._recoveries if k[0] in task_ids]:
            del self._recoveries[recovery]
            rows["recoveries"] += 1
        for letter in [k for k, d in self._dead_letters.items() if d.run_id == run_id]:
            del self._dead_letters[letter]
            rows["dead_letters"] += 1
        self._dead_lettered = [ref for ref in self._dead_lettered if ref.task_id not in task_ids]
        for key in [k for k, hold in self._holds.items() if hold.run_id == run_id]:
            del self._holds[key]
            rows["budget_holds"] += 1
        for charge in [k for k in self._input_charges if k[0] in task_ids]:
            del self._input_charges[charge]
        if self._accounts.pop(run_id, None) is not None:
            rows["budgets"] += 1
        rows["run_accounts"] += len(self._run_accounts.pop(run_id, ()))
        link = self._links.pop(run_id, None)
        if link is not None:
            rows["run_links"] += 1
            siblings = self._children.get(link.parent_run_id)
            if siblings is not None:
                siblings.remove(run_id)
                if not siblings:
                    del self._children[link.parent_run_id]
        self._children.pop(run_id, None)
        rows["task_logs"] += len(self._task_logs.pop(run_id, ()))
        fire = self._run_fires.pop(run_id, None)
        if fire is not None:
            self._fires.get(fire.schedule_id, {}).pop(fire.tick, None)
            rows["schedule_fires"] += 1
        for held_key in [k for k, held in self._keys.items() if held.run_id == run_id]:
            del self._keys[held_key]
            rows["idempotency_keys"] += 1
        self._traceparents.pop(run_id, None)
        if self._stalls.pop(run_id, None) is not None:
            rows["stalls"] += 1
