"""The read-only views of the dashboard (``RunViewStore``) over named queries."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from dagwerk.constants import NodeDisposition, RunStatus, TaskStatus
from dagwerk.json import JsonValue, ReadOnlyDict
from dagwerk.models import ResolvedOutput
from dagwerk.store import TaskRecord
from dagwerk.store_views import (
    NodeTaskStats,
    RunCursor,
    RunPage,
    RunQuery,
    TaskQuery,
    TaskWait,
    check_run_ids,
    check_since,
)

from ._base import SqlStoreBase, loads_value
from ._launches import resolved_output
from ._runs import run_record
from ._tasks import task_record
from .gateway import Row


class ViewsMixin(SqlStoreBase):
    def list_runs_page(self, query: RunQuery) -> RunPage:
        after = query.after
        params = {
            "status": None if query.status is None else query.status.value,
            "pipeline": query.pipeline,
            "since": query.created_after,
            "until": query.created_before,
            "cursor_at": None if after is None else after.created_at,
            "cursor_id": None if after is None else after.run_id,
            # One more than asked: whether a next page exists.
            "limit": query.limit + 1,
        }
        with self._gw.read() as tx:
            rows = tx.all("views_runs_page", params)
        runs = tuple(run_record(row) for row in rows[: query.limit])
        more = len(rows) > query.limit
        cursor = RunCursor(runs[-1].created_at, runs[-1].run_id) if more and runs else None
        return RunPage(runs, cursor)

    def run_status_counts_since(self, since: float) -> Mapping[RunStatus, int]:
        start = check_since(since)
        with self._gw.read() as tx:
            rows = tx.all("views_run_status_counts", {"since": start})
        return ReadOnlyDict({RunStatus(row["status"]): int(row["n"]) for row in rows})

    def run_task_counts(self, run_ids: Sequence[str]) -> Mapping[str, Mapping[TaskStatus, int]]:
        wanted = check_run_ids(run_ids)
        if not wanted:
            return {}
        with self._gw.read() as tx:
            rows = tx.all("views_run_task_counts", {"run_ids": json.dumps(list(wanted))})
            known = {run_id for run_id in wanted if tx.one("views_run_exists", {"run_id": run_id})}
        found: dict[str, dict[TaskStatus, int]] = {run_id: {} for run_id in known}
        for row in rows:
            found.setdefault(row["run_id"], {})[TaskStatus(row["status"])] = int(row["n"])
        return {run_id: ReadOnlyDict(counts) for run_id, counts in found.items()}

    def node_task_stats(self, run_id: str) -> list[NodeTaskStats] | None:
        with self._gw.read() as tx:
            if tx.one("views_run_exists", {"run_id": run_id}) is None:
                return None
            launches = tx.all("views_node_launches", {"run_id": run_id})
            rows = tx.all("views_node_task_stats", {"run_id": run_id})
        by_node: dict[int, list[Row]] = {}
        for row in rows:
            by_node.setdefault(int(row["node_index"]), []).append(row)
        stats: list[NodeTaskStats] = []
        for launch in sorted(launches, key=lambda row: int(row["node_index"])):
            index = int(launch["node_index"])
            group = by_node.get(index, [])
            started = [r["first_started_at"] for r in group if r["first_started_at"] is not None]
            finished = [r["last_finished_at"] for r in group if r["last_finished_at"] is not None]
            disposition = NodeDisposition(launch["disposition"])
            stats.append(
                NodeTaskStats(
                    node_index=index,
                    disposition=disposition,
                    complete=disposition is not NodeDisposition.LAUNCHED
                    or int(launch["completed"]) == int(launch["task_count"]),
                    error=launch["error"] or None,
                    counts=ReadOnlyDict({TaskStatus(r["status"]): int(r["n"]) for r in group}),
                    attempts=sum(int(r["attempts"]) for r in group),
                    first_started_at=float(min(started)) if started else None,
                    last_finished_at=float(max(finished)) if finished else None,
                )
            )
        return stats

    def list_tasks_page(self, run_id: str, query: TaskQuery) -> list[TaskRecord]:
        with self._gw.read() as tx:
            after_seq = -1
            if query.after is not None:
                after = tx.one("views_task_seq", {"task_id": query.after})
                if after is None or after["run_id"] != run_id:
                    return []
                after_seq = int(after["seq"])
            params = {
                "run_id": run_id,
                "node_index": query.node_index,
                "status": None if query.status is None else query.status.value,
                "after_seq": after_seq,
                "limit": query.limit,
            }
            if query.node_index is None:
                rows = tx.all("views_tasks_page", params)
            else:  # by the node's active launch: an index range however big the run
                rows = tx.all("views_node_tasks_page", params)
            return [task_record(row) for row in rows]

    def list_task_waits(self, task_id: str) -> list[TaskWait]:
        with self._gw.read() as tx:
            rows = tx.all("views_task_waits", {"task_id": task_id})
        ordered = sorted(rows, key=lambda row: (row["waited_at"] or 0.0, row["wait_id"]))
        return [
            TaskWait(
                wait_id=row["wait_id"],
                state=row["state"],
                attempt_id=row["attempt_id"],
                waited_at=row["waited_at"],
                resumed_attempt_id=row["resumed_attempt_id"],
                response=None if row["response"] is None else loads_value(row["response"]),
            )
            for row in ordered
        ]

    def list_task_outputs(self, task_id: str) -> list[ResolvedOutput]:
        with self._gw.read() as tx:
            task = tx.one("views_task_seq", {"task_id": task_id})
            if task is None:
                return []
            rows = tx.all(
                "views_task_outputs",
                {"run_id": task["run_id"], "node_index": task["node_index"], "prefix": task_id},
            )
        return [resolved_output(row["output_id"], row["fields"], row["data"]) for row in rows]

    def get_run_input(self, run_id: str) -> JsonValue | None:
        with self._gw.read() as tx:
            row = tx.one("views_run_exists", {"run_id": run_id})
        return None if row is None else loads_value(row["run_input"])
