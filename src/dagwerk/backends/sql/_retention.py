"""Retention of the SQL store (see :class:`~dagwerk.store_retention.RunRetentionStore`).

Which tables hold a run's rows is declared once, in :data:`RUN_TABLES`: each
table with the column that ties a row to its run, in the order a delete
must take them (rows before the rows their foreign keys name). Every table
entry has its ``retention_delete_<name>`` block in both ``queries.sql``
files. A table that holds no run's rows is listed in :data:`GLOBAL_TABLES`
with the reason; a test reads the live schema of both databases and fails
on a table in neither list.

A batch is one write transaction. On SQLite it holds the database's write
lock, so two processes' batches run one after the other and the second sees
what the first deleted. On PostgreSQL a batch locks the roots it examines
and the runs of their lineages with ``FOR UPDATE SKIP LOCKED``: a run held
by another transaction (a worker's, or another retention batch's) is never
waited for; its lineage is passed over and left to a later pass. Every
other writer of a lineage locks the lineage's root row first (see
``postgres/queries.sql``), so once a batch holds a root nothing else
changes its lineage until the batch commits.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from dagwerk.constants import RUN_TERMINAL_STATUSES, RunStatus
from dagwerk.store_retention import (
    DEFAULT_RETENTION_BATCH,
    Lineage,
    RetentionBatch,
    RetentionCursor,
    RetentionRequest,
    check_retention_request,
    choose_lineages,
)

from ._base import SqlStoreBase
from .gateway import Tx

__all__ = ["GLOBAL_TABLES", "RUN_TABLES", "RetentionMixin", "RunTable"]


@dataclass(frozen=True, slots=True)
class RunTable:
    """A table whose rows belong to runs."""

    name: str
    """The table (``dagwerk_tasks``)."""
    key: str
    """The column naming the row's run: ``run_id``; ``task_id`` for rows of
    a run's tasks; ``account_id`` for a run's own budget account."""

    @property
    def kind(self) -> str:
        """The table's name without ``dagwerk_``: its key in
        :attr:`~dagwerk.store_retention.RetentionBatch.rows`."""
        return self.name.removeprefix("dagwerk_")

    @property
    def statement(self) -> str:
        """The block that deletes the table's rows of the runs ``:runs``."""
        return f"retention_delete_{self.kind}"


RUN_TABLES: Final = (
    RunTable("dagwerk_steps", "task_id"),
    RunTable("dagwerk_waits", "task_id"),
    RunTable("dagwerk_recoveries", "task_id"),
    RunTable("dagwerk_attempts", "task_id"),
    RunTable("dagwerk_attempt_tracebacks", "task_id"),
    RunTable("dagwerk_deliveries", "run_id"),
    RunTable("dagwerk_dead_letters", "run_id"),
    RunTable("dagwerk_budget_holds", "run_id"),
    RunTable("dagwerk_tasks", "run_id"),
    RunTable("dagwerk_outputs", "run_id"),
    RunTable("dagwerk_launches", "run_id"),
    RunTable("dagwerk_nodes", "run_id"),
    RunTable("dagwerk_run_links", "run_id"),
    RunTable("dagwerk_run_accounts", "run_id"),
    RunTable("dagwerk_budgets", "account_id"),
    RunTable("dagwerk_stalls", "run_id"),
    RunTable("dagwerk_task_logs", "run_id"),
    RunTable("dagwerk_schedule_fires", "run_id"),
    RunTable("dagwerk_idempotency_keys", "run_id"),
    RunTable("dagwerk_runs", "run_id"),
)
"""Every table holding rows of a run, in delete order (``dagwerk_runs`` last)."""

GLOBAL_TABLES: Final = {
    "dagwerk_schema_version": "the schema's version",
    "dagwerk_leases": "named leases of the background passes (the backstop's)",
    "dagwerk_workers": "worker presence, pruned by age",
    "dagwerk_schedules": "schedules (their tick records are a run's)",
}
"""Tables whose rows belong to no run, with the reason."""


class RetentionMixin(SqlStoreBase):
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
        if request.dry_run:
            with self._gw.read() as tx:
                return self._retention_batch(tx, request)
        with self._gw.write() as tx:
            batch = self._retention_batch(tx, request)
        for run_id in batch.run_ids:
            self._forget_run(run_id)
        return batch

    def _retention_batch(self, tx: Tx, request: RetentionRequest) -> RetentionBatch:
        after = request.after
        params = {
            "before": self._now() - request.older_than,
            "statuses": json.dumps([status.value for status in request.statuses]),
            "after_at": float("-inf") if after is None else after.finished_at,
            "after_id": "" if after is None else after.run_id,
            # One more than examined: whether any root follows them.
            "limit": request.limit + 1,
        }
        if request.dry_run:
            roots = tx.all("retention_roots", params)
        else:
            roots = tx.all("retention_claim_roots", params)
        examined = [RetentionCursor(row["finished_at"], row["run_id"]) for row in roots]
        examined = examined[: request.limit]
        members: dict[str, list[str]] = defaultdict(list)
        terminal: dict[str, bool] = defaultdict(lambda: True)
        if examined:
            for row in tx.all(
                "retention_lineages", {"roots": json.dumps([root.run_id for root in examined])}
            ):
                root_id, run_id = row["root_id"], row["run_id"]
                if run_id != root_id:
                    members[root_id].append(run_id)
                if RunStatus(row["status"]) not in RUN_TERMINAL_STATUSES:
                    terminal[root_id] = False
        lineages = [
            Lineage(root, (root.run_id, *sorted(members[root.run_id])), terminal[root.run_id])
            for root in examined
        ]
        if not request.dry_run:
            lineages = self._unlocked_lineages(tx, lineages)
        choice = choose_lineages(
            lineages, limit=request.limit, exhausted=len(roots) <= request.limit
        )
        run_ids = tuple(run_id for lineage in choice.delete for run_id in lineage.runs)
        rows: dict[str, int] = {}
        if request.dry_run and run_ids:
            rows["runs"] = len(run_ids)
        elif run_ids:
            runs = json.dumps(run_ids)
            for table in RUN_TABLES:
                deleted = tx.run(table.statement, {"runs": runs})
                if deleted:
                    rows[table.kind] = deleted
        return RetentionBatch(run_ids, rows, choice.passed, choice.after)

    def _unlocked_lineages(self, tx: Tx, lineages: list[Lineage]) -> list[Lineage]:
        """``lineages`` with those not deletable whose runs this transaction
        could not lock (PostgreSQL; on SQLite the write lock holds them all)."""
        wanted = [run_id for lineage in lineages if lineage.deletable for run_id in lineage.runs]
        if not wanted:
            return lineages
        locked = {
            row["run_id"] for row in tx.all("retention_lock_runs", {"runs": json.dumps(wanted)})
        }
        return [
            lineage
            if not lineage.deletable or locked.issuperset(lineage.runs)
            else Lineage(lineage.root, lineage.runs, False)
            for lineage in lineages
        ]

    def _forget_run(self, run_id: str) -> None:
        """Drop a deleted run's cached definition (a run created later under
        the same ID is read afresh)."""
        for cache in (
            self._nodes_cache,
            self._run_routes,
            self._topologies,
            self._policies,
            self._unbudgeted,
        ):
            cache.pop(run_id, None)
