"""A worker *process* started after the parent runs were created enforces the
persisted lineage: depth (CL-01) and ancestor cancellation (CL-02), on
SQLite and on PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.lineage import RunLineage, RunLink, child_lineage, encode_lineage, pipeline_identity
from dagwerk.orchestrator import cancel_run, start_run
from dagwerk.testing.helpers import CallbackLog, new_run, only_task, root

_WORKER = textwrap.dedent(
    """
    import sys
    from dagwerk.runtime.worker import Worker

    if sys.argv[4]:
        from dagwerk.backends.postgres import PostgresStore
        store = PostgresStore(sys.argv[1], schema=sys.argv[4])
    else:
        from dagwerk.backends.sqlite import SqliteStore
        store = SqliteStore(sys.argv[1])
    def leaf(inputs, ctx):
        open(sys.argv[3], "a").write(ctx.run_id + "\\n")
        return {"ok": 1}
    def hold(inputs, ctx):
        ctx.wait("hold")
    worker = Worker(store, {"leaf": leaf, "mid": leaf, "p": hold},
                    execution_root=sys.argv[2], max_child_depth=1)
    worker.run_until_idle()
    store.close()
    """
)


def _child(store: Any, run_id: str, parent: str, above: RunLineage | None, slug: str) -> RunLineage:
    lineage = child_lineage(
        above,
        parent_run_id=parent,
        parent_task_id=f"{parent}-t",
        parent_pipeline_id="p" if above is None else above.pipeline_id,
        pipeline_id=pipeline_identity([root(slug)]),
    )
    link = RunLink(run_id, parent, f"{parent}-t", lineage.root_run_id, encode_lineage(lineage))
    assert store.create_child_run(run_id, [root(slug)], link=link)
    start_run(store, run_id, callbacks=CallbackLog().callbacks)
    return lineage


Opener = Callable[[], Any]


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, Opener]]:
    """``(url, schema, open_store)``; ``schema`` is empty for SQLite."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'runs.db'}"
        yield url, "", lambda: SqliteStore(url)
        return
    from dagwerk.backends.postgres import PostgresStore

    pg_url: str = request.getfixturevalue("postgres_url")
    schema = f"lineage_proc_{uuid.uuid4().hex[:12]}"
    try:
        yield pg_url, schema, lambda: PostgresStore(pg_url, schema=schema)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_cl_01_cl_02_worker_process_started_later_enforces_lineage(
    tmp_path: Path, backend: tuple[str, str, Opener]
) -> None:
    url, schema, open_store = backend
    store = open_store()
    new_run(store, [root("p")], "r0")
    first = _child(store, "r1", "r0", None, "mid")
    _child(store, "r2", "r1", first, "leaf")  # depth 2 > the worker's limit 1
    new_run(store, [root("p")], "gone")
    assert cancel_run(store, "gone")
    _child(store, "orphan", "gone", None, "leaf")  # its root is committed cancelled
    store.close()
    ran = tmp_path / "ran.txt"
    ran.touch()
    subprocess.run(
        [sys.executable, "-c", _WORKER, url, str(tmp_path), str(ran), schema],
        check=True,
        timeout=120,
    )
    store = open_store()
    try:
        assert ran.read_text().split() == ["r1"]
        depth_task = only_task(store, "r2", 0)
        assert depth_task.status is TaskStatus.FAILED
        assert "child_depth_exceeded" in (depth_task.error or "")
        assert store.get_run_status("orphan") is RunStatus.CANCELLED
        assert only_task(store, "orphan", 0).status is TaskStatus.CANCELLED
    finally:
        store.close()
