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
    "StoreReadOnlyError",
    "StoreRejectedError",
    "StoreUnavailableError",
]


class StoreUnavailableError(DagwerkError, RuntimeError):
    """The database cannot serve the request; nothing was written.

    ``transient`` says whether the fault can clear without the user (a
    server restarting, a lock released); False means it stays until the
    user acts (a refused login, a schema newer than this dagwerk).
    """

    code = "store_unavailable"
    transient = True


class StoreRejectedError(StoreUnavailableError):
    """The database server refuses this client for good: the login, the
    database name or an option of the store URL."""

    code = "store_rejected"
    transient = False

    def __init__(
        self,
        message: str,
        *,
        target: str | None = None,
        code: str | None = None,
        field: str | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(message, code=code, field=field, limit=limit)
        self.target = target
        """The database file's path or the server, where the backend knows it."""


class StoreBusyError(StoreUnavailableError):
    """The database stayed locked by other writers past the busy timeout."""

    code = "store_busy"


class StoreCorruptError(StoreUnavailableError):
    """The file is not a dagwerk database, or it is damaged."""

    code = "store_corrupt"


class StoreCannotOpenError(StoreUnavailableError):
    """The database cannot be opened at all: access to the file or its
    directory is denied, or the directory does not exist."""

    code = "store_cannot_open"


class StoreReadOnlyError(StoreUnavailableError):
    """The database (or its directory) cannot be written."""

    code = "store_readonly"


class StoreFullError(StoreUnavailableError):
    """The disk, or the database's page limit, is full."""

    code = "store_full"


class SchemaTooNewError(StoreUnavailableError):
    """The database was written by a newer dagwerk; this version refuses it."""

    code = "schema_too_new"
    transient = False
