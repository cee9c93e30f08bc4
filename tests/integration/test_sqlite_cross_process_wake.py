"""Another process's commit wakes this process's waiting dequeues at once
(Linux inotify on the write-ahead log). Before, only the
``data_version`` poll found it, up to 50 ms later for an idle worker."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dagwerk.backends.sqlite import _wake
from dagwerk.backends.sqlite.gateway import SqliteGateway
from dagwerk.testing.waits import wait_until

pytestmark = pytest.mark.skipif(not _wake.available(), reason="needs Linux inotify")

_WRITE = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("INSERT INTO notes (body) VALUES ('from another process')")
conn.close()
"""


def _waiting(gateway: SqliteGateway, seconds: float = 10.0) -> threading.Thread:
    """A dequeue's wait: wait_for_work until the epoch moves (or time is up)."""
    since = gateway.work_epoch()

    def wait() -> None:
        deadline = time.monotonic() + seconds
        while gateway.work_epoch() == since and time.monotonic() < deadline:
            gateway.wait_for_work(1.0, since)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def _gateway(db: Path) -> SqliteGateway:
    gateway = SqliteGateway(str(db))
    with gateway.write() as tx:
        tx._conn.execute("CREATE TABLE IF NOT EXISTS notes (body TEXT)")
    return gateway


def _write_from_another_process(db: Path) -> None:
    subprocess.run([sys.executable, "-c", _WRITE, str(db)], check=True, timeout=60)


def test_a_commit_of_another_process_wakes_the_waiters(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    gateway = _gateway(db)
    try:
        gateway.wait_for_work(0.001)  # a worker waited once: the watcher runs
        delivered = _wake.delivered()
        before = gateway.work_epoch()
        waiter = _waiting(gateway)
        wait_until(lambda: _wake._current().waiting > 0, "the dequeue to wait")
        _write_from_another_process(db)
        # The epoch moves without any commit of this process: the waiting
        # dequeue wakes now, not at its next poll.
        wait_until(lambda: gateway.work_epoch() != before, "the cross-process wake-up")
        assert _wake.delivered() > delivered
        waiter.join(10)
    finally:
        gateway.close()


def test_other_files_in_the_directory_do_not_wake(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    gateway = _gateway(db)
    try:
        gateway.wait_for_work(0.001)
        waiter = _waiting(gateway)
        wait_until(lambda: _wake._current().waiting > 0, "the dequeue to wait")
        other = tmp_path / "unrelated.txt"
        before = _wake.delivered()
        for n in range(50):
            other.write_text(str(n))
        _write_from_another_process(db)
        wait_until(lambda: _wake.delivered() > before, "the wake-up of the database write")
        # The 50 unrelated writes woke nobody: a database write is a short
        # burst of events, read at once or in a few reads.
        assert _wake.delivered() <= before + 3
        waiter.join(10)
    finally:
        gateway.close()


def test_the_last_gateway_to_close_ends_the_watch(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    first, second = _gateway(db), _gateway(db)
    first.wait_for_work(0.001)
    watching = _wake.thread()
    assert watching is not None and watching.is_alive()
    first.close()
    before = second.work_epoch()
    waiter = _waiting(second)
    wait_until(lambda: _wake._current().waiting > 0, "the dequeue to wait")
    _write_from_another_process(db)  # still woken: the second gateway is open
    wait_until(lambda: second.work_epoch() != before, "the wake-up for the open gateway")
    waiter.join(10)
    second.close()
    # The database's directory is no longer watched ...
    assert os.fsencode(os.path.realpath(tmp_path)) not in _wake._current().directories
    # ... and with nothing left to watch the thread ends (unless another
    # gateway of this process still waits for work).
    if not _wake._current().wakes:
        watching.join(5)
        assert not watching.is_alive()
