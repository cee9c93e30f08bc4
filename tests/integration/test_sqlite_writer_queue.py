"""SQLite writers of one database queue on a kernel lock.

SQLite's busy handler sleeps 1, 2, 5, 10 ... ms between tries, so writers of
several processes used to wait far longer than the transactions they waited
for. Every write transaction of the store now first takes an exclusive
``flock`` on ``<db>-dagwerk.lock``: these tests show it is really taken, that
it orders writers across processes, and that a writer killed while holding
it does not block the others.
"""

from __future__ import annotations

import fcntl
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dagwerk.backends.errors import StoreBusyError
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.models import DagNode
from dagwerk.store import InvalidStoreValueError

_HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""


def _holder(lock: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _finish(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def _write_in_thread(store: SqliteStore, run_id: str) -> threading.Event:
    done = threading.Event()

    def write() -> None:
        store.create_run(run_id, [DagNode(slug="a", plugin="p")])
        done.set()

    threading.Thread(target=write, daemon=True).start()
    return done


def test_a_write_holds_the_side_lock_only_while_it_runs(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    store = SqliteStore(str(db))
    store.create_run("r1", [DagNode(slug="a", plugin="p")])
    lock = Path(f"{db}-dagwerk.lock")
    assert lock.exists()
    # Between transactions nobody holds it: another descriptor gets it at once.
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    store.close()


def test_a_writer_waits_for_another_process_holding_the_lock(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    store = SqliteStore(str(db))
    holder = _holder(Path(f"{db}-dagwerk.lock"))
    try:
        done = _write_in_thread(store, "r1")
        assert not done.wait(0.3)  # queued behind the other process
        reader = SqliteStore(str(db))  # its own connection: reads never queue
        assert reader.get_run("r1") is None
        reader.close()
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert done.wait(10)
    finally:
        _finish(holder)
    assert store.get_run("r1") is not None
    store.close()


def test_a_writer_killed_while_holding_the_lock_releases_it(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    store = SqliteStore(str(db))
    holder = _holder(Path(f"{db}-dagwerk.lock"))
    done = _write_in_thread(store, "r1")
    assert not done.wait(0.3)
    os.kill(holder.pid, signal.SIGKILL)
    _finish(holder)
    assert done.wait(10)
    assert store.get_run("r1") is not None
    store.close()


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(10)


def _free(lock: Path) -> bool:
    """Whether another descriptor can take the lock right now."""
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing the only descriptor drops its lock
    return True


def _until(predicate: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _busy_write(store: SqliteStore, run_id: str) -> list[BaseException]:
    """Write in a thread (a wait without an end fails the test instead of
    hanging it); the write must fail with a busy error."""
    raised: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            store.create_run(run_id, [DagNode(slug="a", plugin="p")])
        except BaseException as exc:
            raised.append(exc)
        done.set()

    threading.Thread(target=write, daemon=True).start()
    assert done.wait(10), "the writer waited past its busy timeout"
    assert len(raised) == 1 and isinstance(raised[0], StoreBusyError), raised
    return raised


def _store_behind_a_holder(
    url: str, busy_timeout: float | None = None
) -> tuple[SqliteStore, Path, subprocess.Popen[str]]:
    """A migrated store, and another process holding its writer lock."""
    store = SqliteStore(url, busy_timeout=busy_timeout)
    store.create_run("r0", [DagNode(slug="a", plugin="p")])
    lock = Path(f"{store.path}-dagwerk.lock")
    return store, lock, _holder(lock)


def test_a_writer_waits_no_longer_than_the_busy_timeout(tmp_path: Path) -> None:
    """A peer alive but stopped while it holds the lock (Ctrl-Z on a worker)
    must not hang every other writer: the wait ends at the busy timeout
    with a busy error, and nothing is written."""
    store, lock, holder = _store_behind_a_holder(str(tmp_path / "q.db"), busy_timeout=0.3)
    try:
        raised = _busy_write(store, "r1")
        assert "busy timeout (0.3 s)" in str(raised[0])
        assert str(lock) in str(raised[0])
        assert store.get_run("r1") is None
        # The helper still queues for the lock; once the peer lets go, the
        # next write gets it, and the abandoned wait does not keep it.
        _release(holder)
        store.create_run("r1", [DagNode(slug="a", plugin="p")])
        assert store.get_run("r1") is not None
        assert _until(lambda: _free(lock))
    finally:
        _finish(holder)
    store.close()


def test_an_abandoned_wait_lets_the_lock_go_when_it_gets_it(tmp_path: Path) -> None:
    store, lock, holder = _store_behind_a_holder(str(tmp_path / "q.db"), busy_timeout=0.2)
    try:
        _busy_write(store, "r1")
        # Nobody in this process wants the lock any more: when the peer
        # ends, the waiting helper takes it and lets it go at once.
        _release(holder)
        assert _until(lambda: _free(lock))
    finally:
        _finish(holder)
    store.close()


def _helpers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dagwerk-sqlite-queue"]


def test_a_store_dropped_without_close_ends_its_queue_helper(tmp_path: Path) -> None:
    before = set(_helpers())
    store, _, holder = _store_behind_a_holder(str(tmp_path / "q.db"), busy_timeout=5.0)
    try:
        done = _write_in_thread(store, "r1")
        assert _until(lambda: bool(set(_helpers()) - before))  # waits for the contended lock
        _release(holder)
        assert done.wait(10)
    finally:
        _finish(holder)
    store._sqlite._held.close()  # what the store's own finalizer does
    store._sqlite._finalizer.detach()
    del store, done
    gc.collect()
    assert _until(lambda: not set(_helpers()) - before)


def test_the_busy_timeout_can_be_set_in_the_url(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    store, _, holder = _store_behind_a_holder(f"sqlite:///{db}?busy_timeout=0.25")
    try:
        raised = _busy_write(store, "r1")
        assert "busy timeout (0.25 s)" in str(raised[0])
    finally:
        _finish(holder)
    store.close()
    both = SqliteStore(f"sqlite:///{db}?busy_timeout=0.25&mode=rw", busy_timeout=2)
    assert both._sqlite.busy_timeout == 2.0  # the keyword wins
    both.close()
    default = SqliteStore(str(db))
    assert default._sqlite.busy_timeout == 30.0
    default.close()


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "86401", "", "1e400"])
def test_a_bad_busy_timeout_in_the_url_is_a_typed_error(tmp_path: Path, value: str) -> None:
    db = tmp_path / "x.db"
    with pytest.raises(InvalidStoreValueError) as raised:
        SqliteStore(f"sqlite:///{db}?busy_timeout={value}")
    assert raised.value.field == "url"
    assert "busy_timeout" in str(raised.value)
    assert not db.exists()


@pytest.mark.parametrize("value", [-0.5, float("nan"), float("inf"), 86_401, True, "5"])
def test_a_bad_busy_timeout_keyword_is_a_typed_error(tmp_path: Path, value: object) -> None:
    with pytest.raises(InvalidStoreValueError) as raised:
        SqliteStore(str(tmp_path / "x.db"), busy_timeout=value)  # type: ignore[arg-type]
    assert raised.value.field == "busy_timeout"
    assert "from 0 to 86400" in str(raised.value)
    assert not (tmp_path / "x.db").exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_forked_child_closes_its_copies_of_the_lock_descriptors(tmp_path: Path) -> None:
    """A copy shares the parent's lock: a child kept alive with one would
    hold the lock after the parent died holding it."""
    db = tmp_path / "q.db"
    store = SqliteStore(str(db), busy_timeout=5.0)
    lock = Path(f"{db}-dagwerk.lock")
    store.create_run("r0", [DagNode(slug="a", plugin="p")])  # the direct descriptor
    other = os.open(lock, os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX)
    queue = store._sqlite._queue
    assert queue is not None
    done = _write_in_thread(store, "r1")  # contended: through the helper's descriptor
    assert _until(lambda: queue._waiter is not None)
    fcntl.flock(other, fcntl.LOCK_UN)
    os.close(other)
    assert done.wait(10)
    assert queue._fd is not None and queue._waiter is not None
    inherited = [queue._fd, queue._waiter._fd]
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            closed = 0
            for fd in inherited:
                try:
                    os.fstat(fd)
                except OSError:
                    closed += 1
            code = 0 if closed == len(inherited) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.create_run("r2", [DagNode(slug="a", plugin="p")])  # the parent's are untouched
    store.close()


def test_an_in_memory_store_takes_no_side_lock(tmp_path: Path) -> None:
    store = SqliteStore(":memory:")
    store.create_run("r1", [DagNode(slug="a", plugin="p")])
    assert list(tmp_path.iterdir()) == []
    assert not list(Path(".").glob(":memory:-dagwerk.lock"))
    store.close()


# --- the synchronous option (a documented engine option) -------------------


def _pragma(store: SqliteStore) -> int:
    conn = store._sqlite._connection()
    return int(conn.execute("PRAGMA synchronous").fetchone()[0])


def test_synchronous_defaults_to_normal_and_full_is_an_option(tmp_path: Path) -> None:
    normal = SqliteStore(str(tmp_path / "n.db"))
    assert _pragma(normal) == 1  # NORMAL
    normal.close()
    full = SqliteStore(str(tmp_path / "f.db"), synchronous="full")
    assert _pragma(full) == 2  # FULL
    full.close()
    by_url = SqliteStore(f"sqlite:///{tmp_path / 'u.db'}?synchronous=extra")
    assert _pragma(by_url) == 3  # EXTRA
    by_url.close()


def test_an_unknown_synchronous_value_is_a_typed_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(InvalidStoreValueError) as raised:
        SqliteStore(str(tmp_path / "x.db"), synchronous="off")
    assert raised.value.field == "synchronous"
    with pytest.raises(InvalidStoreValueError) as raised:
        SqliteStore(f"sqlite:///{tmp_path / 'y.db'}?synchronous=off")
    assert raised.value.field == "url"
    assert not (tmp_path / "x.db").exists()


_OPENERS = 12
_OPEN = """
import os, sys, time
from dagwerk.backends.errors import StoreBusyError
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.models import DagNode
go, db, n = sys.argv[1], sys.argv[2], sys.argv[3]
deadline = time.monotonic() + 30
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.001)
store = SqliteStore(db)
store.create_run("run-" + n, [DagNode(slug="a", plugin="p")])
store.close()
"""


def test_processes_opening_a_new_database_at_once_all_succeed(tmp_path: Path) -> None:
    # Opening switches the file to WAL and migrates it; a second process doing
    # the same mid-migration used to fail with "database is locked".
    db, go = tmp_path / "new.db", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN, str(go), str(db), str(n)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(_OPENERS)
    ]
    go.touch()
    errors = []
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            errors.append(err)
    assert errors == []
    store = SqliteStore(str(db))
    runs = {r.run_id for r in store.list_runs(limit=_OPENERS)}
    assert runs == {f"run-{n}" for n in range(_OPENERS)}
    store.close()


def test_an_idle_poll_does_not_queue_behind_writers(tmp_path: Path) -> None:
    """An empty queue is found by a read: a worker polling an idle queue
    never takes (or waits for) the write lock other writers need."""
    db = tmp_path / "q.db"
    store = SqliteStore(str(db))
    store.create_run("r1", [DagNode(slug="a", plugin="p")])  # migrated, lock file made
    holder = _holder(Path(f"{db}-dagwerk.lock"))
    try:
        polled = threading.Event()

        def poll() -> None:
            assert store.dequeue("w1", limit=4, lease_seconds=30.0) == []
            polled.set()

        threading.Thread(target=poll, daemon=True).start()
        assert polled.wait(10)  # answered while another process holds the lock
    finally:
        _finish(holder)
    store.close()
