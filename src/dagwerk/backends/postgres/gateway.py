"""The PostgreSQL gateway: a connection pool, named queries, transactions, errors.

This module and :mod:`~dagwerk.backends.postgres.errors` are the only places
that talk to :mod:`psycopg`. Write transactions run at READ COMMITTED and take
the row locks their lock preludes name (see ``queries.sql``); read
transactions are REPEATABLE READ READ ONLY snapshots. A connection found dead
when a transaction begins is replaced and the transaction begun again; a
connection lost inside a read is replaced and the read replayed on a fresh
snapshot (accepted only if every statement replayed returns what it returned
before); a connection lost inside a write surfaces as
:class:`~dagwerk.backends.errors.StoreUnavailableError`, because the body of
a write cannot be run twice.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import psycopg_pool
from psycopg.rows import dict_row

from dagwerk.backends.errors import StoreUnavailableError
from dagwerk.backends.sql.gateway import Params, Row, load_queries

from .errors import check_params, is_connection_error, translate_error

__all__ = [
    "NOTIFY_CHANNEL",
    "QUERIES",
    "QUERIES_PATH",
    "PostgresGateway",
    "Statement",
    "parse_block",
]

NOTIFY_CHANNEL = "dagwerk_work"

QUERIES_PATH = Path(__file__).with_name("queries.sql")

# ":name" outside "::" casts (the query files spell casts CAST(x AS t)).
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_STATEMENT_END = re.compile(r";[ \t]*$", re.MULTILINE)
_JSON_PARAM = re.compile(r"CAST\(:([A-Za-z_]\w*) AS jsonb\)")

_BEGIN_WRITE = b"BEGIN ISOLATION LEVEL READ COMMITTED"
_BEGIN_READ = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

Conn = psycopg.Connection[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Statement:
    """One named block: its lock preludes and its main statement (psycopg style)."""

    name: str
    preludes: tuple[bytes, ...]
    main: bytes
    json_params: frozenset[str]
    """Parameters cast to ``jsonb`` (JSON lists the statement expands)."""


def _psycopg_style(sql: str) -> bytes:
    return _PARAM.sub(r"%(\1)s", sql.replace("%", "%%")).encode("utf-8")


def parse_block(name: str, sql: str) -> Statement:
    """Split a block at statement ends: every statement before the last is a
    lock prelude (run in write transactions only)."""
    code = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    parts = [part.strip() for part in _STATEMENT_END.split(code)]
    parts = [part for part in parts if part]
    if not parts:
        raise ValueError(f"query {name!r} has no statement")
    *preludes, main = parts
    return Statement(
        name,
        tuple(_psycopg_style(p) for p in preludes),
        _psycopg_style(main),
        frozenset(_JSON_PARAM.findall(code)),
    )


QUERIES: dict[str, Statement] = {
    name: parse_block(name, sql) for name, sql in load_queries(QUERIES_PATH).items()
}


class _Tx:
    """One open transaction on a pooled connection.

    A read transaction records each statement and its result, so that after a
    lost connection the gateway can replay them on a new snapshot.
    """

    __slots__ = ("_conn", "_gateway", "_journal", "_write")

    def __init__(self, gateway: PostgresGateway, conn: Conn, *, write: bool) -> None:
        self._gateway = gateway
        self._conn = conn
        self._write = write
        self._journal: list[tuple[str, str, Params | None, object]] = []

    def _cursor(self, name: str, params: Params | None) -> psycopg.Cursor[dict[str, Any]]:
        statement = QUERIES[name]
        values = params or {}
        check_params(name, values, statement.json_params)
        cursor = self._conn.cursor()
        if self._write:
            for prelude in statement.preludes:
                cursor.execute(prelude, values)
        cursor.execute(statement.main, values)
        return cursor

    def _call(self, kind: str, name: str, params: Params | None) -> Any:
        try:
            return self._dispatch(kind, name, params)
        except psycopg.Error as exc:
            if self._write or not is_connection_error(exc, self._conn):
                raise translate_error(exc, f"query {name!r} failed") from exc
            self._conn = self._gateway.reopen_read(self._conn, self._journal, exc)
            try:
                return self._dispatch(kind, name, params)
            except psycopg.Error as again:
                raise translate_error(again, f"query {name!r} failed") from again

    def _dispatch(self, kind: str, name: str, params: Params | None) -> Any:
        cursor = self._cursor(name, params)
        result: object
        if kind == "one":
            result = cursor.fetchone()
        elif kind == "all":
            result = cursor.fetchall()
        else:
            result = cursor.rowcount
        if not self._write:
            self._journal.append((kind, name, params, result))
        return result

    def replay(self, journal: list[tuple[str, str, Params | None, object]]) -> bool:
        """Run ``journal`` again on this (fresh) transaction; True iff every
        statement returns what it returned before."""
        for kind, name, params, result in journal:
            if self._dispatch(kind, name, params) != result:
                return False
        return True

    def one(self, name: str, params: Params | None = None) -> Row | None:
        row: Row | None = self._call("one", name, params)
        return row

    def all(self, name: str, params: Params | None = None) -> list[Row]:
        rows: list[Row] = self._call("all", name, params)
        return rows

    def run(self, name: str, params: Params | None = None) -> int:
        count: int = self._call("run", name, params)
        return count

    def many(self, name: str, rows: Iterable[Params]) -> None:
        statement = QUERIES[name]
        if statement.preludes:
            raise ValueError(f"query {name!r} has a lock prelude; run it with run()")
        checked = [_checked(statement, row) for row in rows]
        if not checked:
            return
        try:
            with self._conn.cursor() as cursor:
                cursor.executemany(statement.main, checked)
        except psycopg.Error as exc:
            raise translate_error(exc, f"query {name!r} failed") from exc


def _checked(statement: Statement, row: Params) -> Params:
    check_params(statement.name, row, statement.json_params)
    return row


class PostgresGateway:
    """A connection pool per process; each transaction borrows one connection.

    ``schema`` (validated by the caller) becomes each connection's
    ``search_path``. After ``fork`` the child builds its own pool: a
    connection must not cross processes, and the parent's pool is left alone.
    ``reconnect_timeout`` bounds how long a transaction waits for a
    connection (while the server restarts, say) before
    :class:`StoreUnavailableError`. ``application_name`` labels the
    connections in ``pg_stat_activity``.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str | None,
        pool_size: int = 4,
        reconnect_timeout: float = 30.0,
        application_name: str = "dagwerk",
    ) -> None:
        self.url = url
        self.application_name = application_name
        self.schema = schema
        self.pool_size = pool_size
        self.reconnect_timeout = reconnect_timeout
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        self._pool: psycopg_pool.ConnectionPool[Conn] | None = None
        self._pool = self._open_pool()
        # Notifications carry the schema of the queue that changed.
        self.notify_payload: str | None = schema
        self._listener: Conn | None = None
        self._listener_pid = 0
        self._listener_lock = threading.Lock()

    # -- the pool ---------------------------------------------------------------------

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of every connection this gateway opens."""
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "row_factory": dict_row,
            "application_name": self.application_name,
        }
        if self.schema is not None:
            kwargs["options"] = f"-c search_path={self.schema}"
        return kwargs

    def connect(self) -> Conn:
        """A new connection outside the pool (for LISTEN); the caller closes it."""
        try:
            conn: Conn = psycopg.connect(
                self.url,
                connect_timeout=max(1, int(self.reconnect_timeout)),
                **self.connect_kwargs(),
            )
        except psycopg.Error as exc:
            raise translate_error(exc, "cannot connect") from exc
        return conn

    def _open_pool(self) -> psycopg_pool.ConnectionPool[Conn]:
        pool: psycopg_pool.ConnectionPool[Conn] = psycopg_pool.ConnectionPool(
            self.url,
            connection_class=psycopg.Connection,
            kwargs=self.connect_kwargs(),
            min_size=1,
            max_size=self.pool_size,
            timeout=self.reconnect_timeout,
            reconnect_timeout=max(self.reconnect_timeout, 1.0),
            open=False,
        )
        try:
            pool.open(wait=True, timeout=self.reconnect_timeout)
        except psycopg_pool.PoolTimeout as exc:
            pool.close()
            raise StoreUnavailableError(
                f"cannot connect to the PostgreSQL server within {self.reconnect_timeout}s"
            ) from exc
        return pool

    def _current_pool(self) -> psycopg_pool.ConnectionPool[Conn]:
        with self._lock:
            if self._closed or self._pool is None:
                raise StoreUnavailableError("the PostgreSQL store is closed")
            if os.getpid() != self._pid:
                # Forked: the parent's pool threads and sockets are not ours.
                self._pid = os.getpid()
                self._pool = self._open_pool()
            return self._pool

    def _begin(self, begin: bytes) -> Conn:
        """A pooled connection inside a fresh transaction.

        A connection found dead here has run nothing of this transaction, so
        it is dropped and another one tried until ``reconnect_timeout``.
        """
        pool = self._current_pool()
        deadline = time.monotonic() + self.reconnect_timeout
        while True:
            try:
                conn = pool.getconn(timeout=max(0.1, deadline - time.monotonic()))
            except psycopg_pool.PoolTimeout as exc:
                raise StoreUnavailableError(
                    f"no PostgreSQL connection within {self.reconnect_timeout}s: {exc}"
                ) from exc
            except psycopg_pool.PoolClosed as exc:
                raise StoreUnavailableError("the PostgreSQL store is closed") from exc
            try:
                conn.execute(begin, prepare=False)
            except psycopg.Error as exc:
                broken = is_connection_error(exc, conn)
                self._discard(pool, conn)
                if not broken or time.monotonic() >= deadline:
                    raise translate_error(exc, "cannot begin a transaction") from exc
                continue
            return conn

    @staticmethod
    def _discard(pool: psycopg_pool.ConnectionPool[Conn], conn: Conn) -> None:
        # A closed connection returned to the pool is thrown away and replaced.
        with suppress(psycopg.Error):
            conn.close()
        with suppress(psycopg_pool.PoolClosed):
            pool.putconn(conn)

    def _release(self, conn: Conn) -> None:
        pool = self._pool
        if pool is None or os.getpid() != self._pid:
            with suppress(psycopg.Error):
                conn.close()
            return
        with suppress(psycopg_pool.PoolClosed):
            pool.putconn(conn)

    def reopen_read(
        self, lost: Conn, journal: list[tuple[str, str, Params | None, object]], cause: Exception
    ) -> Conn:
        """Replace a read's lost connection with a new snapshot that agrees
        with everything the read has seen so far."""
        pool = self._current_pool()
        self._discard(pool, lost)
        conn = self._begin(_BEGIN_READ)
        try:
            agrees = _Tx(self, conn, write=False).replay(journal)
        except psycopg.Error as exc:
            self._release_after_error(conn)
            raise translate_error(exc, "cannot repeat a read after a lost connection") from exc
        if not agrees:
            self._release_after_error(conn)
            raise StoreUnavailableError(
                "the connection was lost during a read and the data changed before it "
                "could be repeated; retry the call"
            ) from cause
        return conn

    def _release_after_error(self, conn: Conn) -> None:
        with suppress(psycopg.Error):
            if not conn.closed:
                conn.execute(b"ROLLBACK", prepare=False)
        self._release(conn)

    # -- transactions -------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[_Tx]:
        conn = self._begin(_BEGIN_WRITE if write else _BEGIN_READ)
        tx = _Tx(self, conn, write=write)
        try:
            yield tx
        except BaseException:
            # A read may have moved to a new connection; roll back that one.
            self._release_after_error(tx._conn)
            raise
        conn = tx._conn
        try:
            conn.execute(b"COMMIT", prepare=False)
        except psycopg.Error as exc:
            lost = is_connection_error(exc, conn)
            self._release_after_error(conn)
            if write and lost:
                raise StoreUnavailableError(
                    "the connection was lost while committing; the write may or may not "
                    f"have been applied: {exc}"
                ) from exc
            raise translate_error(exc, "commit failed") from exc
        self._release(conn)

    def write(self) -> AbstractContextManager[_Tx]:
        """A READ COMMITTED transaction whose lock preludes run."""
        return self._transaction(write=True)

    def read(self) -> AbstractContextManager[_Tx]:
        """A REPEATABLE READ READ ONLY snapshot; lock preludes are skipped."""
        return self._transaction(write=False)

    def script(self, conn_tx: _Tx, sql: str) -> None:
        """Run a multi-statement script (a migration) inside ``conn_tx``."""
        try:
            conn_tx._conn.execute(sql.encode("utf-8"), prepare=False)
        except psycopg.Error as exc:
            raise translate_error(exc, "migration failed") from exc

    # -- waking idle workers --------------------------------------------------------------

    def wait_for_work(self, timeout: float, since: int | None = None) -> bool:
        """Block until a queue row of this schema may have become available, at
        most ``timeout`` seconds; True if woken by a notification. ``since``
        (the SQLite gateway's commit epoch) is not needed here: notifications
        queue up on the listening connection, so none is missed between a
        caller's empty dequeue and its wait.

        New queue rows and released leases notify (``LISTEN/NOTIFY``); an
        expired lease does not, so callers still dequeue after a timeout. The
        first call starts listening and returns True at once, since work
        enqueued before it was announced to no one here. Notifications that
        arrive between calls wait on the connection, so none is lost while
        the caller works. One thread waits at a time; the others just sleep
        out their timeout on the lock.
        """
        del since
        if not self._listener_lock.acquire(timeout=max(0.0, timeout)):
            return False
        try:
            return self._wait_locked(timeout)
        finally:
            self._listener_lock.release()

    def _wait_locked(self, timeout: float) -> bool:
        listener = self._listener
        if listener is None or listener.closed or self._listener_pid != os.getpid():
            self._listener = None
            listener = self.connect()
            try:
                listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
            except psycopg.Error as exc:
                with suppress(psycopg.Error):
                    listener.close()
                raise translate_error(exc, "cannot listen for work") from exc
            self._listener, self._listener_pid = listener, os.getpid()
            return True
        try:
            for notify in listener.notifies(timeout=max(0.0, timeout)):
                if notify.payload == self.notify_payload:
                    return True
        except psycopg.Error as exc:
            # A lost listener is reopened by the next call; meanwhile say
            # "maybe work", so the caller looks instead of sleeping.
            self._close_listener()
            if is_connection_error(exc, listener):
                return True
            raise translate_error(exc, "waiting for work failed") from exc
        return False

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None and self._listener_pid == os.getpid():
            with suppress(psycopg.Error):
                listener.close()

    def close(self) -> None:
        with self._listener_lock:
            self._close_listener()
        with self._lock:
            pool, self._pool = self._pool, None
            self._closed = True
        if pool is not None and os.getpid() == self._pid:
            pool.close()
