"""Tracebacks of failed attempts in the in-memory store (the reference for
:class:`~dagwerk.store_tracebacks.AttemptTracebackStore`). Each task keeps
its attempts' tracebacks (``TaskState.tracebacks``), so they go with it."""

from __future__ import annotations

from dagwerk.constants import TaskStatus
from dagwerk.store_tracebacks import check_attempt_traceback

from ._base import MemoryStoreBase


class TracebacksMixin(MemoryStoreBase):
    def record_attempt_traceback(self, task_id: str, attempt_id: str, traceback: str) -> bool:
        text = check_attempt_traceback(task_id, attempt_id, traceback)
        with self._lock:
            task = self._tasks.get(task_id)
            if (
                task is None
                or task.attempt_id != attempt_id
                or task.status is not TaskStatus.RUNNING
                or attempt_id in task.tracebacks
            ):
                return False
            task.tracebacks[attempt_id] = text
            return True
