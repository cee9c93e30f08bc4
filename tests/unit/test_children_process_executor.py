"""Child runs started by a plugin that runs under the process executor.

The plugin's context is a copy in a spawned process; its child requests
travel back with the wait outcome and the worker process commits them, so
``ctx.run_child`` works exactly as under the thread executor.
"""

from __future__ import annotations

from pathlib import Path

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.models import DagNode, TaskInputs
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.worker import Worker
from dagwerk.testing.helpers import new_run, only_task, root

# Module-level plugins, so the spawned plugin process can import them.


def leaf(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    return {"value": int(str(inputs.parameters.get("x", 0))) + 1}


def parent(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    result = ctx.child_result()
    if result is None:
        ctx.run_child([DagNode(slug="leaf", plugin="leaf")], {"x": 41})
    assert result is not None
    return {"child": result.status.value, "value": result.outputs["leaf"][0]["fields"]["value"]}


class _Opaque:
    """Cannot be pickled, so a child request carrying it cannot travel back."""

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("not picklable")


def unsendable(inputs: TaskInputs, ctx: TaskContext) -> None:
    ctx.run_child([DagNode(slug="leaf", plugin="leaf")], {"x": _Opaque()})


def test_process_executor_plugin_starts_and_waits_for_a_child(tmp_path: Path) -> None:
    store = MemoryStore()
    new_run(store, [root("p")], "parent")
    worker = Worker(store, {"p": parent, "leaf": leaf}, execution_root=tmp_path, executor="process")
    try:
        worker.run_until_idle()
    finally:
        worker.stop()
    assert store.get_run_status("parent") is RunStatus.COMPLETED
    (kid,) = store.list_child_runs("parent")
    assert store.get_run_status(kid) is RunStatus.COMPLETED
    (out,) = store.resolve_outputs("parent", store.get_output_ids("parent", 0)).values()
    assert out.fields == {"child": "completed", "value": 42}


def test_process_executor_unsendable_child_request_fails_the_task(tmp_path: Path) -> None:
    """A request that cannot cross the process boundary is a task failure with
    code child_run_invalid, never a wait for a child that was not stored."""
    store = MemoryStore()
    new_run(store, [root("p")], "parent")
    worker = Worker(
        store, {"p": unsendable, "leaf": leaf}, execution_root=tmp_path, executor="process"
    )
    try:
        worker.run_until_idle()
    finally:
        worker.stop()
    task = only_task(store, "parent", 0)
    assert task.status is TaskStatus.FAILED
    assert "child_run_invalid" in (task.error or "")
    assert store.list_child_runs("parent") == []
