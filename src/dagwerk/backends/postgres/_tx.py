"""A PostgreSQL transaction on a pooled connection, its statements pipelined
(:class:`PostgresTx`), and the named queries it runs.

A transaction costs one round trip per statement whose result it needs plus
one for a write's ``COMMIT``. A connection lost before the server
acknowledged anything of a transaction is replaced and the transaction's
flight sent again; a read lost later is replayed on a fresh snapshot
(accepted only if every statement replayed returns what it returned
before); a connection lost inside a write surfaces as
:class:`~dagwerk.backends.errors.StoreUnavailableError`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, cast

import psycopg

from dagwerk.backends.errors import StoreUnavailableError
from dagwerk.backends.sql.gateway import Params, Row, load_queries
from dagwerk.errors import DagwerkError

from ._pool import Conn, Connections, Parked, enter_pipeline, leave_pipeline, send_sync
from ._set_writes import SET_WRITES_PATH, SetWrite, load_set_writes
from ._statements import RUN_LOCK_MODES, Statement, parse_block
from .errors import (
    check_params,
    is_connection_error,
    lost_connection_error,
    translate_error,
)

__all__ = ["QUERIES", "QUERIES_PATH", "SET_WRITES", "PostgresTx"]

QUERIES_PATH = Path(__file__).with_name("queries.sql")

_BEGIN_WRITE = b"BEGIN ISOLATION LEVEL READ COMMITTED"
_BEGIN_READ = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

_EXCLUSIVE = RUN_LOCK_MODES["UPDATE"]


QUERIES: dict[str, Statement] = {
    name: parse_block(name, sql) for name, sql in load_queries(QUERIES_PATH).items()
}

SET_WRITES: dict[str, SetWrite] = load_set_writes(SET_WRITES_PATH, QUERIES)
"""The set forms of blocks that :meth:`PostgresTx.many` runs (``set_writes.sql``)."""


_PARAM_REF = re.compile(rb"(?<!%)%\(([A-Za-z_]\w*)\)s")

_TOGETHER: dict[str, bytes] = {}
"""The statements :meth:`PostgresTx.many_of` sent, by the label naming their
parts (a handful of shapes: the callers' fixed sequences of writes)."""


def together(shape: Sequence[tuple[str, bool]]) -> bytes:
    """One statement that runs the writes of ``shape`` (each a block's name
    and whether it is the block's set form): a data-modifying ``WITH`` of
    all but the last, ``w0``, ``w1``, ..., whose primary statement is the
    last. Part ``k`` takes its parameters prefixed with ``wk_``.

    All parts run on one snapshot and none sees another's rows, so the
    caller names only writes of different tables that read nothing the
    others write; each part is executed once and to the end, and foreign
    keys are checked when the whole statement ends."""
    mains = [
        _PARAM_REF.sub(
            b"%%(w%d_\\1)s" % k,
            (SET_WRITES[name].statement if as_set else QUERIES[name]).main,
        )
        for k, (name, as_set) in enumerate(shape)
    ]
    *first, last = mains
    ctes = b", ".join(b"w%d AS (%s)" % (k, main) for k, main in enumerate(first))
    return b"WITH " + ctes + b" " + last


class PostgresTx:
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
        "_connections",
        "_deadline",
        "_deferred",
        "_held",
        "_journal",
        "_pipeline",
        "_reading",
        "_reconnect_timeout",
        "_run_lock",
        "_sent",
        "_settling",
        "_write",
    )

    def __init__(
        self,
        connections: Connections,
        reconnect_timeout: float,
        conn: Conn | Parked,
        *,
        write: bool,
        held: bool = False,
        bare: bool = False,
    ) -> None:
        self._connections = connections
        self._reconnect_timeout = reconnect_timeout
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
        self._deadline = time.monotonic() + reconnect_timeout
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
        ``many``, ``rows`` (a block's set form, see :meth:`many`) or
        ``together`` (several blocks' writes, see :meth:`many_of`), which
        wait only as the transaction's first flight (so that a connection
        lost there still means that nothing of it ran)."""
        if kind in ("send", "many", "rows", "together"):
            if kind == "together":
                self._send_begin().execute(_TOGETHER[name], params)
            elif kind == "many":
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
        connections = self._connections
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
        return lost_connection_error(exc, self._connections.where, fate)

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
        self._deadline = time.monotonic() + self._reconnect_timeout
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
        checked = _checked_rows(name, rows)
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

    def many_of(self, calls: Sequence[tuple[str, Iterable[Params]]]) -> None:
        """:meth:`many` of each call. When every call is one row, or one set
        statement (``set_writes.sql``), and there are several, they go out as
        one statement (see :func:`together`): its client and server work
        instead of one statement's per call. Otherwise call by call."""
        listed = [(name, _checked_rows(name, rows)) for name, rows in calls]
        listed = [(name, checked) for name, checked in listed if checked]
        parts: list[tuple[str, bool, Params]] = []
        for name, checked in listed:
            if len(checked) == 1:
                parts.append((name, False, checked[0]))
                continue
            variant = SET_WRITES.get(name)
            segments = None if variant is None else variant.segments(checked)
            if segments is None or len(segments) != 1 or not isinstance(segments[0], str):
                parts = []
                break
            parts.append((name, True, {"rows": segments[0]}))
        if len(parts) < 2:
            for name, checked in listed:
                self.many(name, checked)
            return
        label = " + ".join(f"{name} (set)" if as_set else name for name, as_set, _ in parts)
        if label not in _TOGETHER:
            _TOGETHER[label] = together([(name, as_set) for name, as_set, _ in parts])
        values = {
            f"w{k}_{key}": value
            for k, (_, _, row) in enumerate(parts)
            for key, value in row.items()
        }
        self._call("together", label, values)

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
        connections = self._connections
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
        self._connections.release_after_error(conn)


def _checked_rows(name: str, rows: Iterable[Params]) -> list[Params]:
    """The rows of a ``many`` call of block ``name``, each checked; a block
    with a lock prelude is refused (it runs with ``run``)."""
    statement = QUERIES[name]
    if statement.preludes:
        raise ValueError(f"query {name!r} has a lock prelude; run it with run()")
    return [_checked(statement, row) for row in rows]


def _checked(statement: Statement, row: Params) -> Params:
    check_params(statement.name, row, statement.json_params)
    return row
