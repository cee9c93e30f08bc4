"""Durable tasks under the thread, async and process executors: a step runs
once across a retry and a wait, ``ctx.wait`` returns the response, and the
straight-line child snippet completes with one child run. Under the process
executor the plugin's process records each step by asking the worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.models import DagNode, TaskInputs
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.worker import Worker
from dagwerk.testing.helpers import new_run, only_task, root
from dagwerk.waiting import resume_task

# Module-level plugins, so a spawned plugin process can import them. The
# charges go to a file: a plugin process has a memory of its own.


def _charge(ledger: str, cents: int) -> dict[str, object]:
    with Path(ledger).open("a", encoding="utf-8") as out:
        out.write(f"{cents}\n")
    return {"charge_id": "ch_1", "cents": cents}


def checkout(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    ledger = str(ctx.execution_root / "charges")
    receipt = ctx.step("charge", _charge, ledger, 500)
    if ctx.attempt == 1:
        raise RuntimeError("flaky after the charge")
    answer = ctx.wait("approval")
    assert answer is not None
    return {"charge": receipt["charge_id"], "approved": answer["ok"]}


async def checkout_async(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    ledger = str(ctx.execution_root / "charges")

    async def charge(cents: int) -> dict[str, object]:
        return _charge(ledger, cents)

    receipt = await ctx.step("charge", charge, 500)
    if ctx.attempt == 1:
        raise RuntimeError("flaky after the charge")
    answer = ctx.wait("approval")
    assert answer is not None
    return {"charge": receipt["charge_id"], "approved": answer["ok"]}


def leaf(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    return {"value": int(str(inputs.parameters["x"])) * 10}


def parent(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    child = ctx.start_child([DagNode(slug="leaf", plugin="leaf")], input={"x": 4})
    outcome = ctx.wait_for_child(child)
    return {"value": outcome.outputs["leaf"][0]["fields"]["value"]}


_PLUGINS: dict[str, Any] = {"thread": checkout, "process": checkout, "async": checkout_async}


@pytest.mark.parametrize("executor", ["thread", "async", "process"])
def test_a_step_runs_once_across_a_retry_and_a_wait(executor: str, tmp_path: Path) -> None:
    store = MemoryStore()
    new_run(store, [root("checkout")], "r0")
    worker = Worker(store, {}, execution_root=tmp_path, executor=executor)
    policy = RetryPolicy(max_attempts=3, backoff_base=0, backoff_max=0)
    worker.plugins.register("checkout", _PLUGINS[executor], retry=policy)
    try:
        worker.run_until_idle()
        task = only_task(store, "r0", 0)
        assert task.status is TaskStatus.WAITING, task.error
        assert resume_task(
            store,
            task.task_id,
            "approval",
            expected_attempt_id=task.attempt_id,
            expected_generation=task.generation,
            response={"ok": True},
        )
        worker.run_until_idle()
    finally:
        worker.stop()
    assert store.get_run_status("r0") is RunStatus.COMPLETED, only_task(store, "r0", 0).error
    (out,) = store.resolve_outputs("r0", store.get_output_ids("r0", 0)).values()
    assert out.fields == {"charge": "ch_1", "approved": True}
    assert (tmp_path / "charges").read_text(encoding="utf-8").splitlines() == ["500"]
    journal = store.get_task_journal(task.task_id)
    assert journal is not None and [s.name for s in journal.steps] == ["charge"]


@pytest.mark.parametrize("executor", ["thread", "async", "process"])
def test_the_straight_line_child_snippet_completes(executor: str, tmp_path: Path) -> None:
    store = MemoryStore()
    new_run(store, [root("parent")], "r0")
    worker = Worker(
        store, {"parent": parent, "leaf": leaf}, execution_root=tmp_path, executor=executor
    )
    try:
        worker.run_until_idle()
    finally:
        worker.stop()
    assert store.get_run_status("r0") is RunStatus.COMPLETED
    (out,) = store.resolve_outputs("r0", store.get_output_ids("r0", 0)).values()
    assert out.fields == {"value": 40}
    assert len(store.list_child_runs("r0")) == 1
