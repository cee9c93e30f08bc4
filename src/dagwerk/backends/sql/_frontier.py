"""The run frontier of the SQL store (``RunFrontierStore``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager

from dagwerk.constants import NodeDisposition, RunStatus
from dagwerk.store import LaunchProgress, RunFrontier

from ._base import FreshFrontier, SqlStoreBase
from .gateway import Row


class FrontierMixin(SqlStoreBase):
    def reads_with_completions(self) -> AbstractContextManager[None]:
        """See :class:`~dagwerk.store_completion_reads.CompletionReadsStore`."""
        return self._completion_reads.block()

    def get_run_frontier(
        self, run_id: str, node_indices: Sequence[int], *, count_complete: bool = False
    ) -> RunFrontier | None:
        nodes = sorted({index for index in node_indices if type(index) is int})
        # Read with the completions just committed (see store_completion_reads).
        ahead = (
            self._completion_reads.take_frontier(run_id, nodes, count_complete)
            if self._completion_reads.active
            else None
        )
        if ahead is not None:
            run, rows = ahead
        else:
            found, rows = self._read_frontier(run_id, nodes, count_complete)
            if found is None:
                return None
            run = found
        launches: dict[int, LaunchProgress] = {}
        active = [row for row in rows if row["launch_id"] is not None]
        mark = self._write_mark()
        if mark is not None:
            # Read inside a unit's write transaction: until the unit's
            # next write, a planning snapshot needs none of it again.
            self._fresh_frontier = FreshFrontier(
                mark,
                run,
                frozenset(nodes),
                {row["node_index"]: row for row in active},
                {row["node_index"]: row for row in rows},
            )
        if nodes:
            for row in active:
                disposition = NodeDisposition(row["disposition"])
                launches[row["node_index"]] = LaunchProgress(
                    launch_id=row["launch_id"],
                    node_index=row["node_index"],
                    generation=row["generation"],
                    disposition=disposition,
                    complete=disposition is not NodeDisposition.LAUNCHED
                    or row["completed"] == row["task_count"],
                )
        return RunFrontier(
            status=RunStatus(run["status"]),
            node_count=run["node_count"],
            complete_nodes=run["complete_nodes"],
            has_failure=bool(run["has_failure"]),
            launches=launches,
        )

    def _read_frontier(
        self, run_id: str, nodes: list[int], count_complete: bool
    ) -> tuple[Row | None, list[Row]]:
        head = ("run_frontier", {"run_id": run_id, "count": 1 if count_complete else 0})
        with self._gw.read() as tx:
            # The nodes' generations and revisions come along (one statement):
            # a planning snapshot in the same unit of work needs them next.
            # Both statements go in one flight (one round trip on PostgreSQL).
            if nodes:
                runs, rows = tx.all_of(
                    [head, ("frontier_of_nodes", {"run_id": run_id, "nodes": json.dumps(nodes)})]
                )
                return (runs[0] if runs else None), rows
            return tx.one(*head), []
