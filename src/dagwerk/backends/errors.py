"""Errors of the storage boundary: driver errors translated to stable codes.

A backend never lets a driver exception escape; it raises one of these
instead, so callers can react to ``code`` without knowing the database.
``target`` names what failed (a database file's path, a server), where the
backend knows it; :mod:`dagwerk.runtime.faults` says which codes pass by
themselves and which end a worker.
"""

from __future__ import annotations

from dagwerk.errors import DagwerkError

__all__ = [
    "SchemaTooNewError",
    "StoreBusyError",
    "StoreCannotOpenError",
    "StoreCorruptError",
    "StoreFullError",
    "StoreGoneError",
    "StoreReadOnlyError",
    "StoreUnavailableError",
]


class StoreUnavailableError(DagwerkError, RuntimeError):
    """The database cannot serve the request; nothing was written."""

    code = "store_unavailable"

    def __init__(
        self,
        message: str,
        *,
        target: str | None = None,
        advice: str | None = None,
        code: str | None = None,
        field: str | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(
            f"{message}; {advice}" if advice else message, code=code, field=field, limit=limit
        )
        self.target = target
        """The database file's path or the server, where the backend knows it."""
        self.advice = advice
        """What the user does, where the backend knows it better than its
        code does (the message ends with it)."""


class StoreBusyError(StoreUnavailableError):
    """The database stayed locked by other writers past the busy timeout."""

    code = "store_busy"


class StoreCorruptError(StoreUnavailableError):
    """The file is not a dagwerk database, or it is damaged."""

    code = "store_corrupt"


class StoreCannotOpenError(StoreUnavailableError):
    """The database cannot be opened at all: access to the file or its
    directory is denied, or the directory does not exist; or the database
    server refuses the login, has no such database or rejects the URL."""

    code = "store_cannot_open"


class StoreGoneError(StoreUnavailableError):
    """The database file this process has open was removed (or another file
    took its path): what the process writes no longer reaches the database."""

    code = "store_gone"


class StoreReadOnlyError(StoreUnavailableError):
    """The database (or its directory) cannot be written."""

    code = "store_readonly"


class StoreFullError(StoreUnavailableError):
    """The disk, or the database's page limit, is full."""

    code = "store_full"


class SchemaTooNewError(StoreUnavailableError):
    """The database was written by a newer dagwerk; this version refuses it."""

    code = "schema_too_new"
