"""The PostgreSQL gateway's connections: a psycopg pool, and connections
parked by reads, and pipeline mode without psycopg's context manager.

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
import psycopg_pool

from dagwerk.backends.errors import StoreUnavailableError

from .errors import connect_failure, server_may_come_back

__all__ = ["Conn", "Connections", "Parked", "enter_pipeline", "leave_pipeline", "send_sync"]

Conn = psycopg.Connection[dict[str, Any]]


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
    error, arrives with the next flight)."""

    conn: Conn
    pipeline: psycopg.Pipeline
    commit: psycopg.Cursor[dict[str, Any]]


class Connections:
    """This process's pool and parked connections.

    After ``fork`` the child builds its own pool and forgets the parent's
    parked connections without touching them: a connection must not cross
    processes, and nothing here talks to the server when collected.
    """

    def __init__(
        self, url: str, kwargs: dict[str, Any], *, size: int, reconnect_timeout: float
    ) -> None:
        self._url = url
        self._kwargs = kwargs
        self._size = size
        self._timeout = reconnect_timeout
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        self._parked: list[Parked] = []
        # Threads waiting in the pool: no connection is parked meanwhile.
        self._waiters = 0
        self._pool: psycopg_pool.ConnectionPool[Conn] | None = self._open()

    def _open(self) -> psycopg_pool.ConnectionPool[Conn]:
        self._reach_server()
        pool: psycopg_pool.ConnectionPool[Conn] = psycopg_pool.ConnectionPool(
            self._url,
            connection_class=psycopg.Connection,
            kwargs=self._kwargs,
            min_size=1,
            max_size=self._size,
            timeout=self._timeout,
            reconnect_timeout=max(self._timeout, 1.0),
            open=False,
        )
        try:
            pool.open(wait=True, timeout=self._timeout)
        except psycopg_pool.PoolTimeout as exc:
            pool.close()
            raise StoreUnavailableError(
                f"cannot connect to the PostgreSQL server within {self._timeout}s"
            ) from exc
        return pool

    def _reach_server(self) -> None:
        """Return once one connection to the server succeeds; raise at once
        if the server rejects it for good (host, database, role, password,
        URL), after the reconnect timeout if it keeps refusing or timing out.

        This comes before the pool so that a failure is one error naming its
        cause; the pool's background threads would log every attempt and end
        with a bare timeout.
        """
        deadline = time.monotonic() + self._timeout
        pause = 0.05
        while True:
            left = deadline - time.monotonic()
            try:
                conn = psycopg.connect(
                    self._url, connect_timeout=max(2, int(left)), **self._kwargs
                )
            except psycopg.Error as exc:
                reason = connect_failure(exc)
                if not server_may_come_back(exc):
                    raise StoreUnavailableError(f"cannot connect to PostgreSQL: {reason}") from exc
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreUnavailableError(
                        f"cannot connect to the PostgreSQL server within {self._timeout}s: "
                        f"{reason}"
                    ) from exc
                time.sleep(min(pause, left))
                pause = min(pause * 2, 1.0)
                continue
            conn.close()
            return

    def _current(self) -> psycopg_pool.ConnectionPool[Conn]:
        with self._lock:
            if self._closed or self._pool is None:
                raise StoreUnavailableError("the PostgreSQL store is closed")
            if os.getpid() != self._pid:
                # Forked: the parent's pool threads and sockets are not ours.
                self._pid = os.getpid()
                self._parked = []
                self._pool = self._open()
            return self._pool

    def acquire(self, deadline: float) -> Conn | Parked:
        """A connection for a new transaction: the most recently parked one,
        else one from the pool, waiting for it at most until ``deadline``
        (``time.monotonic()``). Nothing is sent on it."""
        pool = self._current()
        with self._lock:
            if self._parked:
                return self._parked.pop()
            self._waiters += 1
        try:
            conn: Conn = pool.getconn(timeout=max(0.1, deadline - time.monotonic()))
        except psycopg_pool.PoolTimeout as exc:
            raise StoreUnavailableError(
                f"no PostgreSQL connection within {self._timeout}s: {exc}"
            ) from exc
        except psycopg_pool.PoolClosed as exc:
            raise StoreUnavailableError("the PostgreSQL store is closed") from exc
        finally:
            with self._lock:
                self._waiters -= 1
        return conn

    def park(self, parked: Parked) -> bool:
        """Keep ``parked`` for the next transaction; False (the caller then
        collects the acknowledgement and releases the connection) while a
        thread waits in the pool, after ``close`` or in another process."""
        with self._lock:
            if self._waiters or self._closed or self._pool is None or os.getpid() != self._pid:
                return False
            self._parked.append(parked)
            return True

    def release(self, conn: Conn) -> None:
        """Give ``conn`` back to the pool (a closed one is replaced there)."""
        pool = self._pool
        if pool is None or os.getpid() != self._pid:
            with suppress(psycopg.Error):
                conn.close()
            return
        if not conn.closed and conn.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF:
            # Left in pipeline mode by a failure: its protocol state is not
            # known, so it is not lent again.
            with suppress(psycopg.Error):
                conn.close()
        with suppress(psycopg_pool.PoolClosed):
            pool.putconn(conn)

    def release_after_error(self, conn: Conn) -> None:
        """Give back a connection whose transaction failed, rolled back first."""
        with suppress(psycopg.Error):
            if not (conn.closed or conn.broken) and (
                conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE
            ):
                conn.execute(b"ROLLBACK", prepare=False)
        self.release(conn)

    def discard(self, conn: Conn) -> None:
        """Throw ``conn`` away; the pool opens a replacement."""
        with suppress(psycopg.Error):
            conn.close()
        self.release(conn)

    def close(self) -> None:
        """Close every connection of this process; the pool is unusable after."""
        with self._lock:
            pool, self._pool = self._pool, None
            parked, self._parked = self._parked, []
            self._closed = True
        if os.getpid() != self._pid:
            return
        for entry in parked:
            # Closed here, not given back: the pool closes only what it holds.
            with suppress(psycopg.Error):
                entry.conn.close()
            with suppress(psycopg.Error):
                leave_pipeline(entry.conn, entry.pipeline)
        if pool is not None:
            pool.close()
