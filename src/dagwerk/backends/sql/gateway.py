"""Named SQL blocks and the transaction hooks a SQL backend provides.

A ``.sql`` file holds one block per operation, each introduced by a line
``-- name: operation_name``; text up to the next such line belongs to the
block. The shared store logic refers to operations by name only, so each
database keeps its own spelling of the same operations.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Gateway", "Row", "Tx", "load_queries"]

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def load_queries(path: Path) -> dict[str, str]:
    """The named blocks of ``path``; a duplicate or empty block is an error."""
    text = path.read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        sql = body.strip()
        if name in queries:
            raise ValueError(f"{path.name}: query {name!r} is defined twice")
        if not sql:
            raise ValueError(f"{path.name}: query {name!r} is empty")
        queries[name] = sql
    return queries


class Row(Protocol):
    """A result row addressed by column name (``sqlite3.Row``, a dict row, ...)."""

    def __getitem__(self, key: str, /) -> Any: ...  # column values are driver-typed


Params = Mapping[str, object]


class Tx(Protocol):
    """One open transaction; every statement is addressed by its block name."""

    def one(self, name: str, params: Params | None = None) -> Row | None:
        """The first row of the query, or ``None``."""
        ...

    def all(self, name: str, params: Params | None = None) -> list[Row]:
        """Every row of the query."""
        ...

    def all_of(self, queries: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """Every row of each query, run in order (in one round trip where the
        backend can send them together)."""
        ...

    def run(self, name: str, params: Params | None = None) -> int:
        """Execute a statement; the number of rows it changed."""
        ...

    def all_committing(self, name: str, params: Params | None = None) -> list[Row]:
        """Every row of a write's last statement, committed with it (in the
        same round trip where the backend can); nothing may follow it."""
        ...

    def many(self, name: str, rows: Iterable[Params]) -> None:
        """Execute a statement once per parameter set."""
        ...


class Gateway(Protocol):
    """The hooks a SQL backend provides to :class:`~dagwerk.backends.sql.SqlStore`.

    ``write()`` opens a transaction that holds the database's write lock from
    its first statement (SQLite ``BEGIN IMMEDIATE``; PostgreSQL a serialising
    lock), commits on success and rolls back on any exception; ``read()``
    opens a consistent read-only snapshot. Both translate driver errors into
    :mod:`dagwerk.backends.errors`.
    """

    def write(self) -> AbstractContextManager[Tx]: ...

    def read(self) -> AbstractContextManager[Tx]: ...


def iter_names(queries: Mapping[str, str]) -> Iterator[str]:
    """Block names in file order (used by the tests that compare SQL files)."""
    yield from queries
