"""The safe alphabet of names a user chooses: run IDs and schedule names.

Such names end up in file names, URLs, log keys and shell commands, so they
are restricted to letters, digits and ``-_.:``, must not start with a dot,
and are at most :data:`MAX_IDENTIFIER_LENGTH` characters long.
"""

from __future__ import annotations

import re
from typing import Final

from dagwerk.errors import DagwerkError

__all__ = ["MAX_IDENTIFIER_LENGTH", "InvalidIdentifierError", "check_identifier"]

MAX_IDENTIFIER_LENGTH: Final = 200
_SAFE: Final = re.compile(r"[A-Za-z0-9_.:-]+")


class InvalidIdentifierError(DagwerkError, ValueError):
    """A user-chosen name (``field``) is empty, too long, or outside the
    safe alphabet."""

    code = "identifier_invalid"


def check_identifier(value: object, *, field: str) -> str:
    """``value`` if it is a safe identifier, else :class:`InvalidIdentifierError`
    naming ``field`` (and the length limit when that is what it crosses)."""
    if not isinstance(value, str):
        raise InvalidIdentifierError(
            f"{field} must be a string, not {type(value).__name__}", field=field
        )
    if not value:
        raise InvalidIdentifierError(f"{field} must not be empty", field=field)
    if len(value) > MAX_IDENTIFIER_LENGTH:
        raise InvalidIdentifierError(
            f"{field} is {len(value)} characters; the maximum is {MAX_IDENTIFIER_LENGTH}",
            field=field,
            limit=MAX_IDENTIFIER_LENGTH,
        )
    if _SAFE.fullmatch(value) is None:
        bad = next(char for char in value if _SAFE.fullmatch(char) is None)
        raise InvalidIdentifierError(
            f"{field} {value!r} contains {bad!r}; use letters, digits and - _ . : only",
            field=field,
        )
    if value.startswith("."):
        raise InvalidIdentifierError(f"{field} {value!r} must not start with a dot", field=field)
    return value
