"""The worker runtime on a SQLite file (same behaviours as on the memory store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_worker_memory import NODES, _registry, _start

from dagwerk.backends.sqlite.store import SqliteStore
from dagwerk.constants import RunStatus
from dagwerk.models import DagNode, TaskInputs
from dagwerk.runtime.clock import FakeClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.plugins import PluginRegistry
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.worker import Worker


@pytest.mark.parametrize("concurrency", [1, 4])
def test_example_pipeline_completes_on_sqlite(tmp_path: Path, concurrency: int) -> None:
    clock = FakeClock()
    store = SqliteStore(str(tmp_path / "dag.db"), clock=clock.time)
    worker = Worker(
        store, _registry(), concurrency=concurrency, clock=clock, execution_root=tmp_path
    )
    _start(store, "run-1", NODES, titles=["alpha", "beta", "gamma"])
    assert worker.run_until_idle() == 6
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    (page_id,) = store.get_output_ids("run-1", 3)
    page = store.resolve_outputs("run-1", (page_id,))[page_id]
    assert page.fields["text"] == "ALPHA | BETA | GAMMA"


def test_retry_succeeds_on_the_third_attempt_on_sqlite(tmp_path: Path) -> None:
    seen: list[int] = []

    def flaky(inputs: TaskInputs, ctx: TaskContext) -> object:
        seen.append(ctx.attempt)
        if len(seen) < 3:
            raise ConnectionError("flaky")
        return {"ok": True}

    registry = PluginRegistry()
    registry.register("flaky", flaky, retry=RetryPolicy(max_attempts=3))
    clock = FakeClock()
    store = SqliteStore(str(tmp_path / "dag.db"), clock=clock.time)
    worker = Worker(store, registry, clock=clock, execution_root=tmp_path)
    _start(store, "run-r", [DagNode(slug="a", plugin="flaky")])
    for _ in range(3):
        worker.run_until_idle()
        clock.advance(60)
    assert seen == [1, 2, 3]
    assert store.get_run_status("run-r") is RunStatus.COMPLETED
