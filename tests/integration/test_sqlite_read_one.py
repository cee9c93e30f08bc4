"""A lone read on SQLite runs as one statement, without ``BEGIN`` and
``COMMIT`` (``SqliteGateway.read_one``): the worker reads a run's
status before every attempt."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import RunStatus
from dagwerk.testing.helpers import chain


def _traced(store: SqliteStore) -> list[str]:
    statements: list[str] = []
    store._sqlite._connection().set_trace_callback(statements.append)
    return statements


def test_a_run_status_is_one_statement_and_leaves_no_transaction_open(tmp_path: Path) -> None:
    with SqliteStore(str(tmp_path / "db.sqlite")) as store:
        assert store.create_run("r1", chain(1))
        statements = _traced(store)
        assert store.get_run_status("r1") is RunStatus.PENDING
        assert store.get_run_status("nope") is None
        assert len(statements) == 2, statements
        assert not any(s.startswith(("BEGIN", "COMMIT")) for s in statements)
        assert not store._sqlite._connection().in_transaction


def test_a_lone_read_sees_other_connections_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "db.sqlite")
    with SqliteStore(path) as store, SqliteStore(path) as other:
        assert store.get_run_status("r1") is None
        assert other.create_run("r1", chain(1))
        assert store.get_run_status("r1") is RunStatus.PENDING
        # The read ended with its statement: no snapshot of the reader's
        # holds the log back from a full checkpoint after a later commit.
        assert other.create_run("r2", chain(1))
        raw = sqlite3.connect(tmp_path / "db.sqlite", timeout=0, isolation_level=None)
        try:
            busy, _, _ = raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            raw.close()
        assert busy == 0


def test_inside_a_unit_that_wrote_a_lone_read_sees_the_units_writes(tmp_path: Path) -> None:
    path = str(tmp_path / "db.sqlite")
    with SqliteStore(path) as store, SqliteStore(path) as other:
        with store.unit_of_work():
            assert store.get_run_status("r1") is None  # before any write
            assert store.create_run("r1", chain(1))
            assert store.get_run_status("r1") is RunStatus.PENDING
            assert other.get_run_status("r1") is None
        assert other.get_run_status("r1") is RunStatus.PENDING
