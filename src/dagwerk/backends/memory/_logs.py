"""Task logs and trace contexts of the in-memory store (the reference for
:class:`~dagwerk.store.TaskLogStore` and :class:`~dagwerk.store.RunTraceStore`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from dagwerk.store_logs import (
    TaskLogLine,
    TaskLogQuery,
    check_task_log_lines,
    check_task_log_query,
    check_traceparent,
)

from ._base import MemoryStoreBase


class LogsMixin(MemoryStoreBase):
    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        # Per run, its lines in stored order; line IDs count across runs.
        self._task_logs: dict[str, list[TaskLogLine]] = {}
        self._task_log_ids = 0
        self._traceparents: dict[str, str] = {}

    def append_task_logs(self, lines: Sequence[TaskLogLine]) -> None:
        check_task_log_lines(lines)
        with self._lock:
            for line in lines:
                self._task_log_ids += 1
                stored = dataclasses.replace(line, at=float(line.at), line_id=self._task_log_ids)
                self._task_logs.setdefault(line.run_id, []).append(stored)

    def read_task_logs(self, query: TaskLogQuery) -> list[TaskLogLine]:
        check_task_log_query(query)
        found: list[TaskLogLine] = []
        with self._lock:
            for line in self._task_logs.get(query.run_id, ()):
                if (
                    line.line_id <= query.after_line_id
                    or (query.task_id is not None and line.task_id != query.task_id)
                    or (query.node_index is not None and line.node_index != query.node_index)
                    or (query.attempt is not None and line.attempt != query.attempt)
                ):
                    continue
                found.append(line)
                if len(found) >= query.limit:
                    break
        return found

    def set_run_traceparent(self, run_id: str, traceparent: str) -> bool:
        check_traceparent(traceparent)
        with self._lock:
            if run_id not in self._runs or run_id in self._traceparents:
                return False
            self._traceparents[run_id] = traceparent
            return True

    def get_run_traceparent(self, run_id: str) -> str | None:
        with self._lock:
            return self._traceparents.get(run_id)
