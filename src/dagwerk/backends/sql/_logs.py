"""Task logs and trace contexts in the SQL store (see
:class:`~dagwerk.store.TaskLogStore` and :class:`~dagwerk.store.RunTraceStore`)."""

from __future__ import annotations

from collections.abc import Sequence

from dagwerk.store_logs import (
    TaskLogLine,
    TaskLogQuery,
    check_task_log_lines,
    check_task_log_query,
    check_traceparent,
)

from ._base import SqlStoreBase


class LogsMixin(SqlStoreBase):
    def append_task_logs(self, lines: Sequence[TaskLogLine]) -> None:
        check_task_log_lines(lines)
        if not lines:
            return
        rows = [
            {
                "run_id": line.run_id,
                "task_id": line.task_id,
                "node_index": line.node_index,
                "attempt": line.attempt,
                "at": float(line.at),
                "level": line.level,
                "logger": line.logger,
                "message": line.message,
                "traceback": line.traceback,
            }
            for line in lines
        ]
        with self._gw.write() as tx:
            tx.many("task_log_insert", rows)

    def read_task_logs(self, query: TaskLogQuery) -> list[TaskLogLine]:
        check_task_log_query(query)
        with self._gw.read() as tx:
            rows = tx.all(
                "task_logs_read",
                {
                    "run_id": query.run_id,
                    "after": query.after_line_id,
                    "task_id": query.task_id,
                    "node_index": query.node_index,
                    "attempt": query.attempt,
                    "limit": query.limit,
                },
            )
        return [
            TaskLogLine(
                run_id=row["run_id"],
                task_id=row["task_id"],
                node_index=int(row["node_index"]),
                attempt=int(row["attempt"]),
                at=float(row["at"]),
                level=row["level"],
                logger=row["logger"],
                message=row["message"],
                traceback=row["traceback"],
                line_id=int(row["line_id"]),
            )
            for row in rows
        ]

    def set_run_traceparent(self, run_id: str, traceparent: str) -> bool:
        check_traceparent(traceparent)
        with self._gw.write() as tx:
            changed = tx.run("run_set_traceparent", {"run_id": run_id, "traceparent": traceparent})
        return changed == 1

    def get_run_traceparent(self, run_id: str) -> str | None:
        with self._gw.read() as tx:
            row = tx.one("run_traceparent", {"run_id": run_id})
        return None if row is None else row["traceparent"]
