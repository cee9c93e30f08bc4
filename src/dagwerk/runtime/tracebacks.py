"""What the store keeps of the exception a plugin raised: its formatted
traceback, with the attempt's resolved secrets masked (as its log lines are)
and bounded to :data:`~dagwerk.store_tracebacks.MAX_ATTEMPT_TRACEBACK_BYTES`
(the end is kept: the exception itself and the frames that raised it)."""

from __future__ import annotations

import traceback as _traceback
from collections.abc import Iterable

from dagwerk.runtime.task_logs import mask_secrets
from dagwerk.store_tracebacks import MAX_ATTEMPT_TRACEBACK_BYTES

__all__ = ["attempt_traceback", "bound_traceback", "format_traceback"]

_MARKER = "[... {dropped} bytes of this traceback were dropped: {limit} bytes at most are kept]\n"
_MARKER_ROOM = len(_MARKER) + 40
"""Bytes kept free for the marker (its two numbers included)."""


def format_traceback(error: BaseException) -> str | None:
    """``error``'s traceback as Python prints it (with its causes and
    notes); ``None`` when it was never raised (it has no traceback)."""
    if error.__traceback__ is None:
        return None
    return "".join(_traceback.format_exception(error)).rstrip("\n")


def bound_traceback(text: str, limit: int = MAX_ATTEMPT_TRACEBACK_BYTES) -> str:
    """``text`` if it is within ``limit`` bytes (UTF-8); otherwise its last
    lines within the bound after one line that says how much was dropped."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    tail = data[len(data) - (limit - _MARKER_ROOM) :].decode("utf-8", "ignore")
    newline = tail.find("\n")
    if 0 <= newline < len(tail) - 1:
        tail = tail[newline + 1 :]  # from a whole line
    dropped = len(data) - len(tail.encode("utf-8", "replace"))
    return _MARKER.format(dropped=dropped, limit=limit) + tail


def attempt_traceback(
    error: BaseException | None, secrets: Iterable[str], *, remote: str | None = None
) -> str | None:
    """The traceback to store for an attempt that failed with ``error``:
    ``remote`` (the text a plugin process formatted) or ``error``'s own,
    secrets masked and bounded; ``None`` without either."""
    text = remote if remote is not None else None if error is None else format_traceback(error)
    if text is None:
        return None
    ordered = sorted({s for s in secrets if s}, key=len, reverse=True)
    return bound_traceback(mask_secrets(text, ordered))
