"""The PostgreSQL gateway: the pool, transactions and units of work.

The backend talks to :mod:`psycopg` in this module and its neighbours only:
:mod:`~dagwerk.backends.postgres._pool` (connections),
:mod:`~dagwerk.backends.postgres._tx` (a transaction, its statements
pipelined, and the named queries), :mod:`~dagwerk.backends.postgres._listen`
(LISTEN for new work and ended runs) and
:mod:`~dagwerk.backends.postgres.errors`. Write transactions run at READ
COMMITTED and take the row locks their lock preludes name (see
``queries.sql``); read transactions are REPEATABLE READ READ ONLY
snapshots. A unit of work (:meth:`PostgresGateway.unit`) makes the writes
and reads of one thread one transaction.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from dagwerk.backends.errors import StoreUnavailableError
from dagwerk.backends.sql.gateway import Gateway, Params, Row
from dagwerk.errors import DagwerkError
from dagwerk.store import StoreContractError

from ._listen import NOTIFY_CHANNEL, RUNS_CHANNEL, Listener
from ._pool import Conn, Connections
from ._statements import Statement, parse_block
from ._tx import QUERIES, QUERIES_PATH, SET_WRITES, PostgresTx

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

_LOG = logging.getLogger("dagwerk.backends.postgres")


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
        self._work = Listener(self.connections, NOTIFY_CHANNEL, schema)
        self._runs = Listener(self.connections, RUNS_CHANNEL, schema)
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

    @property
    def notify_payload(self) -> str | None:
        """The payload of the notifications this gateway's waits answer to:
        the schema of the queue that changed (the store sets it once it
        knows its schema)."""
        return self._work.payload

    @notify_payload.setter
    def notify_payload(self, payload: str | None) -> None:
        self._work.payload = self._runs.payload = payload

    # -- transactions -------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, write: bool, bare: bool = False) -> Iterator[PostgresTx]:
        unit = self._unit_now()
        if unit is not None and (write or unit.tx is not None):
            yield from self._joined(unit, write=write)
            return
        tx = self._open(write=write, bare=bare)
        try:
            yield tx
        except BaseException:
            tx.abort()
            raise
        tx.commit()

    def _open(self, *, write: bool, held: bool = False, bare: bool = False) -> PostgresTx:
        """A transaction on a connection of the pool (waiting for one up to
        the reconnect timeout)."""
        deadline = time.monotonic() + self.reconnect_timeout
        conn = self.connections.acquire(deadline)
        return PostgresTx(
            self.connections, self.reconnect_timeout, conn, write=write, held=held, bare=bare
        )

    # -- units of work --------------------------------------------------------------------

    def _unit_now(self) -> _Unit | None:
        unit: _Unit | None = getattr(self._units, "unit", None)
        return unit

    def _joined(self, unit: _Unit, *, write: bool) -> Iterator[PostgresTx]:
        if unit.doomed is not None:
            raise _doomed_error(unit.doomed)
        tx = unit.tx
        if tx is None:
            tx = unit.tx = self._open(write=True, held=True)
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

    def write(self) -> AbstractContextManager[PostgresTx]:
        """A READ COMMITTED transaction whose lock preludes run."""
        return self._transaction(write=True)

    def read(self) -> AbstractContextManager[PostgresTx]:
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

    def script(self, conn_tx: PostgresTx, sql: str) -> None:
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
        self.tx: PostgresTx | None = None
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
