"""The tracebacks of failed attempts in the store.

A worker formats the exception a plugin raised (bounded to
:data:`MAX_ATTEMPT_TRACEBACK_BYTES`, resolved secrets masked, see
:mod:`dagwerk.runtime.tracebacks`) and stores it through
:class:`AttemptTracebackStore` before the attempt's failure commits; each
:class:`~dagwerk.store.AttemptRecord` of ``list_attempts`` carries it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from dagwerk.errors import DagwerkError

__all__ = [
    "MAX_ATTEMPT_TRACEBACK_BYTES",
    "AttemptTracebackError",
    "AttemptTracebackStore",
    "check_attempt_traceback",
]

MAX_ATTEMPT_TRACEBACK_BYTES = 64 * 1024
"""The most bytes (UTF-8) of one attempt's stored traceback."""


class AttemptTracebackError(DagwerkError, ValueError):
    """A traceback request is malformed; ``field`` names the part at fault."""

    code = "attempt_traceback_invalid"


def check_attempt_traceback(task_id: object, attempt_id: object, traceback: object) -> str:
    """``traceback`` if the request is well-formed and the text is within
    :data:`MAX_ATTEMPT_TRACEBACK_BYTES`; :class:`AttemptTracebackError`
    otherwise. Every backend calls it before writing."""
    for name, value in (("task_id", task_id), ("attempt_id", attempt_id)):
        if not isinstance(value, str) or not value:
            raise AttemptTracebackError(f"{name} must be a non-empty string", field=name)
    if not isinstance(traceback, str):
        raise AttemptTracebackError("traceback must be a string", field="traceback")
    if len(traceback.encode("utf-8", "replace")) > MAX_ATTEMPT_TRACEBACK_BYTES:
        raise AttemptTracebackError(
            f"traceback must be at most {MAX_ATTEMPT_TRACEBACK_BYTES} bytes (UTF-8)",
            field="traceback",
            limit=MAX_ATTEMPT_TRACEBACK_BYTES,
        )
    return traceback


@runtime_checkable
class AttemptTracebackStore(Protocol):
    """Stored tracebacks of failed attempts (dagwerk extension). Without it
    a failed attempt keeps its error text only (``AttemptRecord.traceback``
    is ``None``)."""

    def record_attempt_traceback(self, task_id: str, attempt_id: str, traceback: str) -> bool:
        """Store ``traceback`` with the attempt ``attempt_id`` in one
        transaction, while it is the task's current attempt and RUNNING;
        whether it was stored. Any other attempt (stale, settled, unknown,
        or of an unknown task) is left as it is (``False``); an attempt keeps
        the first traceback stored for it (a repeat is ``False``). A
        malformed request or a text over :data:`MAX_ATTEMPT_TRACEBACK_BYTES`
        raises :class:`AttemptTracebackError` and stores nothing."""
        ...
