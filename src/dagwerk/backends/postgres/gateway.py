"""The PostgreSQL gateway: named queries, pipelined transactions, errors.

This module, :mod:`~dagwerk.backends.postgres._pool` and
:mod:`~dagwerk.backends.postgres.errors` are the only places that talk to
:mod:`psycopg`. Write transactions run at READ COMMITTED and take the row
locks their lock preludes name (see ``queries.sql``); read transactions are
REPEATABLE READ READ ONLY snapshots. Statements are pipelined, so a
transaction costs one round trip per statement whose result it needs plus
one for a write's ``COMMIT`` (see :class:`_Tx`).

A connection lost before the server acknowledged anything of a transaction
is replaced and the transaction begun again; a connection lost inside a
read is replaced and the read replayed on a fresh snapshot (accepted only
if every statement replayed returns what it returned before); a connection
lost inside a write surfaces as
:class:`~dagwerk.backends.errors.StoreUnavailableError`, because the body
of a write cannot be run twice.
"""

from __future__ import annotations

import itertools
import logging
import os
import selectors
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any, cast

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from dagwerk.backends.errors import StoreCannotOpenError, StoreUnavailableError
from dagwerk.backends.sql.gateway import Gateway, Params, Row, load_queries
from dagwerk.errors import DagwerkError
from dagwerk.store import StoreContractError

from ._pool import Conn, Connections, Parked, enter_pipeline, leave_pipeline, send_sync
from ._set_writes import SET_WRITES_PATH, SetWrite, load_set_writes
from ._statements import RUN_LOCK_MODES, Statement, parse_block
from .errors import (
    check_params,
    is_connection_error,
    lost_connection_error,
    translate_error,
)

__all__ = [
    "NOTIFY_CHANNEL",
    "QUERIES",
    "QUERIES_PATH",
    "RUNS_CHANNEL",
    "SET_WRITES",
    "PostgresGateway",
    "PostgresTx",
    "Statement",
    "parse_block",
]

NOTIFY_CHANNEL = "dagwerk_work"
RUNS_CHANNEL = "dagwerk_runs"

QUERIES_PATH = Path(__file__).with_name("queries.sql")

_LOG = logging.getLogger("dagwerk.backends.postgres")

_BEGIN_WRITE = b"BEGIN ISOLATION LEVEL READ COMMITTED"
_BEGIN_READ = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

_EXCLUSIVE = RUN_LOCK_MODES["UPDATE"]


QUERIES: dict[str, Statement] = {
    name: parse_block(name, sql) for name, sql in load_queries(QUERIES_PATH).items()
}

SET_WRITES: dict[str, SetWrite] = load_set_writes(SET_WRITES_PATH, QUERIES)
"""The set forms of blocks that :meth:`_Tx.many` runs (``set_writes.sql``)."""


class _Tx:
    """One transaction on a pooled connection, its statements pipelined.

    Nothing is sent when the transaction opens. Its ``BEGIN`` travels in the
    flight of its first statement, a block's lock preludes in the flight of
    the block, and a write's ``COMMIT`` in a flight of its own; a flight is
    one round trip (the statements go out back to back in pipeline mode and
    one Sync collects their results). :meth:`send` and :meth:`many` do not
    wait: their results, and errors, come with the next flight, at the
    latest the ``COMMIT``'s, so a failed statement still fails the
    transaction with its own typed error before anything commits. A read
    sends its ``COMMIT`` without waiting (see :meth:`commit`).

    A connection lost before the server acknowledged anything of the
    transaction is replaced and the flight sent again: no ``COMMIT`` was
    sent, so nothing of it can have committed. A read records each
    statement and its result, so that after a connection lost later it can
    replay them on a new snapshot.
    """

    __slots__ = (
        "_bare",
        "_begun",
        "_committed",
        "_conn",
        "_deadline",
        "_deferred",
        "_gateway",
        "_held",
        "_journal",
        "_pipeline",
        "_reading",
        "_run_lock",
        "_sent",
        "_settling",
        "_write",
    )

    def __init__(
        self,
        gateway: PostgresGateway,
        conn: Conn | Parked,
        *,
        write: bool,
        held: bool = False,
        bare: bool = False,
    ) -> None:
        self._gateway = gateway
        self._write = write
        # A read of one statement without BEGIN and COMMIT (read_one): the
        # server runs it in a transaction of its own, one snapshot.
        self._bare = bare
        # A unit's transaction (PostgresGateway.unit): its first locking
        # block holds the run exclusively, the *_committing calls leave the
        # COMMIT to the unit's end, and while _reading a joined read's
        # blocks run without their lock preludes.
        self._held = held
        self._reading = False
        self._journal: list[tuple[str, str, Params | None, object]] = []
        self._deadline = time.monotonic() + gateway.reconnect_timeout
        # _sent: BEGIN has gone out; _begun: the server acknowledged it and
        # everything sent with it. _deferred: blocks sent since the last
        # flight, whose results are still due.
        self._sent = False
        self._begun = False
        # The COMMIT went out with the last statement (all_committing).
        self._committed = False
        self._deferred: list[str] = []
        # The run-row lock mode the transaction's first locking block took.
        self._run_lock = 0
        self._pipeline: psycopg.Pipeline | None = None
        # The COMMIT of the read that parked this connection; the first
        # flight collects its acknowledgement.
        self._settling: psycopg.Cursor[dict[str, Any]] | None = None
        self._conn = self._adopt(conn)

    def _adopt(self, conn: Conn | Parked) -> Conn:
        if isinstance(conn, Parked):
            self._pipeline, self._settling = conn.pipeline, conn.commit
            return conn.conn
        return conn

    # -- pipeline mode ----------------------------------------------------------------

    def _pipelined(self) -> Conn:
        if self._pipeline is None:
            self._pipeline = enter_pipeline(self._conn)
        return self._conn

    def _unpipe(self) -> None:
        """Leave pipeline mode: one Sync collects every result still due and
        raises the first error among them."""
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            leave_pipeline(self._conn, pipeline)

    def _drop_pipe(self) -> None:
        with suppress(psycopg.Error):
            self._unpipe()

    # -- flights ----------------------------------------------------------------------

    def _send_begin(self) -> Conn:
        """The connection in pipeline mode, ``BEGIN`` queued if not sent yet."""
        conn = self._pipelined()
        if not self._sent:
            if not self._bare:
                begin = _BEGIN_WRITE if self._write else _BEGIN_READ
                conn.execute(begin, prepare=False)
            self._sent = True
        return conn

    def _send(self, name: str, params: Params | None) -> psycopg.Cursor[dict[str, Any]]:
        """Queue ``BEGIN`` (the first time), the block's lock preludes (in a
        write) and its main statement; the main statement's cursor."""
        statement = QUERIES[name]
        values = params or {}
        check_params(name, values, statement.json_params)
        conn = self._send_begin()
        if self._write and not self._reading:
            preludes = statement.preludes
            if statement.run_lock:
                if self._held and not self._run_lock:
                    preludes = statement.exclusive_preludes
                    self._run_lock = _EXCLUSIVE
                else:
                    self._check_run_lock(name, statement.run_lock)
            for prelude in preludes:
                conn.execute(prelude, values)
        return conn.execute(statement.main, values)

    def _check_run_lock(self, name: str, mode: int) -> None:
        """A transaction keeps the run-lock mode of its first locking block:
        a stronger one later would wait for the run's sharers (claims,
        completions), which may be waiting for this transaction's rows."""
        if not self._run_lock:
            self._run_lock = mode
        elif mode > self._run_lock:
            raise AssertionError(
                f"query {name!r} would upgrade the transaction's run lock "
                f"(mode {self._run_lock} to {mode}; see queries.sql, Locking)"
            )

    def _sync(self) -> None:
        """Wait for every result sent so far: one round trip."""
        pipeline = self._pipeline
        assert pipeline is not None
        pipeline.sync()
        self._begun = True
        self._settling = None
        self._deferred.clear()

    def _flight(
        self, kind: str, name: str, params: Params | None, rows: list[Params] | None = None
    ) -> Any:
        """Send one block; wait for its result unless ``kind`` is ``send``,
        ``many`` or ``rows`` (a block's set form, see :meth:`many`), which
        wait only as the transaction's first flight (so that a connection
        lost there still means that nothing of it ran)."""
        if kind in ("send", "many", "rows"):
            if kind == "many":
                with self._send_begin().cursor() as cursor:
                    cursor.executemany(QUERIES[name].main, rows or [])
            elif kind == "rows":
                statement = SET_WRITES[name].statement
                self._send_begin().execute(statement.main, params)
            else:
                self._send(name, params)
            self._deferred.append(name)
            if not self._begun:
                self._sync()
            return None
        if kind == "begin":
            self._send_begin()
            self._sync()
            return None
        if kind in ("all_commit", "all_of_commit"):
            queries = (
                cast("list[tuple[str, Params]]", rows)
                if kind == "all_of_commit"
                else [(name, params)]
            )
            cursors = [self._send(query, values) for query, values in queries]
            self._send_begin().execute(b"COMMIT", prepare=False)
            self._committed = True
            # Leaving pipeline mode is the flight's one Sync (a Sync and then
            # leaving would cost a second round trip).
            self._unpipe()
            self._begun = True
            self._settling = None
            self._deferred.clear()
            found = [each.fetchall() for each in cursors]
            return found if kind == "all_of_commit" else found[0]
        if kind == "all_of":
            queries = cast("list[tuple[str, Params]]", rows)
            cursors = [self._send(query, values) for query, values in queries]
            self._sync()
            results = [each.fetchall() for each in cursors]
            if not self._write:
                self._journal.extend(
                    ("all", query, values, found)
                    for (query, values), found in zip(queries, results, strict=True)
                )
            return results
        cursor = self._send(name, params)
        self._sync()
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

    def _attempt(
        self, kind: str, name: str, params: Params | None, rows: list[Params] | None = None
    ) -> Any:
        """:meth:`_flight`, sent again on another connection while the server
        has acknowledged nothing of this transaction and the connection is
        lost, or the ``COMMIT`` of the read that parked it failed (the
        connection is thrown away with whatever the flight began on it,
        which had not committed)."""
        while True:
            fresh = not self._begun
            settling = self._settling
            try:
                return self._flight(kind, name, params, rows)
            except psycopg.Error as exc:
                stale = settling is not None and settling.pgresult is None
                if (
                    not fresh
                    or self._committed
                    or not (stale or is_connection_error(exc, self._conn))
                    or time.monotonic() >= self._deadline
                ):
                    raise
                self._replace_connection()

    def _replace_connection(self) -> None:
        self._drop_pipe()
        self._settling = None
        self._sent = self._begun = False
        self._deferred.clear()
        connections = self._gateway.connections
        connections.discard(self._conn)
        self._conn = self._adopt(connections.acquire(self._deadline))

    def _context(self, name: str | None) -> str:
        names = list(dict.fromkeys([*self._deferred, *([name] if name else [])]))
        if not names:
            return "commit failed"
        return "query " + " or ".join(repr(n) for n in names) + " failed"

    def error(self, exc: psycopg.Error, context: str) -> DagwerkError:
        """The typed error of ``exc``: a lost connection names the server and
        what became of the transaction."""
        if not is_connection_error(exc, self._conn):
            return translate_error(exc, context)
        if self._committed:
            fate = "the write may or may not have been applied"
        elif self._write:
            fate = "the transaction was rolled back: nothing of it was applied"
        else:
            fate = "retry the call"
        return lost_connection_error(exc, self._gateway.connections.where, fate)

    def _call(
        self, kind: str, name: str, params: Params | None, rows: list[Params] | None = None
    ) -> Any:
        try:
            return self._attempt(kind, name, params, rows)
        except psycopg.Error as exc:
            if self._write or not is_connection_error(exc, self._conn):
                raise self.error(exc, self._context(name)) from exc
            cause = exc
        # A read lost its connection after its snapshot began: replay what it
        # has seen on a new snapshot, and go on only if nothing changed.
        journal, self._journal = self._journal, []
        self._deadline = time.monotonic() + self._gateway.reconnect_timeout
        self._replace_connection()
        try:
            for kind_seen, name_seen, params_seen, result in journal:
                if self._attempt(kind_seen, name_seen, params_seen) != result:
                    raise StoreUnavailableError(
                        "the connection was lost during a read and the data changed before it "
                        "could be repeated; retry the call"
                    ) from cause
            return self._attempt(kind, name, params, rows)
        except psycopg.Error as again:
            raise self.error(again, f"query {name!r} failed after a lost connection") from again

    # -- the Tx protocol ------------------------------------------------------------------

    def one(self, name: str, params: Params | None = None) -> Row | None:
        row: Row | None = self._call("one", name, params)
        return row

    def all(self, name: str, params: Params | None = None) -> list[Row]:
        rows: list[Row] = self._call("all", name, params)
        return rows

    def all_of(self, queries: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """Several reads (each with its lock preludes) in one flight."""
        listed = list(queries)
        if not listed:
            return []
        names = " and ".join(dict.fromkeys(name for name, _ in listed))
        found: list[list[Row]] = self._call("all_of", names, None, cast("list[Params]", listed))
        return found

    def run(self, name: str, params: Params | None = None) -> int:
        count: int = self._call("run", name, params)
        return count

    def all_committing(self, name: str, params: Params | None = None) -> list[Row]:
        """Every row of a write's last block, sent with the transaction's
        ``COMMIT`` in one flight: the rows come back once the ``COMMIT`` is
        acknowledged, and nothing may follow on the transaction. A failed
        block commits nothing (the server skips the ``COMMIT`` after it). A
        connection lost during the flight is not replaced, since the
        ``COMMIT`` may have been applied: :class:`StoreUnavailableError`."""
        if not self._write or self._committed:
            raise AssertionError("all_committing is the last call of a write")
        rows: list[Row] = self._call("all" if self._held else "all_commit", name, params)
        return rows

    def all_of_committing(self, queries: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """Several reads as a write's last blocks, in the flight of its
        ``COMMIT`` (as :meth:`all_committing`)."""
        if not self._write or self._committed:
            raise AssertionError("all_of_committing is the last call of a write")
        listed = list(queries)
        names = " and ".join(dict.fromkeys(name for name, _ in listed))
        found: list[list[Row]] = self._call(
            "all_of" if self._held else "all_of_commit", names, None, cast("list[Params]", listed)
        )
        return found

    def joined(self, *, reading: bool) -> None:
        """The unit's transaction enters a call of the unit: a read
        (``reading``, its blocks' lock preludes skipped) or a write."""
        self._reading = reading

    def send(self, name: str, params: Params | None = None) -> None:
        """Execute a block (with its lock preludes) whose row count the caller
        does not need, without waiting: it travels with the next flight, and
        an error it raises is raised by that flight's call (at the latest the
        commit) with the same type, before anything commits."""
        self._call("send", name, params)

    def many(self, name: str, rows: Iterable[Params]) -> None:
        """Execute a statement once per parameter set, in order, without
        waiting (as :meth:`send`).

        A block with a set form (``set_writes.sql``) sends all the rows in
        one statement when that does the same as one statement per row (see
        :meth:`SetWrite.segments`); every row is checked the same way either way.
        """
        statement = QUERIES[name]
        if statement.preludes:
            raise ValueError(f"query {name!r} has a lock prelude; run it with run()")
        checked = [_checked(statement, row) for row in rows]
        if not checked:
            return
        variant = SET_WRITES.get(name)
        segments = None if variant is None else variant.segments(checked)
        if segments is None:
            self._call("many", name, None, checked)
            return
        for segment in segments:
            if isinstance(segment, str):
                self._call("rows", name, {"rows": segment})
            else:
                self._call("many", name, None, segment)

    # -- ending ---------------------------------------------------------------------------

    def plain(self) -> Conn:
        """The connection out of pipeline mode, inside this transaction (for a
        multi-statement script, which pipeline mode cannot carry)."""
        try:
            if not self._begun:
                self._attempt("begin", "", None)
            self._unpipe()
        except psycopg.Error as exc:
            raise self.error(exc, self._context(None)) from exc
        return self._conn

    def commit(self) -> None:
        """Commit and give the connection back.

        A write waits for the server's acknowledgement of its ``COMMIT``. A
        read has nothing to make durable: it sends its ``COMMIT`` and a Sync
        (the server ends the snapshot and goes idle when they arrive) and
        parks the connection, and the next transaction on it collects the
        acknowledgement in its first flight. The read waits instead when the
        connection cannot be parked (a thread waits for one) or the bytes
        could not be handed to the socket at once.
        """
        conn = self._conn
        connections = self._gateway.connections
        if not self._sent:
            self._drop_pipe()
            connections.release(conn)
            return
        if self._committed:
            # all_committing's flight carried the COMMIT and its acknowledgement.
            connections.release(conn)
            return
        try:
            if self._bare:
                # The statement's flight collected everything: nothing to end.
                pipeline = self._pipeline
                if pipeline is not None and connections.park(Parked(conn, pipeline, None)):
                    self._pipeline = None
                    return
                self._unpipe()
                connections.release(conn)
                return
            self._pipelined()
            commit = conn.execute(b"COMMIT", prepare=False)
            pipeline = self._pipeline
            if (
                not self._write
                and not self._deferred
                and pipeline is not None
                and send_sync(conn, pipeline)
                and connections.park(Parked(conn, pipeline, commit))
            ):
                self._pipeline = None
                return
            self._unpipe()
        except psycopg.Error as exc:
            lost = is_connection_error(exc, conn)
            context = self._context(None)
            self._drop_pipe()
            connections.release_after_error(conn)
            if not self._write and lost:
                # Every statement of the read has returned from its snapshot;
                # its results stand without the acknowledgement.
                return
            if lost:
                self._committed = True  # the COMMIT went out
            raise self.error(exc, context) from exc
        connections.release(conn)

    def abort(self) -> None:
        """Roll back (if anything was sent) and give the connection back."""
        conn = self._conn
        if self._sent and self._pipeline is not None and not (conn.closed or conn.broken):
            # Ride the flight that collects the pending results; if an error
            # aborted the pipeline the server skips it, and the plain
            # ROLLBACK of release_after_error runs instead.
            with suppress(psycopg.Error):
                conn.execute(b"ROLLBACK", prepare=False)
        self._drop_pipe()
        self._gateway.connections.release_after_error(conn)


def _checked(statement: Statement, row: Params) -> Params:
    check_params(statement.name, row, statement.json_params)
    return row


PostgresTx = _Tx
"""The transaction ``PostgresGateway.write()`` and ``read()`` open."""


class PostgresGateway(Gateway):
    """A connection pool per process; each transaction borrows one connection.

    ``schema`` (validated by the caller) becomes each connection's
    ``search_path``. After ``fork`` the child builds its own pool: a
    connection must not cross processes, and the parent's pool is left alone.
    ``reconnect_timeout`` bounds how long a transaction waits for a
    connection (while the server restarts, say) before
    :class:`StoreUnavailableError`; ``open_timeout`` (default: the same)
    bounds the wait for the first connection, made here. ``application_name``
    labels the connections in ``pg_stat_activity``.
    """

    pipelines_writes = True
    """``send`` and ``many`` return before the server has run the statement
    (it runs while the caller prepares the next one); an error comes back at
    the next wait, at the latest the commit."""

    def __init__(
        self,
        url: str,
        *,
        schema: str | None,
        pool_size: int = 4,
        reconnect_timeout: float = 30.0,
        open_timeout: float | None = None,
        application_name: str = "dagwerk",
    ) -> None:
        self.url = url
        self.application_name = application_name
        self.schema = schema
        self.pool_size = pool_size
        self.reconnect_timeout = reconnect_timeout
        self.connections = Connections(
            url,
            self.connect_kwargs(),
            size=pool_size,
            reconnect_timeout=reconnect_timeout,
            open_timeout=open_timeout,
        )
        # Notifications carry the schema of the queue that changed.
        self.notify_payload: str | None = schema
        self._work = _Listener(self, NOTIFY_CHANNEL)
        self._runs = _Listener(self, RUNS_CHANNEL)
        self._units = threading.local()
        self._serials = itertools.count(1)

    # -- connections ------------------------------------------------------------------

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of every connection this gateway opens."""
        # Statements are prepared on their first use (psycopg's default is
        # the sixth): a young connection then parses each statement once and
        # the server's plan cache takes over (five plans for the values, then
        # one generic plan if it is no worse).
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "row_factory": dict_row,
            "application_name": self.application_name,
            "prepare_threshold": 0,
        }
        if self.schema is not None:
            # After the URL's own options (kept), so that it wins over a
            # search_path among them.
            given = str(conninfo_to_dict(self.url).get("options") or "")
            kwargs["options"] = f"{given} -c search_path={self.schema}".strip()
        return kwargs

    def connect(self, deadline: float | None = None) -> Conn:
        """A new connection outside the pool (for LISTEN); the caller closes it.
        A server that refuses or does not answer is tried again until
        ``deadline`` (``time.monotonic()``; default: the reconnect timeout
        from now), as the pool does."""
        if deadline is None:
            deadline = time.monotonic() + self.reconnect_timeout
        return self.connections.connect(deadline)

    # -- transactions -------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, write: bool, bare: bool = False) -> Iterator[_Tx]:
        unit = self._unit_now()
        if unit is not None and (write or unit.tx is not None):
            yield from self._joined(unit, write=write)
            return
        deadline = time.monotonic() + self.reconnect_timeout
        tx = _Tx(self, self.connections.acquire(deadline), write=write, bare=bare)
        try:
            yield tx
        except BaseException:
            tx.abort()
            raise
        tx.commit()

    # -- units of work --------------------------------------------------------------------

    def _unit_now(self) -> _Unit | None:
        unit: _Unit | None = getattr(self._units, "unit", None)
        return unit

    def _joined(self, unit: _Unit, *, write: bool) -> Iterator[_Tx]:
        if unit.doomed is not None:
            raise _doomed_error(unit.doomed)
        tx = unit.tx
        if tx is None:
            deadline = time.monotonic() + self.reconnect_timeout
            tx = unit.tx = _Tx(self, self.connections.acquire(deadline), write=True, held=True)
        tx.joined(reading=not write)
        try:
            yield tx
        except BaseException as exc:
            # A failed statement aborts the server's transaction: the unit
            # can only roll back.
            unit.doomed = exc
            raise
        finally:
            tx.joined(reading=False)
            if write:
                unit.writes += 1

    @contextmanager
    def unit(self) -> Iterator[None]:
        """One write transaction for every transaction this thread opens on
        the gateway inside the block (:class:`~dagwerk.store_run_units.RunUnitStore`).

        The transaction begins at the block's first write; a read before it
        is a snapshot of its own, every later read runs in the unit's
        transaction (READ COMMITTED, without lock preludes) and sees its
        writes. The first block that locks a run locks it exclusively (its
        ``exclusive_preludes``), so no later block of the unit needs a
        stronger lock than the one it holds. The unit is all or nothing: a
        call that raises dooms it (PostgreSQL aborts a transaction at its
        first error), every later call raises, and the block rolls back at
        its end, raising even if the caller swallowed the first error. The
        block commits when it ends; the actions of :meth:`after_commit` run
        after that commit. An inner block joins the outer one.
        """
        if self._unit_now() is not None:
            yield
            return
        unit = _Unit(next(self._serials))
        self._units.unit = unit
        try:
            try:
                yield
            except BaseException:
                if unit.tx is not None:
                    unit.tx.abort()
                raise
            if unit.doomed is not None:
                if unit.tx is not None:
                    unit.tx.abort()
                raise _doomed_error(unit.doomed) from unit.doomed
            if unit.tx is not None:
                unit.tx.commit()
        finally:
            self._units.unit = None
        for action in unit.after:
            try:
                action()
            except Exception:  # the commit stands: never report it failed
                _LOG.exception("an action after a unit of work's commit failed")

    def after_commit(self, action: Callable[[], object]) -> bool:
        """Inside the calling thread's unit of work, once its transaction
        has begun: run ``action`` after the unit commits (never if it rolls
        back) and answer True. Elsewhere False."""
        unit = self._unit_now()
        if unit is None or unit.tx is None:
            return False
        unit.after.append(action)
        return True

    def write_mark(self) -> tuple[int, int] | None:
        """Inside the calling thread's unit of work, once its transaction
        has begun: a mark that a later call returns again only while no
        write of the unit has ended in between. The unit holds its run
        exclusively from its first statement, so what it read of that run
        in between is still what the database holds (a unit is for the calls
        of one run: the store's shortcuts keyed on the mark take reads of
        the unit's run only). ``None`` elsewhere."""
        unit = self._unit_now()
        if unit is None or unit.tx is None:
            return None
        return unit.serial, unit.writes

    def unit_serial(self) -> int | None:
        """Inside the calling thread's unit of work: a number no other unit
        of this gateway has had. ``None`` elsewhere."""
        unit = self._unit_now()
        return None if unit is None else unit.serial

    def undoes_a_failed_write(self) -> bool:
        """False inside a unit of work whose transaction has begun (a write
        that raises there dooms the unit)."""
        unit = self._unit_now()
        return unit is None or unit.tx is None

    def write(self) -> AbstractContextManager[_Tx]:
        """A READ COMMITTED transaction whose lock preludes run."""
        return self._transaction(write=True)

    def read(self) -> AbstractContextManager[_Tx]:
        """A REPEATABLE READ READ ONLY snapshot; lock preludes are skipped."""
        return self._transaction(write=False)

    def read_one(self, name: str, params: Params | None = None) -> Row | None:
        """The first row of one query, read without ``BEGIN`` and ``COMMIT``
        (two statements fewer): the server runs a lone statement in a
        transaction of its own, on one snapshot. Inside the calling thread's
        unit of work, once that has begun, the query runs in the unit's
        transaction and sees its writes."""
        with self._transaction(write=False, bare=True) as tx:
            return tx.one(name, params)

    def script(self, conn_tx: _Tx, sql: str) -> None:
        """Run a multi-statement script (a migration) inside ``conn_tx``."""
        try:
            conn = conn_tx.plain()
            conn.execute(sql.encode("utf-8"), prepare=False)
        except psycopg.Error as exc:
            raise conn_tx.error(exc, "migration failed") from exc

    # -- waking idle workers and waiting clients --------------------------------------

    def wait_for_work(self, timeout: float, since: int | None = None) -> bool:
        """Block until a queue row of this schema may have become available, at
        most ``timeout`` seconds; True if woken by a notification. ``since``
        (the SQLite gateway's commit epoch) is not needed here: notifications
        queue up on the listening connection, so none is missed between a
        caller's empty dequeue and its wait.

        New unleased queue rows and released leases notify
        (``LISTEN/NOTIFY``); a row inserted already leased and an expired
        lease do not, so callers still dequeue after a timeout. The
        first call starts listening and returns True at once, since work
        enqueued before it was announced to no one here. Notifications that
        arrive between calls wait on the connection, so none is lost while
        the caller works. One thread waits at a time; the others just sleep
        out their timeout on the lock.
        """
        del since
        return self._work.wait(timeout)

    def wait_for_run_end(self, timeout: float) -> bool:
        """Block until a run of this schema may have ended (its status became
        terminal), at most ``timeout`` seconds; True if woken by a
        notification. As :meth:`wait_for_work`, on channel
        :data:`RUNS_CHANNEL` and its own connection, opened by the first call
        (which returns True at once)."""
        return self._runs.wait(timeout)

    def close(self) -> None:
        self._work.close()
        self._runs.close()
        self.connections.close()


class _Unit:
    """The state of one thread's unit of work (``PostgresGateway.unit``)."""

    __slots__ = ("after", "doomed", "serial", "tx", "writes")

    def __init__(self, serial: int) -> None:
        self.serial = serial
        self.writes = 0  # writes of the unit ended so far (write_mark)
        self.tx: _Tx | None = None
        self.after: list[Callable[[], object]] = []
        self.doomed: BaseException | None = None


def _doomed_error(cause: BaseException) -> DagwerkError:
    """What a doomed unit raises: a lost server stays a
    :class:`StoreUnavailableError` (the worker waits it out), anything else
    is a :class:`StoreContractError`."""
    text = (
        "a call failed inside a unit of work, which therefore rolls back: "
        f"{type(cause).__name__}: {cause}"
    )
    if isinstance(cause, StoreUnavailableError):
        return StoreUnavailableError(text)
    return StoreContractError(text)


class _Listener:
    """One connection that LISTENs on ``channel`` for this gateway's schema,
    opened by the first wait of this process and kept."""

    def __init__(self, gateway: PostgresGateway, channel: str) -> None:
        if channel not in (NOTIFY_CHANNEL, RUNS_CHANNEL):
            raise ValueError(f"unknown channel {channel!r}")  # it becomes SQL text
        self._gateway = gateway
        self._channel = channel
        self._conn: Conn | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def wait(self, timeout: float) -> bool:
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            return False
        try:
            return self._wait_locked(timeout)
        finally:
            self._lock.release()

    def _wait_locked(self, timeout: float) -> bool:
        listener = self._conn
        if listener is None or listener.closed or self._pid != os.getpid():
            self._conn = None
            try:
                listener = self._gateway.connect(time.monotonic() + max(0.0, timeout))
            except StoreCannotOpenError:
                raise
            except StoreUnavailableError:
                # The server stayed out of reach for the whole wait: say
                # "maybe", so the caller looks (and its own call reports
                # the fault).
                return True
            try:
                listener.execute(f"LISTEN {self._channel}")
            except psycopg.Error as exc:
                with suppress(psycopg.Error):
                    listener.close()
                raise translate_error(exc, f"cannot listen on {self._channel}") from exc
            self._conn, self._pid = listener, os.getpid()
            return True
        deadline = time.monotonic() + max(0.0, timeout)
        payload = self._gateway.notify_payload
        try:
            while True:
                # What has arrived, without waiting.
                for notify in listener.notifies(timeout=0.0):
                    if notify.payload == payload:
                        return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                # The wait itself is the kernel's. psycopg's timed wait polls
                # in whole milliseconds and spins through the last one: ~1 ms
                # of CPU per timed-out wait, which an idle worker repeats at
                # every poll interval.
                _readable(listener.fileno(), remaining)
        except psycopg.Error as exc:
            # A lost listener is reopened by the next call; meanwhile say
            # "maybe", so the caller looks instead of sleeping.
            self._close()
            if is_connection_error(exc, listener):
                return True
            raise translate_error(exc, f"waiting on {self._channel} failed") from exc

    def _close(self) -> None:
        listener, self._conn = self._conn, None
        if listener is not None and self._pid == os.getpid():
            with suppress(psycopg.Error):
                listener.close()

    def close(self) -> None:
        with self._lock:
            self._close()


def _readable(fd: int, timeout: float) -> None:
    """Block until ``fd`` is readable or ``timeout`` seconds have passed (the
    platform's selector; epoll rounds the timeout up to a whole millisecond,
    never down)."""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        selector.select(timeout)
