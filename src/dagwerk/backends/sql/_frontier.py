"""The run frontier of the SQL store (``RunFrontierStore``)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from dagwerk.constants import NodeDisposition, RunStatus
from dagwerk.store import LaunchProgress, RunFrontier

from ._base import FreshFrontier, SqlStoreBase


class FrontierMixin(SqlStoreBase):
    def get_run_frontier(
        self, run_id: str, node_indices: Sequence[int], *, count_complete: bool = False
    ) -> RunFrontier | None:
        nodes = sorted({index for index in node_indices if type(index) is int})
        head = ("run_frontier", {"run_id": run_id, "count": 1 if count_complete else 0})
        with self._gw.read() as tx:
            # The nodes' generations and revisions come along (one statement):
            # a planning snapshot in the same unit of work needs them next.
            # Both statements go in one flight (one round trip on PostgreSQL).
            if nodes:
                runs, rows = tx.all_of(
                    [head, ("frontier_of_nodes", {"run_id": run_id, "nodes": json.dumps(nodes)})]
                )
                run = runs[0] if runs else None
            else:
                run, rows = tx.one(*head), []
            if run is None:
                return None
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
