"""A SQLite database file removed or replaced under an open store: every
call raises ``StoreGoneError`` (a fatal fault) within the check interval,
no empty database is made at the path, and a worker of the process stops
while ``/healthz`` names the fault."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dagwerk.backends.errors import StoreGoneError
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.backends.sqlite.errors import PLACE_CHECK_SECONDS
from dagwerk.engine import Engine
from dagwerk.health import HealthState
from dagwerk.runtime.faults import FaultKind, classify

PROBE = "no-such-run"


def _raises_gone(store: SqliteStore) -> bool:
    try:
        store.get_run_status(PROBE)
    except StoreGoneError:
        return True
    return False


def _within(seconds: float, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"not within {seconds}s"
        time.sleep(0.02)


@pytest.mark.parametrize("how", ["file removed", "directory removed", "file replaced"])
def test_a_database_no_longer_at_its_path_is_a_fatal_fault(tmp_path: Path, how: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = data / "dagwerk.db"
    store = SqliteStore(f"sqlite:///{db}")
    try:
        assert store.get_run_status(PROBE) is None
        if how == "file removed":
            db.unlink()
        elif how == "directory removed":
            shutil.rmtree(data)
        else:
            other = tmp_path / "other.db"
            sqlite3.connect(other).close()
            os.replace(other, db)
        _within(PLACE_CHECK_SECONDS + 5, lambda: _raises_gone(store))
        with pytest.raises(StoreGoneError) as caught:
            store.get_run_status(PROBE)  # it stays gone
        error = caught.value
        assert classify(error) is FaultKind.FATAL
        assert error.target == str(db) and str(db) in str(error)
        assert ("replaced" if how == "file replaced" else "removed") in str(error)
        if how == "file removed":
            assert not db.exists()
    finally:
        store.close()


def test_a_worker_stops_on_a_removed_database_and_health_reports_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with Engine(f"sqlite:///{data / 'dagwerk.db'}", execution_root=tmp_path) as engine:
        worker = engine.worker(concurrency=1)
        health = HealthState(engine.store, faults=[worker.faults])
        worker.start()
        try:
            assert worker.faults.current is None
            shutil.rmtree(data)
            _within(PLACE_CHECK_SECONDS + 10, lambda: worker.faults.fatal is not None)
            healthy, document = health.check()
        finally:
            worker.stop()
    assert isinstance(worker.faults.fatal, StoreGoneError)
    assert not healthy
    fault = document["fault"]
    assert isinstance(fault, dict) and fault["code"] == "store_gone", document
    assert fault["kind"] == "fatal" and "start again" in str(fault["line"])
    assert document["database_reachable"] is False
