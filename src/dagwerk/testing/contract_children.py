"""Contract tests: composite child runs and persisted lineage (CL-01..CL-06).

Every test drives the store through a real :class:`~dagwerk.runtime.worker.Worker`
or the store protocols, so memory, SQLite and PostgreSQL prove the same rules.
A *fresh* worker (one that never saw the parent) executes the child runs,
so limits come from the persisted lineage, never from process state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.lineage import (
    Ancestor,
    RunLineage,
    RunLink,
    child_lineage,
    child_wait_id,
    encode_lineage,
    pipeline_identity,
)
from dagwerk.models import TaskInputs
from dagwerk.orchestrator import cancel_run, on_task_complete, start_run
from dagwerk.runtime import children as children_module
from dagwerk.runtime.backstop import Backstop
from dagwerk.runtime.children import ChildPipeline
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.worker import Worker
from dagwerk.store import DagChildStore
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    child,
    claim,
    emit,
    new_run,
    only_task,
    root,
)

_LEAF = [root("leaf")]


def _worker(store: ContractStore, tmp_path: Path, plugins: dict[str, Any], **kw: Any) -> Worker:
    return Worker(store, plugins, execution_root=tmp_path, lease_seconds=30, **kw)


def _leaf(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    return {"value": 42}


def _boom(inputs: TaskInputs, ctx: TaskContext) -> None:
    raise RuntimeError("child exploded")


def _link(run_id: str, lineage: RunLineage | str, parent: str, task: str = "t") -> RunLink:
    text = lineage if isinstance(lineage, str) else encode_lineage(lineage)
    root_id = lineage.root_run_id if isinstance(lineage, RunLineage) else parent
    return RunLink(
        run_id=run_id, parent_run_id=parent, parent_task_id=task, root_run_id=root_id, lineage=text
    )


def _child_of(
    store: ContractStore, run_id: str, parent: RunLineage | None, parent_run: str, nodes: Any
) -> RunLineage:
    """Create and start ``run_id`` as a child of ``parent_run``; its lineage."""
    lineage = child_lineage(
        parent,
        parent_run_id=parent_run,
        parent_task_id=f"{parent_run}-task",
        parent_pipeline_id=pipeline_identity([root("p")]) if parent is None else parent.pipeline_id,
        pipeline_id=pipeline_identity(nodes),
    )
    link = RunLink(
        run_id=run_id,
        parent_run_id=parent_run,
        parent_task_id=f"{parent_run}-task",
        root_run_id=lineage.root_run_id,
        lineage=encode_lineage(lineage),
    )
    assert isinstance(store, DagChildStore)
    assert store.create_child_run(run_id, nodes, link=link)
    start_run(store, run_id, callbacks=CallbackLog().callbacks)
    return lineage


# --- resuming the parent ---------------------------------------------------------


def test_cl_child_finalisation_resumes_parent_in_the_same_commit(store: ContractStore) -> None:
    """The child's COMPLETED transition resumes the waiting parent task with
    the child's result; no other call is needed."""
    assert isinstance(store, DagChildStore)
    new_run(store, [root("p")], "parent")
    parent_task = only_task(store, "parent", 0)
    claim(store, parent_task)
    lineage = child_lineage(
        None,
        parent_run_id="parent",
        parent_task_id=parent_task.task_id,
        parent_pipeline_id=pipeline_identity([root("p")]),
        pipeline_id=pipeline_identity(_LEAF),
    )
    link = RunLink(
        run_id="kid",
        parent_run_id="parent",
        parent_task_id=parent_task.task_id,
        root_run_id="parent",
        lineage=encode_lineage(lineage),
        wait_id=child_wait_id("kid"),
    )
    waited = store.try_wait_for_child(
        parent_task.task_id,
        expected_attempt_id=parent_task.attempt_id,
        expected_generation=parent_task.generation,
        nodes=_LEAF,
        link=link,
    )
    assert waited is not None and waited.wait_id == "child:kid"
    # RUNNING in the wait's own commit: nothing can strand it PENDING.
    assert store.get_run_status("kid") is RunStatus.RUNNING
    assert store.get_run_link("kid") == link
    assert store.list_child_runs("parent") == ["kid"]
    log = CallbackLog()
    start_run(store, "kid", callbacks=log.callbacks)
    kid_task = only_task(store, "kid", 0)
    claim(store, kid_task)
    assert store.get_task(parent_task.task_id).status is TaskStatus.WAITING  # type: ignore[union-attr]
    on_task_complete(
        store,
        task_id=kid_task.task_id,
        expected_attempt_id=kid_task.attempt_id,
        outputs=emit("o1", value=7),
        callbacks=log.callbacks,
    )
    assert store.get_run_status("kid") is RunStatus.COMPLETED
    resumed = store.get_task(parent_task.task_id)
    assert resumed is not None
    assert resumed.status is TaskStatus.QUEUED
    assert resumed.resumed_from_wait_id == "child:kid"
    response: Any = store.get_wait_response(parent_task.task_id, "child:kid")
    assert response["status"] == "completed"
    assert [o["id"] for o in response["outputs"]["leaf"]] == ["o1"]
    assert response["outputs"]["leaf"][0]["fields"] == {"value": 7}


def _parent_plugin(seen: list[Any], nodes: Any = None) -> Any:
    def parent(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        result = ctx.child_result()
        if result is None:
            ctx.run_child(nodes if nodes is not None else _LEAF, {"x": 1})
        assert result is not None
        seen.append(result)
        if not result.ok:
            return {"child_failed": result.error or "?"}
        return {"child_value": result.outputs["leaf"][0]["fields"]["value"]}

    return parent


def test_cl_child_result_reaches_the_resumed_attempt(store: ContractStore, tmp_path: Path) -> None:
    seen: list[Any] = []
    new_run(store, [root("p")], "parent")
    worker = _worker(store, tmp_path, {"p": _parent_plugin(seen), "leaf": _leaf})
    worker.run_until_idle()
    assert store.get_run_status("parent") is RunStatus.COMPLETED
    assert len(seen) == 1 and seen[0].ok and seen[0].status is RunStatus.COMPLETED
    out = store.resolve_outputs("parent", store.get_output_ids("parent", 0))
    assert [o.fields for o in out.values()] == [{"child_value": 42}]
    assert isinstance(store, DagChildStore)
    (kid,) = store.list_child_runs("parent")
    link = store.get_run_link(kid)
    assert link is not None and link.root_run_id == "parent"


def test_cl_failed_child_is_seen_by_the_parent_plugin(store: ContractStore, tmp_path: Path) -> None:
    seen: list[Any] = []
    new_run(store, [root("p")], "parent")
    worker = _worker(store, tmp_path, {"p": _parent_plugin(seen), "leaf": _boom})
    worker.run_until_idle()
    assert seen and seen[0].status is RunStatus.FAILED
    assert "child exploded" in (seen[0].error or "")
    # The plugin decided to handle the failure, so the parent completes.
    assert store.get_run_status("parent") is RunStatus.COMPLETED


# --- CL-01: depth and recursion from persisted lineage ---------------------------------


def test_cl_01_fresh_worker_enforces_persisted_depth(store: ContractStore, tmp_path: Path) -> None:
    calls: list[str] = []
    new_run(store, [root("p")], "r0")
    first = _child_of(store, "r1", None, "r0", [root("mid")])
    _child_of(store, "r2", first, "r1", _LEAF)

    def leaf(inputs: TaskInputs, ctx: TaskContext) -> None:
        calls.append(ctx.run_id)

    # A worker that never saw r0 or r1, with a depth limit of 1.
    worker = _worker(store, tmp_path, {"leaf": leaf, "mid": leaf, "p": leaf}, max_child_depth=1)
    worker.run_until_idle()
    task = only_task(store, "r2", 0)
    assert task.status is TaskStatus.FAILED
    assert "child_depth_exceeded" in (task.error or "")
    assert "r2" not in calls
    assert "r1" in calls  # depth 1 is within the limit


def test_cl_01_recursion_is_refused_without_allow_recursion(
    store: ContractStore, tmp_path: Path
) -> None:
    calls: list[str] = []
    nodes = [root("p")]
    new_run(store, nodes, "r0")
    lineage = child_lineage(
        None,
        parent_run_id="r0",
        parent_task_id="t",
        parent_pipeline_id=pipeline_identity(nodes),
        pipeline_id=pipeline_identity(nodes),
    )
    assert isinstance(store, DagChildStore)
    assert store.create_child_run("r1", nodes, link=_link("r1", lineage, "r0"))
    start_run(store, "r1", callbacks=CallbackLog().callbacks)
    worker = _worker(store, tmp_path, {"p": lambda i, c: calls.append(c.run_id)})
    worker.run_until_idle()
    task = only_task(store, "r1", 0)
    assert task.status is TaskStatus.FAILED
    assert "child_recursion_refused" in (task.error or "")
    assert "r1" not in calls


def test_cl_01_recursion_allowed_only_up_to_its_declared_limit(
    store: ContractStore, tmp_path: Path
) -> None:
    """A recursive pipeline declares allow_recursion with max_recursion=1: it
    runs once below itself, and the next level is refused."""
    nodes = [root("rec")]
    recursive = ChildPipeline(tuple(nodes), allow_recursion=True, max_recursion=1)
    depth_seen: list[str] = []

    def rec(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        result = ctx.child_result()
        if result is None:
            depth_seen.append(ctx.run_id)
            ctx.run_child(recursive)
        assert result is not None
        return {"status": result.status.value, "error": result.error or ""}

    new_run(store, nodes, "r0")
    _worker(store, tmp_path, {"rec": rec}).run_until_idle()
    assert store.get_run_status("r0") is RunStatus.COMPLETED
    assert isinstance(store, DagChildStore)
    (kid,) = store.list_child_runs("r0")
    # The child's own attempt to recurse again is refused at the commit: the
    # child's task fails, so the root sees a failed child.
    kid_task = only_task(store, kid, 0)
    assert kid_task.status is TaskStatus.FAILED
    assert "child_recursion_refused" in (kid_task.error or "")
    assert store.list_child_runs(kid) == []
    assert depth_seen == ["r0", kid]


# --- CL-02 .. CL-05: ancestor cancellation ---------------------------------------------


def test_cl_02_cancelled_root_cancels_child_without_executing(
    store: ContractStore, tmp_path: Path
) -> None:
    calls: list[str] = []
    new_run(store, [root("p")], "r0")
    assert cancel_run(store, "r0")
    _child_of(store, "r1", None, "r0", _LEAF)
    worker = _worker(store, tmp_path, {"leaf": lambda i, c: calls.append(c.run_id)})
    assert worker.process_once() == 1
    assert calls == []
    assert store.get_run_status("r1") is RunStatus.CANCELLED
    assert only_task(store, "r1", 0).status is TaskStatus.CANCELLED
    assert worker.reports[-1].action == "cancelled"


def test_cl_03_cancelled_parent_cancels_grandchild_root_untouched(
    store: ContractStore, tmp_path: Path
) -> None:
    calls: list[str] = []
    new_run(store, [root("p")], "r0")
    first = _child_of(store, "r1", None, "r0", [root("mid")])
    # Only the parent is cancelled; the grandchild is created afterwards.
    assert cancel_run(store, "r1")
    _child_of(store, "r2", first, "r1", _LEAF)
    plugins = {"leaf": lambda i, c: calls.append(c.run_id), "p": lambda i, c: c.wait("hold")}
    _worker(store, tmp_path, plugins).run_until_idle()
    assert calls == []
    assert store.get_run_status("r2") is RunStatus.CANCELLED
    assert only_task(store, "r2", 0).status is TaskStatus.CANCELLED
    assert store.get_run_status("r0") is RunStatus.RUNNING


def test_cl_04_depth_zero_lineage_root_only_anchors_caps(
    store: ContractStore, tmp_path: Path
) -> None:
    new_run(store, [root("p")], "anchor", start=False)
    assert cancel_run(store, "anchor")
    lineage = RunLineage(root_run_id="anchor", depth=0, pipeline_id="named", max_depth=3)
    assert isinstance(store, DagChildStore)
    assert store.create_child_run("r1", _LEAF, link=_link("r1", lineage, "anchor"))
    start_run(store, "r1", callbacks=CallbackLog().callbacks)
    _worker(store, tmp_path, {"leaf": _leaf}).run_until_idle()
    assert store.get_run_status("r1") is RunStatus.COMPLETED


def test_cl_05_missing_ancestor_is_not_a_cancellation_signal(
    store: ContractStore, tmp_path: Path
) -> None:
    lineage = RunLineage(
        root_run_id="ghost",
        depth=1,
        pipeline_id=pipeline_identity(_LEAF),
        ancestors=(Ancestor("ghost", "sha256:other"),),
        parent_run_id="ghost",
        parent_task_id="t",
    )
    assert isinstance(store, DagChildStore)
    assert store.create_child_run("r1", _LEAF, link=_link("r1", lineage, "ghost"))
    start_run(store, "r1", callbacks=CallbackLog().callbacks)
    _worker(store, tmp_path, {"leaf": _leaf}).run_until_idle()
    assert store.get_run_status("r1") is RunStatus.COMPLETED


def test_cl_06_corrupt_lineage_fails_only_that_task(store: ContractStore, tmp_path: Path) -> None:
    assert isinstance(store, DagChildStore)
    assert store.create_child_run("bad", _LEAF, link=_link("bad", '{"v": 1, "depth": -3', "x"))
    start_run(store, "bad", callbacks=CallbackLog().callbacks)
    new_run(store, [root("leaf")], "good")
    worker = _worker(store, tmp_path, {"leaf": _leaf})
    worker.run_until_idle()
    task = only_task(store, "bad", 0)
    assert task.status is TaskStatus.FAILED
    assert "lineage_invalid" in (task.error or "")
    assert store.get_run_status("bad") is RunStatus.FAILED
    # The loop kept going: the next run's task ran normally.
    assert store.get_run_status("good") is RunStatus.COMPLETED


# --- cancellation of descendants ---------------------------------------------------------


def test_cl_cancelling_a_run_cancels_all_descendants(store: ContractStore) -> None:
    new_run(store, [root("p")], "r0")
    first = _child_of(store, "r1", None, "r0", [root("mid"), child("end", "mid")])
    _child_of(store, "r2", first, "r1", _LEAF)
    assert cancel_run(store, "r0", reason="stop")
    for run_id in ("r0", "r1", "r2"):
        assert store.get_run_status(run_id) is RunStatus.CANCELLED
    assert only_task(store, "r2", 0).status is TaskStatus.CANCELLED
    record = store.get_run("r2")
    assert record is not None and "r1" in (record.error or "")


# --- a worker that dies between the wait's commit and starting the child ---------------


class _WorkerDied(BaseException):
    """Stands for the process dying: nothing in the worker catches it."""


def test_cl_child_is_not_stranded_when_the_worker_dies_before_starting_it(
    store: ContractStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait commits the child RUNNING; the worker then dies before it
    launches the child's roots. A later worker's backstop pass reconciles the
    child, which runs and resumes the parent: no child stays PENDING under a
    waiting parent."""
    seen: list[Any] = []
    new_run(store, [root("p")], "parent")
    plugins = {"p": _parent_plugin(seen), "leaf": _leaf}

    def die(*args: Any, **kwargs: Any) -> None:
        raise _WorkerDied

    monkeypatch.setattr(children_module, "reconcile_run", die)
    doomed = _worker(store, tmp_path, plugins, backstop_interval=None)
    with pytest.raises(_WorkerDied):
        doomed.process_once()
    monkeypatch.undo()
    assert isinstance(store, DagChildStore)
    (kid,) = store.list_child_runs("parent")
    parent_task = only_task(store, "parent", 0)
    assert parent_task.status is TaskStatus.WAITING
    assert store.get_run_status(kid) is RunStatus.RUNNING
    assert store.list_tasks(kid) == []  # its roots were never launched
    # A new worker: its backstop pass reconciles the RUNNING child.
    fresh = _worker(store, tmp_path, plugins, backstop_interval=None)
    report = Backstop(store, holder="fresh").run_pass()
    assert report.ran and report.errors == ()
    fresh.run_until_idle()
    assert store.get_run_status(kid) is RunStatus.COMPLETED
    # The parent's own delivery is still leased by the dead worker; its
    # resumed attempt was queued by the child's completion.
    fresh.run_until_idle()
    assert store.get_run_status("parent") is RunStatus.COMPLETED
    assert len(seen) == 1 and seen[0].ok


def test_cl_reserved_child_wait_without_a_child_fails_the_task(
    store: ContractStore, tmp_path: Path
) -> None:
    """``child:`` wait IDs are reserved: waiting under one that names no child
    of the attempt fails the task instead of waiting forever."""
    new_run(store, [root("p")], "parent")

    def bogus(inputs: TaskInputs, ctx: TaskContext) -> None:
        ctx.wait("child:nobody")

    _worker(store, tmp_path, {"p": bogus}).run_until_idle()
    task = only_task(store, "parent", 0)
    assert task.status is TaskStatus.FAILED
    assert "child_run_invalid" in (task.error or "")
    assert store.get_run_status("parent") is RunStatus.FAILED
