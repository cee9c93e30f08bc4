"""``dagwerk gc`` in several processes at once, next to a worker process that
finishes other runs, on SQLite and PostgreSQL: each old run is deleted by
exactly one of them, nothing of it is left in any table, and every run the
worker finished is whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dagwerk.backends.postgres import PostgresStore
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.lineage import RunLink
from dagwerk.orchestrator import abort_run
from dagwerk.testing.helpers import CallbackLog, FakeWorker, chain, child, new_run, root
from dagwerk.testing.table_rows import TableRows, postgres_rows, sqlite_rows

DAY = 86_400.0
OLD_RUNS = 120
NEW_RUNS = 12
GC_PROCESSES = 3

_PLUGINS = """\
import dagwerk


@dagwerk.plugin("fan")
def fan(inputs, ctx):
    return [{"v": 1}, {"v": 2}]
"""

_FAN = [
    root("a", plugin="fan"),
    child("b", "a", plugin="fan"),
    child("c", "b", plugin="fan"),
]


class _Backend:
    def __init__(
        self,
        args: list[str],
        open_store: Callable[..., Any],
        engine: Callable[[], Engine],
        rows: Callable[[], TableRows],
    ) -> None:
        self.args = args
        self.open_store = open_store
        self.engine = engine
        self.rows = rows


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[_Backend]:
    if request.param == "sqlite":
        path = tmp_path / "gc.db"
        url = f"sqlite:///{path}"
        yield _Backend(
            ["--db", url],
            lambda **kw: SqliteStore(path, **kw),
            lambda: Engine(url),
            lambda: sqlite_rows(str(path)),
        )
        return
    postgres_url: str = request.getfixturevalue("postgres_url")
    schema: str = request.getfixturevalue("pg_schema")
    yield _Backend(
        ["--db", postgres_url, "--schema", schema],
        lambda **kw: PostgresStore(postgres_url, schema=schema, **kw),
        lambda: Engine(postgres_url, schema=schema),
        lambda: postgres_rows(postgres_url, schema),
    )


def _old_runs(backend: _Backend) -> None:
    """Runs that finished ten days ago: plain ones, and parents with a child."""
    ten_days_ago = time.time() - 10 * DAY
    store = backend.open_store(clock=lambda: ten_days_ago)
    try:
        for n in range(OLD_RUNS - 20):
            log = new_run(store, chain(2), f"old-{n}")
            FakeWorker(store, log).drain(f"old-{n}")
        for n in range(10):
            parent, kid = f"old-parent-{n}", f"old-parent-{n}-kid"
            new_run(store, chain(1), parent)
            link = RunLink(
                run_id=kid,
                parent_run_id=parent,
                parent_task_id=f"{parent}:0:0:0",
                root_run_id=parent,
                lineage="{}",
            )
            assert store.create_child_run(kid, chain(1), link=link)
            for run_id in (kid, parent):
                abort_run(store, run_id=run_id, reason="old", callbacks=CallbackLog().callbacks)
    finally:
        store.close()


def _spawn(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dagwerk", *args],
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if k != "DAGWERK_DEBUG"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    return out


def test_gc_processes_at_once_delete_each_run_once_next_to_a_worker(
    backend: _Backend, tmp_path: Path
) -> None:
    _old_runs(backend)
    (tmp_path / "fan_plugins.py").write_text(_PLUGINS)
    with backend.engine() as engine:
        fresh = [engine.submit(_FAN, {}, run_id=f"new-{n}") for n in range(NEW_RUNS)]
    worker = _spawn(tmp_path, "worker", *backend.args, "--plugins", "fan_plugins.py", "--burst")
    cleaners = [
        _spawn(tmp_path, "gc", *backend.args, "--older-than", "1d", "--batch-size", "5", "--json")
        for _ in range(GC_PROCESSES)
    ]
    reports = [json.loads(_finish(cleaner)) for cleaner in cleaners]
    _finish(worker)
    # Each old run was deleted by exactly one process.
    assert sum(report["runs"] for report in reports) == OLD_RUNS
    assert sum(report["rows"].get("runs", 0) for report in reports) == OLD_RUNS
    left = [
        (table, row)
        for table, rows in backend.rows().items()
        for row in rows
        if any(isinstance(value, str) and value.startswith("old-") for value in row)
    ]
    assert left == []
    with backend.engine() as engine:
        assert {run.run_id for run in engine.list_runs(limit=100)} == set(fresh)
        for run_id in fresh:
            assert engine.get_run(run_id).status is RunStatus.COMPLETED  # type: ignore[union-attr]
            tasks = engine.list_tasks(run_id)
            assert [sum(t.node_index == i for t in tasks) for i in range(3)] == [1, 2, 4]
            assert len(engine.result(run_id).outputs["c"]) == 8
