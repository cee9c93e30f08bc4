"""The PostgreSQL gateway's connections: a pool of this process's own, and
connections parked by reads, and pipeline mode without psycopg's context
manager.

The pool opens connections in the thread that needs one, when it needs
one, so a failure to connect is that thread's typed error naming its cause
(and the server), and a connection that works again is used at once: there
are no background threads that retry on their own schedule or log each
attempt. A connection found closed, broken, still in a transaction or in
pipeline mode is closed instead of lent again.

A read transaction ends by sending its ``COMMIT`` and parking its
connection here instead of waiting for the acknowledgement (the server ends
the snapshot when the message arrives; a read-only transaction has nothing
to make durable). The next transaction that needs a connection takes the
most recently parked one and reads that acknowledgement in its own first
flight, so a read costs one round trip instead of two. A connection is
parked only while no thread waits in the pool, so parking never makes
another thread wait; a write's connection goes back to the pool.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import psycopg

from dagwerk.backends.errors import StoreUnavailableError

from .errors import connect_error, server_address, server_may_come_back

__all__ = ["Conn", "Connections", "Parked", "enter_pipeline", "leave_pipeline", "send_sync"]

Conn = psycopg.Connection[dict[str, Any]]

# The pause between two connection attempts to a server that refuses or
# does not answer: doubled from the first to the last.
_FIRST_PAUSE = 0.05
_LAST_PAUSE = 1.0


def enter_pipeline(conn: Conn) -> psycopg.Pipeline:
    """Switch ``conn`` to pipeline mode, as ``Connection.pipeline()`` does but
    without its context manager; no I/O.

    psycopg's context manager is a generator: one left open across
    transactions (a parked connection) would, when garbage-collected, run
    its exit and talk to the server, possibly from a forked child on the
    parent's socket. A bare :class:`psycopg.Pipeline` has no finalizer. Like
    ``Connection.pipeline()`` (psycopg 3.1 to 3.3) this records the pipeline
    in the connection's ``_pipeline``, which its cursors consult.
    """
    pipeline = psycopg.Pipeline(conn)
    with conn.lock:
        if conn._pipeline is not None:
            raise psycopg.ProgrammingError("the connection is already in pipeline mode")
        conn._pipeline = pipeline
    try:
        pipeline.__enter__()
    except BaseException:
        with conn.lock:
            conn._pipeline = None
        raise
    return pipeline


def leave_pipeline(conn: Conn, pipeline: psycopg.Pipeline) -> None:
    """Send a Sync, collect every result still due (raising the first error
    among them) and leave pipeline mode, also after an error."""
    try:
        pipeline.__exit__(None, None, None)
    finally:
        with conn.lock:
            if conn._pipeline is pipeline:
                conn._pipeline = None


def send_sync(conn: Conn, pipeline: psycopg.Pipeline) -> bool:
    """Send a Sync without waiting for it; the pipeline's next ``sync()``
    collects its result with everything before it. False, with nothing
    sent, if commands are still queued in psycopg; False too if the bytes
    could not all be handed to the socket at once (then the caller must
    collect the results before it parks the connection).

    Like ``Pipeline.sync()`` this pairs the libpq Sync with a ``None`` entry
    in the pipeline's result queue, which is how psycopg (3.1 to 3.3)
    matches the Sync's result when it arrives.
    """
    with conn.lock:
        if pipeline.command_queue:
            return False
        pgconn = conn.pgconn
        pgconn.pipeline_sync()
        pipeline.result_queue.append(None)
        return pgconn.flush() == 0


@dataclass(slots=True)
class Parked:
    """A connection in pipeline mode whose last transaction, a read, has sent
    its ``COMMIT``; ``commit`` is that statement's cursor (its result, or
    error, arrives with the next flight), ``None`` after a read of one
    statement without ``BEGIN`` and ``COMMIT``, whose flight collected
    everything."""

    conn: Conn
    pipeline: psycopg.Pipeline
    commit: psycopg.Cursor[dict[str, Any]] | None


class Connections:
    """This process's pool and parked connections.

    At most ``size`` connections are open at once (lent, parked or idle).
    A thread that needs one takes the most recently parked one, else the
    most recently used idle one, else opens one (while fewer than ``size``
    are open), else waits for one to come back; it gives up at its
    deadline with :class:`StoreUnavailableError`.

    After ``fork`` the child forgets the parent's connections without
    touching them (a connection must not cross processes, and psycopg does
    not close a connection of another process when it is collected) and
    opens its own.
    """

    def __init__(
        self,
        url: str,
        kwargs: dict[str, Any],
        *,
        size: int,
        reconnect_timeout: float,
        open_timeout: float | None = None,
    ) -> None:
        self._url = url
        self._kwargs = kwargs
        self._size = size
        self._timeout = reconnect_timeout
        self.where = server_address(url)
        """The server, as ``host:port``, for messages."""
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)
        self._pid = os.getpid()
        self._closed = False
        self._parked: list[Parked] = []
        self._idle: list[Conn] = []
        # Open connections of this process: lent, parked, idle, or being opened.
        self._open = 0
        # Threads waiting for a connection: none is parked meanwhile.
        self._waiters = 0
        # The first connection, made here, waits ``open_timeout`` (default:
        # the reconnect timeout) for a server that refuses or does not answer.
        waits = reconnect_timeout if open_timeout is None else open_timeout
        first = self.connect(time.monotonic() + waits)
        self._idle.append(first)
        self._open = 1

    def connect(self, deadline: float) -> Conn:
        """A new connection outside the pool's count (the caller owns it).

        Attempts repeat, with pauses from 0.05 s doubling to 1 s, while the
        server refuses or does not answer and ``deadline``
        (``time.monotonic()``) has not passed; a server that rejects the
        connection for good (host, database, role, password, URL) fails at
        once. Either failure is :class:`StoreUnavailableError` naming the
        server and the cause.
        """
        begun = time.monotonic()
        pause = _FIRST_PAUSE
        while True:
            left = deadline - time.monotonic()
            try:
                conn: Conn = psycopg.connect(
                    # libpq's timeout is whole seconds, and 1 means 2.
                    self._url,
                    connect_timeout=max(2, int(left) + 1),
                    **self._kwargs,
                )
            except psycopg.Error as exc:
                left = deadline - time.monotonic()
                if not server_may_come_back(exc) or left <= 0:
                    raise connect_error(exc, self.where, time.monotonic() - begun) from exc
                time.sleep(min(pause, left))
                pause = min(pause * 2, _LAST_PAUSE)
                continue
            return conn

    def _check_process(self) -> None:
        """Under the lock: refuse after ``close``; forget a parent's connections."""
        if self._closed:
            raise StoreUnavailableError("the PostgreSQL store is closed")
        if os.getpid() != self._pid:
            # Forked: the parent's connections and their sockets are not ours.
            self._pid = os.getpid()
            self._parked, self._idle, self._open, self._waiters = [], [], 0, 0

    def acquire(self, deadline: float) -> Conn | Parked:
        """A connection for a new transaction: the most recently parked one,
        else an idle or a new one, waiting for one to come back at most until
        ``deadline`` (``time.monotonic()``). Nothing is sent on it."""
        with self._lock:
            self._check_process()
            if self._parked:
                return self._parked.pop()
            while True:
                while self._idle:
                    conn = self._idle.pop()
                    if not (conn.closed or conn.broken):
                        return conn
                    self._open -= 1
                    with suppress(psycopg.Error):
                        conn.close()
                if self._open < self._size:
                    self._open += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreUnavailableError(
                        f"no PostgreSQL connection came free within {self._timeout}s "
                        f"(all {self._size} of this process's connections to {self.where} "
                        "are in use); raise pool_size or reconnect_timeout"
                    )
                self._waiters += 1
                try:
                    self._returned.wait(left)
                finally:
                    self._waiters -= 1
                self._check_process()
        try:
            return self.connect(deadline)
        except BaseException:
            self._forget()
            raise

    def _forget(self) -> None:
        """One open connection fewer (closed or never opened)."""
        with self._lock:
            if os.getpid() == self._pid and self._open > 0:
                self._open -= 1
            self._returned.notify()

    def park(self, parked: Parked) -> bool:
        """Keep ``parked`` for the next transaction; False (the caller then
        collects the acknowledgement and releases the connection) while a
        thread waits in the pool, after ``close`` or in another process."""
        with self._lock:
            if self._waiters or self._closed or os.getpid() != self._pid:
                return False
            self._parked.append(parked)
            return True

    def release(self, conn: Conn) -> None:
        """Give ``conn`` back for the next transaction. One that is closed,
        broken, inside a transaction or left in pipeline mode by a failure
        (its protocol state is not known) is closed instead."""
        if os.getpid() != self._pid:
            return  # a connection of the parent's: not this process's to touch
        reusable = (
            not (conn.closed or conn.broken)
            and conn.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
            and conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )
        with self._lock:
            if reusable and not self._closed and os.getpid() == self._pid:
                self._idle.append(conn)
                self._returned.notify()
                return
        with suppress(psycopg.Error):
            conn.close()
        self._forget()

    def release_after_error(self, conn: Conn) -> None:
        """Give back a connection whose transaction failed, rolled back first."""
        with suppress(psycopg.Error):
            if not (conn.closed or conn.broken) and (
                conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE
            ):
                conn.execute(b"ROLLBACK", prepare=False)
        self.release(conn)

    def discard(self, conn: Conn) -> None:
        """Throw ``conn`` away; the next ``acquire`` may open a replacement."""
        with suppress(psycopg.Error):
            conn.close()
        self.release(conn)

    def close(self) -> None:
        """Close every connection of this process; the pool is unusable after."""
        with self._lock:
            parked, self._parked = self._parked, []
            idle, self._idle = self._idle, []
            self._closed = True
            self._returned.notify_all()
            mine = os.getpid() == self._pid
        if not mine:
            return
        for entry in parked:
            with suppress(psycopg.Error):
                entry.conn.close()
            with suppress(psycopg.Error):
                leave_pipeline(entry.conn, entry.pipeline)
        for conn in idle:
            with suppress(psycopg.Error):
                conn.close()
