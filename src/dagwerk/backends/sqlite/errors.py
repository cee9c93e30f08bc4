"""SQLite's errors as dagwerk's, and the faults of the database file itself.

:func:`translate_error` maps a driver error to the typed errors of
:mod:`dagwerk.backends.errors` by SQLite's result code; :func:`open_refusal`
says why a file could not be opened (a missing directory, permission
denied); :func:`gone_reason` says whether the file a connection has open is
still the one at its path (a removed or replaced file takes writes that
reach no one).
"""

from __future__ import annotations

import os
import sqlite3

from dagwerk.backends.errors import (
    StoreBusyError,
    StoreCannotOpenError,
    StoreCorruptError,
    StoreFullError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from dagwerk.errors import DagwerkError
from dagwerk.store import StoreContractError

__all__ = [
    "CANTOPEN",
    "PLACE_CHECK_SECONDS",
    "file_identity",
    "gone_reason",
    "open_refusal",
    "translate_error",
]

# Primary result codes (the low byte of the extended code).
_BUSY, _LOCKED, _READONLY, _CORRUPT, _FULL, _NOTADB = 5, 6, 8, 11, 13, 26
CANTOPEN = 14
"""SQLite's primary result code for a file it cannot open."""


def translate_error(exc: sqlite3.Error, context: str, target: str | None = None) -> DagwerkError:
    """The dagwerk error for a driver error (the driver error becomes its
    cause); ``target`` is the database file's path."""
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    text = f"{context}: {exc}"
    if isinstance(exc, sqlite3.IntegrityError):
        return StoreContractError(f"{context}: constraint violated: {exc}")
    if code in (_BUSY, _LOCKED) or "locked" in str(exc):
        return StoreBusyError(text, target=target)
    if code == _READONLY or "readonly" in str(exc):
        return StoreReadOnlyError(text, target=target)
    if code == _FULL or "full" in str(exc):
        return StoreFullError(text, target=target)
    if code in (_CORRUPT, _NOTADB) or "not a database" in str(exc):
        return StoreCorruptError(text, target=target)
    return StoreUnavailableError(text, target=target)


def open_refusal(path: str, exc: sqlite3.Error) -> DagwerkError:
    """The error for a file SQLite could not open: permission denied, or a
    directory that does not exist, is :class:`StoreCannotOpenError`."""
    directory = os.path.dirname(os.path.abspath(path))
    reason: str | None = None
    if not os.path.isdir(directory):
        reason = f"its directory {directory} does not exist"
    else:
        try:
            os.close(os.open(path if os.path.exists(path) else directory, os.O_RDONLY))
        except PermissionError:
            where = path if os.path.exists(path) else directory
            mode = os.stat(where).st_mode & 0o777
            reason = f"permission denied on {where} (mode {mode:04o})"
        except OSError:
            reason = None
    if reason is None:
        return translate_error(exc, f"cannot open {path!r}", path)
    return StoreCannotOpenError(f"cannot open {path!r}: {reason}", target=path)


PLACE_CHECK_SECONDS = 1.0
"""How often (at most) a gateway compares its open file with the file at its path."""


def file_identity(path: str) -> tuple[int, int] | None:
    """The device and inode of the file at ``path``; ``None`` if unknown."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def gone_reason(path: str, identity: tuple[int, int]) -> str | None:
    """Why the file at ``path`` is no longer the one with ``identity`` (the
    file the connection has open), or ``None`` while it still is."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            return f"the database {path} was removed with its directory {directory}"
        return f"the database file {path} was removed"
    except OSError:
        return None  # cannot tell (a directory made unreadable): the writes say
    if (found.st_dev, found.st_ino) != identity:
        return f"the database file {path} was replaced by another file"
    return None
