"""Task logs and trace contexts in the store.

A worker captures what a plugin logs during an attempt (see
:mod:`dagwerk.runtime.task_logs`) and writes the lines in batches through
:class:`TaskLogStore`; ``dagwerk logs`` and ``Engine.logs`` read them back.
Lines are stored in the run's database, keyed by run, so deleting a run's
logs is one ``DELETE ... WHERE run_id = ?`` on an indexed column.
:class:`RunTraceStore` keeps the W3C trace context of the code that
submitted a run, so the spans of every worker join its trace (see
:mod:`dagwerk.tracing`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dagwerk.errors import DagwerkError

__all__ = [
    "DEFAULT_TASK_LOG_MAX_BYTES",
    "DEFAULT_TASK_LOG_MAX_LINES",
    "MAX_TASK_LOG_BATCH",
    "MAX_TASK_LOG_READ",
    "RunTraceStore",
    "TaskLogError",
    "TaskLogLine",
    "TaskLogQuery",
    "TaskLogStore",
    "check_task_log_lines",
    "check_task_log_query",
    "check_traceparent",
]

DEFAULT_TASK_LOG_MAX_BYTES = 1 << 20
"""A worker keeps at most this many bytes of each attempt's log (1 MiB)."""

DEFAULT_TASK_LOG_MAX_LINES = 10_000
"""A worker keeps at most this many lines of each attempt's log."""

MAX_TASK_LOG_READ = 10_000
"""The most lines one :meth:`TaskLogStore.read_task_logs` call returns."""

MAX_TASK_LOG_BATCH = 50_000
"""The most lines one :meth:`TaskLogStore.append_task_logs` call writes."""


class TaskLogError(DagwerkError, ValueError):
    """A task log request is malformed; ``field`` names the part at fault."""

    code = "task_log_invalid"


@dataclass(frozen=True, slots=True)
class TaskLogLine:
    """One captured line of an attempt.

    ``at`` is the epoch time the line was logged; ``level`` the level's name
    (``INFO``, ``ERROR``, ...; a line the plugin printed is ``INFO`` on
    stdout and ``WARNING`` on stderr); ``logger`` the logger's name
    (``stdout``/``stderr`` for printed lines); ``traceback`` the formatted
    exception (or stack) logged with it. ``attempt`` is the task's 1-based
    attempt number. ``line_id`` is the store's position of the line: 0 on
    a line not yet stored, increasing in the order lines were stored.
    """

    run_id: str
    task_id: str
    node_index: int
    attempt: int
    at: float
    level: str
    logger: str
    message: str
    traceback: str | None = None
    line_id: int = 0


@dataclass(frozen=True, slots=True)
class TaskLogQuery:
    """Which lines of a run :meth:`TaskLogStore.read_task_logs` returns:
    those after ``after_line_id`` (0: from the first), of ``task_id``,
    ``node_index`` and ``attempt`` where given, at most ``limit`` of them,
    in stored order."""

    run_id: str
    task_id: str | None = None
    node_index: int | None = None
    attempt: int | None = None
    after_line_id: int = 0
    limit: int = MAX_TASK_LOG_READ


def _positive_int(value: object, name: str, *, minimum: int) -> None:
    if type(value) is not int or value < minimum:
        raise TaskLogError(f"{name} must be an int >= {minimum}", field=name)


def check_task_log_query(query: TaskLogQuery) -> TaskLogQuery:
    """``query`` if every field is well-formed; :class:`TaskLogError` otherwise.
    Every backend calls it before reading."""
    if not isinstance(query.run_id, str) or not query.run_id:
        raise TaskLogError("run_id must be a non-empty string", field="run_id")
    if query.task_id is not None and (not isinstance(query.task_id, str) or not query.task_id):
        raise TaskLogError("task_id must be a non-empty string", field="task_id")
    if query.node_index is not None:
        _positive_int(query.node_index, "node_index", minimum=0)
    if query.attempt is not None:
        _positive_int(query.attempt, "attempt", minimum=1)
    _positive_int(query.after_line_id, "after_line_id", minimum=0)
    _positive_int(query.limit, "limit", minimum=1)
    if query.limit > MAX_TASK_LOG_READ:
        raise TaskLogError(
            f"limit must be at most {MAX_TASK_LOG_READ}", field="limit", limit=MAX_TASK_LOG_READ
        )
    return query


def check_task_log_lines(lines: Sequence[TaskLogLine]) -> Sequence[TaskLogLine]:
    """``lines`` if the batch is within :data:`MAX_TASK_LOG_BATCH` and each
    line is well-formed; :class:`TaskLogError` otherwise (nothing is written).
    Every backend calls it before writing."""
    if len(lines) > MAX_TASK_LOG_BATCH:
        raise TaskLogError(
            f"at most {MAX_TASK_LOG_BATCH} lines per batch",
            field="lines",
            limit=MAX_TASK_LOG_BATCH,
        )
    for line in lines:
        if not isinstance(line, TaskLogLine):
            raise TaskLogError("each line must be a TaskLogLine", field="lines")
        for name in ("run_id", "task_id", "level", "logger"):
            value = getattr(line, name)
            if not isinstance(value, str) or not value:
                raise TaskLogError(f"{name} must be a non-empty string", field=name)
        if not isinstance(line.message, str):
            raise TaskLogError("message must be a string", field="message")
        if line.traceback is not None and not isinstance(line.traceback, str):
            raise TaskLogError("traceback must be a string or None", field="traceback")
        _positive_int(line.node_index, "node_index", minimum=0)
        _positive_int(line.attempt, "attempt", minimum=1)
        if not isinstance(line.at, int | float) or isinstance(line.at, bool):
            raise TaskLogError("at must be a number", field="at")
    return lines


@runtime_checkable
class TaskLogStore(Protocol):
    """Stored task log lines (dagwerk extension). Without it a worker
    captures nothing and ``Engine.logs`` raises ``UnsupportedOperationError``."""

    def append_task_logs(self, lines: Sequence[TaskLogLine]) -> None:
        """Store ``lines`` (their ``line_id`` is ignored) in one transaction,
        in the order given, after every line stored before. Lines are only
        ever added: an exact repeat stores them again. A malformed batch
        raises :class:`TaskLogError` and stores nothing. Lines of a run that
        does not exist are stored all the same (a run's lines are deleted
        with the run)."""
        ...

    def read_task_logs(self, query: TaskLogQuery) -> list[TaskLogLine]:
        """The lines ``query`` selects, in stored order, each with its
        ``line_id``; an empty list when there are none (or no such run).
        Read-only. A malformed query raises :class:`TaskLogError`."""
        ...


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def check_traceparent(traceparent: object) -> str:
    """``traceparent`` if it is a W3C ``traceparent`` header value
    (``00-<32 hex>-<16 hex>-<2 hex>``); :class:`TaskLogError` otherwise."""
    if not isinstance(traceparent, str) or not _TRACEPARENT.match(traceparent):
        raise TaskLogError(
            "traceparent must be a W3C traceparent (00-<trace id>-<span id>-<flags>)",
            field="traceparent",
        )
    return traceparent


@runtime_checkable
class RunTraceStore(Protocol):
    """The submitter's trace context of each run (dagwerk extension).
    Without it, each worker's spans start traces of their own."""

    def set_run_traceparent(self, run_id: str, traceparent: str) -> bool:
        """Store ``traceparent`` with the run in one transaction; whether it
        was stored. A run that does not exist, or has one already, is left
        as it is (``False``; an exact repeat too). A malformed value raises
        :class:`TaskLogError`."""
        ...

    def get_run_traceparent(self, run_id: str) -> str | None:
        """The run's stored trace context; ``None`` without one (or without
        the run). Read-only."""
        ...
