"""A SQLite store's connection is closed by close(), by leaving its ``with``
block, or, for a store dropped without either, when it is collected."""

from __future__ import annotations

import gc
import sqlite3
from pathlib import Path

import pytest

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import RunStatus
from dagwerk.models import DagNode

_NODES = [DagNode(slug="a", plugin="p")]


def test_a_store_dropped_without_close_closes_its_connection_when_collected(
    tmp_path: Path,
) -> None:
    # Python 3.13 warns (ResourceWarning) about a connection collected open.
    db = tmp_path / "db.sqlite"
    store = SqliteStore(str(db))
    assert store.create_run("r1", _NODES)
    connection = store._sqlite._conn
    assert connection is not None
    del store
    gc.collect()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        connection.execute("SELECT 1")
    with SqliteStore(str(db)) as again:  # the data is all there
        assert again.get_run_status("r1") is RunStatus.PENDING


def test_close_closes_the_connection_once(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "db.sqlite"))
    connection = store._sqlite._conn
    assert connection is not None
    store.close()
    store.close()  # idempotent
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        connection.execute("SELECT 1")
