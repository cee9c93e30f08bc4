"""Waiting for a database to change, instead of polling it blindly.

``Engine.wait`` reads a run's status until it is terminal. Between reads it
sleeps its poll interval (50 ms), so a run that ended just after a read is
seen up to that much later: a quarter of a fast fan-out's wall time as a
client sees it. A store that can tell when another connection may have
committed (:class:`ChangeWaitStore`) lets the waiter read again right then.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["ChangeWaitStore"]


@runtime_checkable
class ChangeWaitStore(Protocol):
    """Waits that end when the database may have changed (dagwerk extension;
    SQLite files). Without it a waiter sleeps its whole poll interval."""

    def wait_for_change(self, timeout: float) -> None:
        """Block until a commit (of another connection, or one of this
        process that wakes waiting workers) may have changed the database,
        at most ``timeout`` seconds. A hint: the caller reads again and
        decides; it may return early without a change."""
        ...
