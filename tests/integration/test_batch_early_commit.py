"""A batch's results do not wait for its slowest attempt: on SQLite, with an
in-process worker at its default concurrency, the attempts that return while
another of their batch still runs commit before it ends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagwerk.constants import InputMode, RunStatus, TaskStatus
from dagwerk.engine import Engine
from dagwerk.models import DagNode, EdgeSource, InputEdge, TaskInputs
from dagwerk.runtime.context import TaskContext
from dagwerk.testing.waits import wait_until

ITEMS = 4  # one batch of the default concurrency: one slow item, three instant


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(f"sqlite:///{tmp_path / 'early.db'}", execution_root=tmp_path)
    try:
        yield engine
    finally:
        engine.close()


def test_instant_attempts_commit_while_the_slow_one_of_their_batch_runs(
    engine: Engine,
) -> None:
    release = threading.Event()
    entered: dict[int, str] = {}  # item -> the thread its plugin ran on

    @engine.plugin("early_gen")
    def gen(inputs: TaskInputs, ctx: TaskContext) -> object:
        return [{"n": n} for n in range(ITEMS)]

    @engine.plugin("early_item")
    def item(inputs: TaskInputs, ctx: TaskContext) -> object:
        n = int(str(inputs.parameters["n"]))
        entered[n] = threading.current_thread().name
        if n == 0:
            release.wait(30)  # the slow one: 2 s or more, until the test lets it go
        return {"n": n}

    nodes = [
        DagNode(slug="gen", plugin="early_gen"),
        DagNode(
            slug="item",
            plugin="early_item",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="items", source="gen"),),
            bindings={"n": EdgeSource(edge="items", field="n")},
        ),
    ]
    worker = engine.worker()  # concurrency 4, thread executor
    run_id = engine.submit(nodes, {})
    worker.start()
    try:
        wait_until(lambda: 0 in entered, "the slow attempt to start", timeout=30)

        def items() -> dict[int, TaskStatus]:
            return {
                int(str(task.plan.parameters["n"])): task.status
                for task in engine.store.list_tasks(run_id)
                if task.node_index == 1 and task.plan is not None
            }

        wait_until(
            lambda: sum(s is TaskStatus.COMPLETED for s in items().values()) == ITEMS - 1,
            "the instant attempts to commit",
            timeout=1.5,  # well before a 2 s attempt would end
        )
        assert items()[0] is TaskStatus.RUNNING  # committed while the slow one ran
        assert sorted(entered) == list(range(ITEMS))
        release.set()
        assert engine.wait(run_id, timeout=30).status is RunStatus.COMPLETED
    finally:
        release.set()
        worker.stop(10)
