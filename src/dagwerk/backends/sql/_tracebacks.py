"""Tracebacks of failed attempts in the SQL stores
(:class:`~dagwerk.store_tracebacks.AttemptTracebackStore`), in
``dagwerk_attempt_tracebacks``."""

from __future__ import annotations

from dagwerk.store_tracebacks import check_attempt_traceback

from ._base import SqlStoreBase


class TracebacksMixin(SqlStoreBase):
    def record_attempt_traceback(self, task_id: str, attempt_id: str, traceback: str) -> bool:
        text = check_attempt_traceback(task_id, attempt_id, traceback)
        with self._gw.write() as tx:
            params = {"task_id": task_id, "attempt_id": attempt_id, "traceback": text}
            return tx.run("attempt_traceback_insert", params) == 1
