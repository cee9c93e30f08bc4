"""Named SQL blocks and the transaction hooks a SQL backend provides.

A ``.sql`` file holds one block per operation, each introduced by a line
``-- name: operation_name``; text up to the next such line belongs to the
block. The shared store logic refers to operations by name only, so each
database keeps its own spelling of the same operations.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Gateway", "Row", "Tx", "load_queries"]

_POLL_SECONDS = 0.05
"""How long :meth:`Gateway.wait_for_work` sleeps without notifications."""

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

    def all_of_committing(self, queries: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """Every row of each of a write's last queries, run in order and
        committed with them (in one round trip where the backend can);
        nothing may follow them."""
        ...

    def many(self, name: str, rows: Iterable[Params]) -> None:
        """Execute a statement once per parameter set."""
        ...

    def many_of(self, calls: Sequence[tuple[str, Iterable[Params]]]) -> None:
        """:meth:`many` of each call, in order, for calls that write
        different tables and read nothing another of them writes: a backend
        may send them as one statement, in which they see the same data."""
        ...


class Gateway(Protocol):
    """The hooks a SQL backend provides to :class:`~dagwerk.backends.sql.SqlStore`.

    ``write()`` opens a transaction that holds the database's write lock from
    its first statement (SQLite ``BEGIN IMMEDIATE``; PostgreSQL a serialising
    lock), commits on success and rolls back on any exception; ``read()``
    opens a consistent read-only snapshot. Both translate driver errors into
    :mod:`dagwerk.backends.errors`.

    Every other member has a default that fits a backend without units of
    work or wake-ups; a gateway subclasses this protocol to inherit the
    defaults and overrides the hooks its database does better.
    """

    serialises_writers: bool = False
    """One database-wide write lock: a transaction never waits on row locks, so
    a batch of several runs' transitions cannot deadlock (see sql/_batch.py)."""

    pipelines_writes: bool = False
    """``send`` and ``many`` return before the server has run the statement
    (an error comes back at the next wait, at the latest the commit)."""

    def write(self) -> AbstractContextManager[Tx]: ...

    def read(self) -> AbstractContextManager[Tx]: ...

    def read_one(self, name: str, params: Params | None = None) -> Row | None:
        """The first row of one query in a read transaction of its own."""
        with self.read() as tx:
            return tx.one(name, params)

    def after_commit(self, action: Callable[[], object]) -> bool:
        """Inside the calling thread's unit of work, once its transaction has
        begun: run ``action`` after the unit commits (never if it rolls back)
        and answer True. Elsewhere False: the caller's writes have committed.
        Without units of work: always False."""
        return False

    def write_mark(self) -> Hashable | None:
        """Inside the calling thread's unit of work, once its write
        transaction has begun: a mark that a later call returns again only
        while no write of the unit has ended in between. ``None`` elsewhere
        (always, without units of work)."""
        return None

    def unit_serial(self) -> int | None:
        """Inside the calling thread's unit of work: a number no other unit of
        this gateway has had. ``None`` elsewhere (always, without units of work)."""
        return None

    def undoes_a_failed_write(self) -> bool:
        """Whether a write of the calling thread that raises now would be
        undone alone (True without all-or-nothing units of work)."""
        return True

    def work_epoch(self) -> int | None:
        """A count of waking commits to pass to :meth:`wait_for_work`;
        ``None`` where the wait needs none."""
        return None

    def wait_for_work(self, timeout: float, since: int | None = None) -> bool | None:
        """Block until queue work may have become available (after epoch
        ``since``), at most ``timeout`` seconds; True if a notification woke
        it, where the backend can tell. Without notifications: a short poll
        interval (at most 50 ms)."""
        del since
        time.sleep(min(max(timeout, 0.0), _POLL_SECONDS))
        return None
