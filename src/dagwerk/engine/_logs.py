"""Reading a run's task logs for :meth:`Engine.logs`."""

from __future__ import annotations

from dagwerk.errors import DagwerkError
from dagwerk.store_logs import MAX_TASK_LOG_READ, TaskLogLine, TaskLogQuery, TaskLogStore

__all__ = ["read_logs"]


def read_logs(
    store: TaskLogStore,
    run_id: str,
    *,
    task_id: str | None,
    node_index: int | None,
    attempt: int | None,
    after: int,
    limit: int | None,
) -> list[TaskLogLine]:
    """Every selected line after line ``after`` (at most ``limit``), read
    :data:`~dagwerk.store.MAX_TASK_LOG_READ` lines per request."""
    if limit is not None and (type(limit) is not int or limit < 1):
        raise DagwerkError("limit must be an int >= 1", field="limit")
    lines: list[TaskLogLine] = []
    cursor = after
    while True:
        want = MAX_TASK_LOG_READ if limit is None else min(MAX_TASK_LOG_READ, limit - len(lines))
        page = store.read_task_logs(
            TaskLogQuery(
                run_id=run_id,
                task_id=task_id,
                node_index=node_index,
                attempt=attempt,
                after_line_id=cursor,
                limit=want,
            )
        )
        lines.extend(page)
        if len(page) < want or (limit is not None and len(lines) >= limit):
            return lines
        cursor = page[-1].line_id
