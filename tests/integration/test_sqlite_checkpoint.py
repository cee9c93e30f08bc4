"""WAL checkpoints run on a background thread, not in the commits.

SQLite's default (checkpoint in the commit that takes the log past 1,000
pages) stalled one commit in a few dozen by the copy of every changed page,
with the engine's writer lock held. These tests show that the writers no
longer checkpoint at 1,000 pages, that the background thread copies the log
into the database file, that the log stays bounded by the writers' backstop,
and that closing the gateway stops the thread.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dagwerk.backends.sqlite import _checkpoint
from dagwerk.backends.sqlite._checkpoint import BACKSTOP_PAGES, COMMITS_PER_PASS
from dagwerk.backends.sqlite.gateway import SqliteGateway
from dagwerk.testing.waits import wait_until

_PAGE = 4096


def _gateway(tmp_path: Path) -> SqliteGateway:
    gateway = SqliteGateway(str(tmp_path / "db.sqlite"))
    with gateway.write() as tx:
        tx._conn.execute("CREATE TABLE blobs (id INTEGER PRIMARY KEY, body BLOB)")
    return gateway


def _write_pages(gateway: SqliteGateway, commits: int, pages_each: int) -> None:
    for _ in range(commits):
        with gateway.write() as tx:
            tx._conn.execute(
                "INSERT INTO blobs (body) VALUES (?)", (os.urandom(_PAGE * pages_each),)
            )


def _log_pages(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size // _PAGE if wal.exists() else 0


def _file_pages(path: Path) -> int:
    """Pages in the database file itself: a checkpoint copies the log there."""
    return path.stat().st_size // _PAGE


def test_writers_checkpoint_only_at_the_backstop(tmp_path: Path) -> None:
    gateway = _gateway(tmp_path)
    try:
        with gateway.read() as tx:
            pages = tx._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        assert pages == BACKSTOP_PAGES > 1000
    finally:
        gateway.close()


def test_the_background_thread_copies_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_checkpoint, "IDLE_SECONDS", 60.0)  # only commits wake it
    gateway = _gateway(tmp_path)
    db = tmp_path / "db.sqlite"
    try:
        checkpointer = gateway.checkpointer
        assert checkpointer is not None
        # Past SQLite's default threshold of 1,000 pages, in fewer commits
        # than wake the thread: no commit checkpointed, the log holds it all.
        _write_pages(gateway, COMMITS_PER_PASS - 2, 25)
        assert _log_pages(db) > 1000
        assert _file_pages(db) < 10
        assert checkpointer.passes == 0
        _write_pages(gateway, 2, 1)
        wait_until(lambda: checkpointer.passes >= 1, "a background checkpoint")
        assert _file_pages(db) > 1000
    finally:
        gateway.close()


def test_an_idle_database_is_checkpointed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint, "IDLE_SECONDS", 0.05)
    gateway = _gateway(tmp_path)
    try:
        _write_pages(gateway, 3, 2)
        checkpointer = gateway.checkpointer
        assert checkpointer is not None
        wait_until(lambda: checkpointer.passes >= 1, "an idle checkpoint")
        assert _file_pages(tmp_path / "db.sqlite") > 6
    finally:
        gateway.close()


def test_the_log_stays_bounded_under_constant_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writers' backstop alone: the background thread stays asleep (a
    # checkpoint of its under way when a writer's falls due makes the
    # writer leave the copy to a later commit, which is timing, not the
    # bound under test).
    monkeypatch.setattr(_checkpoint, "COMMITS_PER_PASS", 1 << 30)
    monkeypatch.setattr(_checkpoint, "IDLE_SECONDS", 3600.0)
    gateway = _gateway(tmp_path)
    try:
        # Three times the backstop's worth of pages, written without a pause.
        _write_pages(gateway, 3 * BACKSTOP_PAGES // 16, 16)
        assert _log_pages(tmp_path / "db.sqlite") <= 1.5 * BACKSTOP_PAGES
    finally:
        gateway.close()


def test_close_stops_the_thread(tmp_path: Path) -> None:
    gateway = _gateway(tmp_path)
    checkpointer = gateway.checkpointer
    assert checkpointer is not None
    _write_pages(gateway, 1, 1)
    thread = checkpointer._thread
    assert thread is not None and thread.is_alive()
    gateway.close()
    assert not thread.is_alive()


def test_memory_and_read_only_gateways_have_no_thread(tmp_path: Path) -> None:
    memory = SqliteGateway(":memory:")
    assert memory.checkpointer is None
    memory.close()
    _gateway(tmp_path).close()
    reader = SqliteGateway(str(tmp_path / "db.sqlite"), read_only=True)
    try:
        assert reader.checkpointer is None
    finally:
        reader.close()
