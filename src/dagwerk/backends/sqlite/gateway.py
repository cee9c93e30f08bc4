"""The SQLite gateway: one connection, named queries, transactions, errors.

This module is the only place that runs the store's statements on
:mod:`sqlite3` (the background checkpointer of ``_checkpoint.py`` keeps a
connection of its own that only checkpoints). It loads
``queries.sql`` once, opens every write with ``BEGIN IMMEDIATE`` (the write
lock is taken up front, so a transaction never fails half-way on a lock
upgrade), waits up to ``busy_timeout`` for other writers, and translates
every driver error into :mod:`dagwerk.backends.errors`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

from dagwerk.backends.errors import (
    StoreCorruptError,
    StoreFullError,
    StoreGoneError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from dagwerk.backends.sql.gateway import Gateway, Params, Row, load_queries
from dagwerk.backends.sqlite import _wake
from dagwerk.backends.sqlite._checkpoint import Checkpointer
from dagwerk.backends.sqlite._writer_queue import WriterQueue
from dagwerk.backends.sqlite.errors import (
    CANTOPEN,
    PLACE_CHECK_SECONDS,
    file_identity,
    gone_reason,
    open_refusal,
    translate_error,
)
from dagwerk.errors import DagwerkError
from dagwerk.store import InvalidStoreValueError, StoreContractError

_LOG = logging.getLogger("dagwerk.backends.sqlite")

__all__ = ["QUERIES", "SqliteGateway"]

QUERIES_PATH = Path(__file__).with_name("queries.sql")
QUERIES: dict[str, str] = load_queries(QUERIES_PATH)

# Statements that make a queue row deliverable: committing one wakes the
# dequeues of this process that wait for work on the same database.
_WAKING = frozenset({"delivery_insert", "queue_release"})
_WAKERS_LOCK = threading.Lock()
# Other processes cannot notify this one; their work is found by polling the
# database's ``data_version`` (cheap: it reads the shared WAL index). The poll
# is fast (1 ms) while commits by others were seen recently and slows down to
# 50 ms once the database has been quiet for about a second.
_POLL_SECONDS = 0.05
_POLL_MIN_SECONDS = 0.001
_POLL_QUIET_DIVISOR = 20.0


class _Waker:
    """A condition plus a counter of waking commits, so a wake-up that lands
    between a dequeue's empty look and its wait is not lost; and, once a
    gateway waits for work, the watcher that turns other processes' commits
    into wake-ups (see ``_wake.py``)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.epoch = 0
        self.gateways = 0  # open gateways of this database in this process
        self.watched_in = -1  # the process whose watcher wakes this waker

    def wake(self) -> None:
        with self.cond:
            self.epoch += 1
            self.cond.notify_all()


_WAKERS: dict[str, _Waker] = {}


def _waker(key: str) -> _Waker:
    with _WAKERS_LOCK:
        waker = _WAKERS.setdefault(key, _Waker())
        waker.gateways += 1
        return waker


class _Tx:
    """One open transaction on the gateway's connection."""

    __slots__ = ("_conn", "_path", "woke")

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn = conn
        self._path = path
        self.woke = False

    def _execute(self, name: str, params: Params | None) -> sqlite3.Cursor:
        try:
            return self._conn.execute(QUERIES[name], params or {})
        except sqlite3.Error as exc:
            raise translate_error(exc, f"query {name!r} failed", self._path) from exc

    def one(self, name: str, params: Params | None = None) -> Row | None:
        row: Row | None = self._execute(name, params).fetchone()
        return row

    def all(self, name: str, params: Params | None = None) -> list[Row]:
        rows: list[Row] = self._execute(name, params).fetchall()
        return rows

    def all_of(self, queries: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        return [self.all(name, params) for name, params in queries]

    def all_committing(self, name: str, params: Params | None = None) -> list[Row]:
        """``all``: the transaction commits as it ends, right after."""
        return self.all(name, params)

    def all_of_committing(self, queries: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        """``all_of``: the transaction commits as it ends, right after."""
        return self.all_of(queries)

    def run(self, name: str, params: Params | None = None) -> int:
        if name in _WAKING:
            self.woke = True
        return self._execute(name, params).rowcount

    def many(self, name: str, rows: Iterable[Params]) -> None:
        if name in _WAKING:
            self.woke = True
        try:
            self._conn.executemany(QUERIES[name], rows)
        except sqlite3.Error as exc:
            raise translate_error(exc, f"query {name!r} failed", self._path) from exc

    def many_of(self, calls: Sequence[tuple[str, Iterable[Params]]]) -> None:
        # In process, a statement costs no round trip: one by one.
        for name, rows in calls:
            self.many(name, rows)


SYNCHRONOUS_MODES = ("normal", "full", "extra")
"""Values of the store's ``synchronous`` option (SQLite's PRAGMA synchronous)."""

_SYNCHRONOUS_PRAGMAS = {
    "normal": "PRAGMA synchronous = NORMAL",
    "full": "PRAGMA synchronous = FULL",
    "extra": "PRAGMA synchronous = EXTRA",
}


class SqliteGateway(Gateway):
    """One connection per process, shared by threads under a lock.

    SQLite admits one writer at a time anyway, so a per-thread connection
    would only add lock contention inside the database. After ``fork`` the
    child opens its own connection (a connection must not cross processes).
    """

    serialises_writers = True
    """One database-wide write lock: a transaction never waits on row locks, so
    a batch of several runs' transitions cannot deadlock (see sql/_batch.py)."""

    def __init__(
        self,
        path: str,
        *,
        busy_timeout: float = 30.0,
        read_only: bool = False,
        max_page_count: int | None = None,
        synchronous: str = "normal",
    ) -> None:
        if synchronous not in SYNCHRONOUS_MODES:
            raise InvalidStoreValueError(
                f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, not {synchronous!r}",
                field="synchronous",
            )
        self.synchronous = synchronous
        self.path = path
        self.busy_timeout = busy_timeout
        self.read_only = read_only
        self.max_page_count = max_page_count
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._conn: sqlite3.Connection | None = None
        # Set when a write found the file read-only (see _reconnect).
        self._reopen = False
        # Set when a write found the disk full (see _reclaim_log).
        self._reclaim = False
        # Writers queue in a kernel lock before BEGIN IMMEDIATE (_writer_queue.py).
        self._queue = (
            None
            if self.in_memory or read_only
            else WriterQueue(f"{path}-dagwerk.lock", busy_timeout)
        )
        # WAL checkpoints run on a background thread (see _checkpoint.py).
        self.checkpointer = (
            None if self.in_memory or read_only else Checkpointer(os.path.realpath(path))
        )
        # The open file's device and inode: a file removed (or replaced)
        # under the connection, whose writes would reach no one, is found by
        # comparing them with the path's, at most every PLACE_CHECK_SECONDS
        # and after a failed transaction; from then on every call raises
        # StoreGoneError.
        self._identity: tuple[int, int] | None = None
        self._next_place_check = 0.0
        self._gone: str | None = None
        self._conn = self._connect()
        if not self.in_memory:
            self._identity = file_identity(path)
        # A store dropped without close() closes its connection when it is
        # collected (not at interpreter exit, where daemon threads may still
        # use it), as Python's sqlite3 did by itself before 3.13 warned.
        self._held = _HeldConnection(self._conn)
        self._finalizer = weakref.finalize(self, self._held.close)
        self._finalizer.atexit = False
        # In-memory databases are private to this gateway; files are shared
        # by every gateway of this process that opens the same path.
        key = f"memory:{id(self)}" if self.in_memory else os.path.realpath(path)
        self._waker = _waker(key)
        self._last_change = float("-inf")  # monotonic time work was last seen
        # A unit of work (see unit()): its thread, its open transaction (from
        # the block's first write on) and what closes that transaction.
        self._unit_owner: int | None = None
        self._unit_tx: _Tx | None = None
        # Write transactions begun by units, and joined writes that ended in
        # the current one: what write_mark() tells apart.
        self._units_begun = 0
        # Units entered (outermost blocks): what unit_serial() tells apart.
        self._units_entered = 0
        self._unit_writes = 0
        self._unit_closer: AbstractContextManager[_Tx] | None = None
        # What the unit's commit is to run (after_commit()).
        self._unit_after: list[Callable[[], object]] = []
        # All-or-nothing blocks entered, and the error that doomed the unit.
        self._unguarded = 0
        self._doomed: BaseException | None = None

    def work_epoch(self) -> int:
        """The count of waking commits so far (pass it to :meth:`wait_for_work`)."""
        with self._waker.cond:
            return self._waker.epoch

    def wait_for_work(self, timeout: float, since: int | None = None) -> bool:
        """Block until a commit made a queue row deliverable (after epoch
        ``since``), at most ``timeout`` seconds; True when a commit ended the
        wait.

        A waking commit of this process ends the wait at once; so does any
        commit of another process on Linux (the log watcher of ``_wake.py``),
        elsewhere the ``data_version`` poll finds it."""
        end = time.monotonic() + max(0.0, timeout)
        seen = self._data_version()
        watched = self._watch_other_processes()
        if watched:
            _wake.begin_wait()
        try:
            return self._wait(end, since, seen, watched)
        finally:
            if watched:
                _wake.end_wait()

    def _wait(self, end: float, since: int | None, seen: int | None, watched: bool) -> bool:
        while True:
            now = time.monotonic()
            remaining = end - now
            if remaining <= 0:
                return False
            quiet = now - self._last_change
            # Watched, other processes' commits wake this wait: the poll is
            # only a safety net and need not run fast while they commit.
            fast = _POLL_SECONDS if watched else _POLL_MIN_SECONDS
            step = min(remaining, _POLL_SECONDS, max(fast, quiet / _POLL_QUIET_DIVISOR))
            with self._waker.cond:
                if since is not None and self._waker.epoch != since:
                    self._last_change = time.monotonic()
                    return True
                if self._waker.cond.wait(step):
                    self._last_change = time.monotonic()
                    return True
            if seen is not None and self._data_version() != seen:
                # Another connection committed: maybe a delivery, so look.
                self._last_change = time.monotonic()
                return True

    def _watch_other_processes(self) -> bool:
        """Watch this database's log (once per process): other processes'
        commits then wake this process's waiting dequeues at once instead of
        at the next ``data_version`` poll. False when it cannot be watched."""
        if self.in_memory:
            return False
        waker = self._waker
        pid = os.getpid()
        if waker.watched_in != pid and _wake.watch(self.path, waker.wake):
            waker.watched_in = pid
        return waker.watched_in == pid

    def _data_version(self) -> int | None:
        """The connection's ``PRAGMA data_version``: it changes when another
        connection commits. ``None`` for a private in-memory database or when
        it cannot be read (the caller then just waits)."""
        if self.in_memory or self._unit_owner == threading.get_ident():
            return None
        try:
            with self._lock:
                row = self._connection().execute("PRAGMA data_version").fetchone()
        except (sqlite3.Error, DagwerkError):
            return None
        return int(row[0])

    @property
    def in_memory(self) -> bool:
        return self.path == ":memory:" or self.path.startswith("file::memory:")

    def _connect(self) -> sqlite3.Connection:
        target = self.path
        if self.read_only and not self.in_memory:
            target = f"file:{self.path}?mode=ro"
        try:
            conn = sqlite3.connect(
                target,
                uri=target.startswith("file:"),
                timeout=self.busy_timeout,
                isolation_level=None,  # transactions are explicit
                check_same_thread=False,  # guarded by self._lock
                cached_statements=256,
            )
        except sqlite3.Error as exc:
            raise open_refusal(self.path, exc) from exc
        conn.row_factory = sqlite3.Row
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            # Savepoints (a unit of work's joined calls) journal every page
            # they change; past 64 KiB SQLite spills that journal to a temporary
            # file, which made a joined batch's writes ~3x dearer. In memory it
            # lives only as long as its savepoint.
            conn.execute("PRAGMA temp_store = MEMORY")
            if self.max_page_count is not None:
                conn.execute(f"PRAGMA max_page_count = {int(self.max_page_count)}")
            if not self.in_memory:
                mode = self._switch_to_wal(conn)
                if str(mode).lower() != "wal":
                    raise StoreReadOnlyError(
                        f"cannot switch {self.path!r} to WAL mode (journal mode {mode!r})",
                        target=self.path,
                    )
                # In WAL mode NORMAL survives any process crash; only a power
                # loss can drop the last commits. FULL/EXTRA fsync every commit.
                conn.execute(_SYNCHRONOUS_PRAGMAS[self.synchronous])
                if not self.read_only:
                    # BACKSTOP_PAGES (a test checks the two agree).
                    conn.execute("PRAGMA wal_autocheckpoint = 8192")
        except sqlite3.Error as exc:
            conn.close()
            if (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF == CANTOPEN:
                raise open_refusal(self.path, exc) from exc
            raise translate_error(exc, f"cannot open {self.path!r}", self.path) from exc
        except DagwerkError:
            conn.close()
            raise
        return conn

    def _switch_to_wal(self, conn: sqlite3.Connection) -> object:
        """``PRAGMA journal_mode = WAL``, retried while the file is locked.

        Switching the journal mode needs the database to itself, and SQLite
        answers ``database is locked`` at once (without its busy handler)
        when another connection is mid-transaction, e.g. a second worker
        starting while the first migrates a new file. A refusal is retried
        with a short back-off until the busy timeout passes.
        """
        deadline = time.monotonic() + self.busy_timeout
        pause = 0.001
        while True:
            try:
                return conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(pause)  # another connection holds the file: back off
            pause = min(pause * 2, 0.05)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreUnavailableError(f"store {self.path!r} is closed", target=self.path)
        if self._identity is not None:
            self._check_place(now=False)
        if os.getpid() != self._pid:
            # Forked: never touch the parent's connection.
            self._pid = os.getpid()
            self._conn = self._connect()
            self._held.hold(self._conn)
        elif self._reopen and self._unit_tx is None:
            self._reconnect()
        return self._conn

    def _check_place(self, *, now: bool) -> None:
        """Raise :class:`StoreGoneError` once the open file is no longer the
        one at its path; looked at most every ``PLACE_CHECK_SECONDS`` unless
        ``now``."""
        identity = self._identity
        if self._gone is None and identity is not None:
            clock = time.monotonic()
            if not now and clock < self._next_place_check:
                return
            self._next_place_check = clock + PLACE_CHECK_SECONDS
            self._gone = gone_reason(self.path, identity)
        if self._gone is not None:
            raise StoreGoneError(f"{self._gone} while this process had it open", target=self.path)

    def _reconnect(self) -> None:
        """Open the file afresh after a write found it read-only: SQLite
        opens a file it cannot write read-only, and keeps it so until the
        connection is opened again, so a file made writable again is only
        written through a new connection. While it still cannot be opened
        for writing, the current connection serves the reads."""
        self._reopen = False
        try:
            fresh = self._connect()
        except DagwerkError:
            return
        old, self._conn = self._conn, fresh
        self._held.hold(fresh)
        if old is not None:
            with suppress(sqlite3.Error):
                old.close()

    def _transaction(self, begin: str) -> AbstractContextManager[_Tx]:
        if self._unit_owner == threading.get_ident():
            tx = self._unit_tx
            if tx is not None and self._doomed is None:
                # The unit's hot paths, without a generator each: a read in
                # its transaction, or a write of an all-or-nothing block.
                if begin != "BEGIN IMMEDIATE":
                    return _InUnit(tx)
                if self._unguarded:
                    return _UnguardedWrite(self, tx)
            return self._joined(begin)
        return self._own_transaction(begin)

    def write_mark(self) -> tuple[int, int] | None:
        """Inside the calling thread's unit of work, once its write
        transaction has begun: a mark that a later call returns again only
        while no write of the unit has ended in between (so whatever was read
        in between is still what the database holds). ``None`` elsewhere."""
        if self._unit_owner != threading.get_ident() or self._unit_tx is None:
            return None  # not in a unit, or the unit has not written yet
        return self._units_begun, self._unit_writes

    def unit_serial(self) -> int | None:
        """Inside the calling thread's unit of work (begun or not): a number
        no other unit of this gateway has had. ``None`` elsewhere."""
        if self._unit_owner != threading.get_ident():
            return None
        return self._units_entered

    @contextmanager
    def unit(self, *, all_or_nothing: bool = False) -> Iterator[None]:
        """One write transaction for every transaction this thread opens on
        the gateway inside the block (:class:`~dagwerk.store.UnitOfWorkStore`).

        The transaction begins (``BEGIN IMMEDIATE``) at the block's first
        write, so work before it, such as encoding a completion's outputs,
        does not hold the database's write lock; a read before that first
        write is a transaction of its own, as outside a block. A joined write
        that raises undoes only its own statements: the first write by
        rolling the (so far only its) transaction back, so that the block's
        next write begins afresh; every later one by a savepoint around it.
        A joined read runs in the block's transaction and sees its writes.
        The block commits when it ends and rolls back when an exception
        leaves it; waking commits wake the waiting dequeues only after that
        commit. Other threads wait for the block from its first write on (it
        holds the connection); an inner block joins the outer one.

        ``all_or_nothing``: inside this block (or inner block) the writes
        after the first run without savepoints (two statements fewer each),
        for callers that let any error leave the unit. A write that raises
        there dooms the unit: every later call of the unit raises, and the
        unit rolls back at its end and raises even if nothing else did.
        """
        if self._unit_owner == threading.get_ident():
            if not all_or_nothing:
                yield
                return
            self._unguarded += 1
            try:
                yield
            finally:
                self._unguarded -= 1
            return
        self._unit_owner = threading.get_ident()
        self._units_entered += 1
        self._unguarded = 1 if all_or_nothing else 0
        try:
            try:
                yield
            except BaseException as exc:
                closer = self._end_unit()
                if closer is None or not closer.__exit__(type(exc), exc, exc.__traceback__):
                    raise
            else:
                doomed = self._doomed
                after = self._unit_after
                closer = self._end_unit()
                if doomed is not None:
                    if closer is not None:
                        closer.__exit__(type(doomed), doomed, doomed.__traceback__)
                    raise _doomed_error(doomed) from doomed
                if closer is not None:
                    closer.__exit__(None, None, None)  # commits
                    for action in after:
                        try:
                            action()
                        except Exception:  # the commit stands: never report it failed
                            _LOG.exception("an action after a unit of work's commit failed")
        finally:
            self._unit_tx, self._unit_closer, self._unit_owner = None, None, None
            self._unguarded, self._doomed = 0, None

    def _end_unit(self) -> AbstractContextManager[_Tx] | None:
        closer, self._unit_tx, self._unit_closer = self._unit_closer, None, None
        self._unit_after, self._doomed = [], None
        return closer

    def undoes_a_failed_write(self) -> bool:
        """Whether a write of the calling thread that raises now would be
        undone alone (False inside an all-or-nothing block once its unit has
        written: such a write dooms the unit)."""
        return not (
            self._unguarded
            and self._unit_tx is not None
            and self._unit_owner == threading.get_ident()
        )

    def after_commit(self, action: Callable[[], object]) -> bool:
        """Inside the calling thread's unit of work, once its transaction
        has begun: run ``action`` after the unit commits (never if it rolls
        back) and answer True. Elsewhere False: nothing of the caller's
        is pending, its writes have committed."""
        if self._unit_owner != threading.get_ident() or self._unit_tx is None:
            return False
        self._unit_after.append(action)
        return True

    @contextmanager
    def _joined(self, begin: str) -> Iterator[_Tx]:
        if self._doomed is not None:
            raise _doomed_error(self._doomed)
        tx = self._unit_tx
        if tx is None:
            if begin != "BEGIN IMMEDIATE":
                # Nothing written yet: a read of its own, as outside a block.
                with self._own_transaction(begin) as own:
                    yield own
                return
            yield from self._first_write()
            return
        # (A read in the unit's transaction and an unguarded write take
        # _InUnit and _UnguardedWrite instead, see _transaction.)
        # Savepoints of one name nest: each statement names the innermost.
        conn = tx._conn
        try:
            conn.execute("SAVEPOINT dagwerk_call")
        except sqlite3.Error as exc:
            raise translate_error(exc, "cannot open a savepoint", self.path) from exc
        try:
            yield tx
        except BaseException:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK TO dagwerk_call")
                conn.execute("RELEASE dagwerk_call")
            raise
        finally:
            self._unit_writes += 1
        try:
            conn.execute("RELEASE dagwerk_call")
        except sqlite3.Error as exc:
            raise translate_error(exc, "cannot release a savepoint", self.path) from exc

    def _first_write(self) -> Iterator[_Tx]:
        """The unit's first write begins its transaction, without a savepoint
        (two statements fewer per unit): the transaction holds nothing else
        yet, so a failing first write rolls all of it back."""
        closer = self._own_transaction("BEGIN IMMEDIATE")
        tx = closer.__enter__()
        self._unit_tx, self._unit_closer = tx, closer
        self._units_begun += 1
        self._unit_writes = 0
        try:
            yield tx
        except BaseException as exc:
            self._end_unit()
            if not closer.__exit__(type(exc), exc, exc.__traceback__):
                raise
        finally:
            self._unit_writes += 1

    def _reclaim_log(self, conn: sqlite3.Connection) -> None:
        """Give the write-ahead log's space back after a write found the disk
        full: the log keeps its size once grown (up to the backstop's ~32 MiB,
        see _checkpoint.py), so on a small disk a log grown until the disk
        filled would fill it again as soon as space is freed. A ``TRUNCATE``
        checkpoint copies the log into the database file and empties it;
        while the disk is still full it fails, and the next write tries
        again (the worker paces those writes)."""
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:
            return
        if not busy:
            self._reclaim = False

    @contextmanager
    def _own_transaction(self, begin: str) -> Iterator[_Tx]:
        with self._lock:
            conn = self._connection()
            queue = self._queue if begin == "BEGIN IMMEDIATE" else None
            queued = None if queue is None else queue.acquire()
            try:
                if self._reclaim and queue is not None:
                    self._reclaim_log(conn)
                try:
                    conn.execute(begin)
                except sqlite3.Error as exc:
                    raise translate_error(exc, "cannot begin a transaction", self.path) from exc
                tx = _Tx(conn, self.path)
                try:
                    yield tx
                except BaseException:
                    _rollback(conn)
                    raise
                try:
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    _rollback(conn)
                    raise translate_error(exc, "commit failed", self.path) from exc
            except StoreUnavailableError as exc:
                if isinstance(exc, StoreReadOnlyError):
                    # The next transaction opens the file again (see _reconnect).
                    self._reopen = not self.read_only and not self.in_memory
                elif isinstance(exc, StoreFullError):
                    self._reclaim = not self.read_only and not self.in_memory
                try:
                    self._check_place(now=True)
                except StoreGoneError as gone:
                    raise gone from exc
                raise
            finally:
                if queue is not None and queued is not None:
                    queue.release(queued)
        if self.checkpointer is not None and begin == "BEGIN IMMEDIATE":
            self.checkpointer.committed()
        if tx.woke:
            with self._waker.cond:
                self._waker.epoch += 1
                self._waker.cond.notify_all()

    def read_one(self, name: str, params: Params | None = None) -> Row | None:
        """The first row of one query, read without ``BEGIN`` and ``COMMIT``
        (two statements fewer): SQLite runs a lone statement in a read
        transaction of its own, which ends once all its rows are fetched.
        Inside the calling thread's unit of work, once that has written, the
        query runs in the unit's transaction and sees its writes."""
        if self._unit_owner == threading.get_ident() and self._unit_tx is not None:
            if self._doomed is not None:
                raise _doomed_error(self._doomed)
            return self._unit_tx.one(name, params)
        with self._lock:
            rows = _Tx(self._connection(), self.path).all(name, params)
        return rows[0] if rows else None

    def write(self) -> AbstractContextManager[_Tx]:
        """A write transaction: ``BEGIN IMMEDIATE`` ... ``COMMIT``."""
        return self._transaction("BEGIN IMMEDIATE")

    def read(self) -> AbstractContextManager[_Tx]:
        """A read transaction: one consistent snapshot of the database."""
        return self._transaction("BEGIN")

    def script(self, sql: str) -> None:
        """Run a multi-statement script inside the current write transaction's
        connection (used by migrations, which the caller wraps in ``write()``)."""
        conn = self._connection()
        buffer = ""
        for line in sql.splitlines(keepends=True):
            buffer += line
            if sqlite3.complete_statement(buffer):
                try:
                    conn.execute(buffer)
                except sqlite3.Error as exc:
                    raise translate_error(exc, "migration failed", self.path) from exc
                buffer = ""
        if buffer.strip() and not _only_comments(buffer):
            raise StoreCorruptError(f"incomplete statement in migration: {buffer.strip()[:80]!r}")

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
        waker = self._waker
        with _WAKERS_LOCK:
            if self._conn is not None:
                waker.gateways -= 1
            # The last gateway of the database in this process ends its watch.
            unwatch = waker.gateways <= 0 and waker.watched_in == os.getpid()
            if unwatch:
                waker.watched_in = -1
        if unwatch:
            _wake.unwatch(self.path)
        self._finalizer.detach()
        with self._lock:
            if self._conn is not None and os.getpid() == self._pid:
                self._conn.close()
            self._conn = None
            if self._queue is not None:
                self._queue.close()


class _InUnit:
    """A read joined to the unit's open transaction: nothing to begin or end."""

    __slots__ = ("_tx",)

    def __init__(self, tx: _Tx) -> None:
        self._tx = tx

    def __enter__(self) -> _Tx:
        return self._tx

    def __exit__(self, *exc_info: object) -> None:
        return None


class _UnguardedWrite:
    """A write joined to the unit's open transaction inside an all-or-nothing
    block (no savepoint): it ends a write of the unit, and an error leaving
    it dooms the unit (its statements so far stay: no undo)."""

    __slots__ = ("_gateway", "_tx")

    def __init__(self, gateway: SqliteGateway, tx: _Tx) -> None:
        self._gateway = gateway
        self._tx = tx

    def __enter__(self) -> _Tx:
        return self._tx

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            self._gateway._doomed = exc
        self._gateway._unit_writes += 1


def _doomed_error(cause: BaseException) -> StoreContractError:
    return StoreContractError(
        "a write failed inside an all-or-nothing unit of work, which therefore "
        f"rolls back: {type(cause).__name__}: {cause}"
    )


class _HeldConnection:
    """The gateway's current connection, for its finalizer (which must not
    refer to the gateway itself)."""

    __slots__ = ("conn", "pid")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.pid = os.getpid()

    def hold(self, conn: sqlite3.Connection) -> None:
        """Hold this process's new connection (after a fork)."""
        self.conn, self.pid = conn, os.getpid()

    def close(self) -> None:
        if os.getpid() == self.pid:
            with suppress(sqlite3.Error):
                self.conn.close()


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in text.splitlines())


def _rollback(conn: sqlite3.Connection) -> None:
    # SQLite rolls some failures (e.g. SQLITE_FULL) back by itself.
    if conn.in_transaction:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
