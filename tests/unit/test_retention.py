"""Retention through its public surface: ``Engine.delete_runs``, ``dagwerk
gc``, ``worker --retention`` and the age settings they take."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.capabilities import StoreCapabilities
from dagwerk.cli import cli
from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.orchestrator import abort_run
from dagwerk.runtime.clock import SystemClock
from dagwerk.runtime.retention import (
    PeriodicRetention,
    RetentionConfigError,
    RetentionPolicy,
    parse_age,
)
from dagwerk.runtime.worker import Worker
from dagwerk.testing.helpers import CallbackLog, FakeWorker, chain, new_run

DAY = 86_400.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30d", 30 * DAY),
        ("12h", 12 * 3600.0),
        ("90m", 5400.0),
        ("45s", 45.0),
        ("2w", 14 * DAY),
        ("1.5h", 5400.0),
        ("10", 10.0),
        (" 7d ", 7 * DAY),
        (0, 0.0),
        (2.5, 2.5),
        (timedelta(days=1), DAY),
    ],
)
def test_an_age_is_seconds_a_timedelta_or_a_number_with_a_unit(
    value: object, seconds: float
) -> None:
    assert parse_age(value) == seconds


@pytest.mark.parametrize("value", ["30x", "d", "-1d", "", "1e3d", -1, float("inf"), True, None])
def test_anything_else_is_a_typed_error_naming_the_field(value: object) -> None:
    with pytest.raises(RetentionConfigError) as caught:
        parse_age(value, field="retention")
    assert caught.value.field == "retention"
    assert caught.value.code == "invalid_retention"


@pytest.fixture
def old_db(tmp_path: Path) -> str:
    """A database with two runs that finished ten days ago (one completed, one
    failed) and one that finished now."""
    path = tmp_path / "gc.db"
    then = time.time() - 10 * DAY
    with SqliteStore(path, clock=lambda: then) as store:
        FakeWorker(store, new_run(store, chain(2), "old-done")).drain()
        new_run(store, chain(2), "old-failed")
        abort_run(store, run_id="old-failed", reason="x", callbacks=CallbackLog().callbacks)
    with SqliteStore(path) as store:
        FakeWorker(store, new_run(store, chain(2), "recent")).drain()
    return f"sqlite:///{path}"


def _gc(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["gc", *args])
    return result.exit_code, result.output


def _runs(url: str) -> set[str]:
    with Engine(url) as engine:
        return {run.run_id for run in engine.list_runs()}


def test_gc_deletes_old_finished_runs_and_says_how_much(old_db: str) -> None:
    code, out = _gc("--older-than", "1d", "--dry-run", "--db", old_db)
    assert (code, out) == (0, "would delete 2 runs (nothing deleted: --dry-run)\n")
    assert _runs(old_db) == {"old-done", "old-failed", "recent"}
    code, out = _gc("--older-than", "1d", "--db", old_db)
    assert code == 0
    assert out == "deleted 2 runs (3 launches, 4 nodes, 2 outputs, 3 tasks)\n"
    assert _runs(old_db) == {"recent"}
    assert _gc("--older-than", "1d", "--db", old_db) == (0, "deleted 0 runs\n")


def test_gc_takes_statuses_and_reports_json(old_db: str) -> None:
    code, out = _gc("--older-than", "7d", "--status", "failed", "--json", "--db", old_db)
    assert code == 0
    report = json.loads(out)
    assert report["runs"] == 1 and report["rows"]["runs"] == 1
    assert report["statuses"] == ["failed"]
    assert report["older_than_seconds"] == 7 * DAY
    assert report["dry_run"] is False
    assert _runs(old_db) == {"old-done", "recent"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "soon"], "--older-than must be an age such as 30d"),
        (["--older-than", "1d", "--status", "running"], "--status takes terminal statuses"),
        (["--older-than", "1d", "--status", ","], "--status takes terminal statuses"),
    ],
)
def test_gc_refuses_bad_input(old_db: str, args: list[str], message: str) -> None:
    code, out = _gc(*args, "--db", old_db)
    assert code == 2
    assert message in out
    assert _runs(old_db) == {"old-done", "old-failed", "recent"}


def test_worker_retention_takes_an_age(old_db: str) -> None:
    result = CliRunner().invoke(cli, ["worker", "--db", old_db, "--retention", "often", "--burst"])
    assert result.exit_code == 2
    assert "--retention must be an age such as 30d" in result.output


def test_engine_delete_runs_returns_a_summary(old_db: str) -> None:
    with Engine(old_db) as engine:
        dry = engine.delete_runs("1d", dry_run=True)
        assert (dry.runs, dry.dry_run, dry.complete) == (2, True, True)
        done = engine.delete_runs(timedelta(days=1), statuses=[RunStatus.COMPLETED], batch_size=1)
        assert (done.runs, done.rows["tasks"], done.batches) == (1, 2, 1)
        assert engine.get_run("old-done") is None
        assert engine.get_run("old-failed") is not None


class _NoRetention:
    """A store of the seed's protocols only."""

    def get_run_status(self, run_id: str) -> None:
        return None


def test_a_worker_on_a_store_without_retention_says_so() -> None:
    with pytest.raises(RetentionConfigError) as caught:
        PeriodicRetention.for_worker(
            StoreCapabilities.of(_NoRetention()), "30d", clock=SystemClock(), holder="w"
        )
    assert caught.value.field == "retention"


def test_a_worker_checks_its_retention_setting(tmp_path: Path) -> None:
    with Engine("memory://") as engine:
        for bad, field in (("-1d", "older_than"), (RetentionPolicy("1d", interval=0), "interval")):
            with pytest.raises(RetentionConfigError) as caught:
                Worker(engine.store, {}, execution_root=tmp_path, retention=bad)
            assert caught.value.field == field
        worker = Worker(engine.store, {}, execution_root=tmp_path, retention="30d")
        assert worker.retention is not None and worker.retention.older_than == 30 * DAY
        assert Worker(engine.store, {}, execution_root=tmp_path).retention is None
