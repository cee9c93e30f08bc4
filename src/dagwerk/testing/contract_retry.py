"""Contract tests: task and run retries (RT-01..RT-13)."""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any

import pytest

from dagwerk.constants import InputMode, InputRole, LaunchCreateStatus, RunStatus, TaskStatus
from dagwerk.errors import MaterializationError
from dagwerk.json import FrozenDict
from dagwerk.models import PlannedEdgeInput, TaskInputPlan
from dagwerk.orchestrator import (
    abort_run,
    cancel_run,
    on_task_complete,
    on_task_crashed,
    on_task_failed,
    reconcile_run,
)
from dagwerk.retry import RetryRejectedError, retry_run, retry_task
from dagwerk.store import RunReopenResult, StoreContractError, TaskAttemptRef
from dagwerk.task_input import resolve_task_inputs
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    Crash,
    Fail,
    FakeWorker,
    StoreProxy,
    as_store,
    child,
    claim,
    deliveries_for,
    emit,
    fingerprint,
    launch_of,
    new_run,
    only_task,
    root,
    run_record,
    snapshot_for,
    task,
    tasks_of,
)


def _diamond() -> list[Any]:
    """root(0) -> left(1), right(2) -> join(3)."""
    return [
        root("r"),
        child("left", "r", mode=InputMode.ALL),
        child("right", "r", mode=InputMode.ALL),
        child("join", "left", "right", mode=InputMode.ALL),
    ]


def _failed_diamond(store: ContractStore) -> CallbackLog:
    """Root done, ``left`` failed, ``right`` cancelled by the failure."""
    log = new_run(store, _diamond())
    worker = FakeWorker(store, log, handlers={"left": lambda item: Fail("boom")})
    top = only_task(store, "run-1", 0)
    worker.process(next(d for d in store.list_deliveries("run-1") if d.task_id == top.task_id))
    left = only_task(store, "run-1", 1)
    worker.process(next(d for d in store.list_deliveries("run-1") if d.task_id == left.task_id))
    assert store.get_run_status("run-1") is RunStatus.FAILED
    assert only_task(store, "run-1", 2).status is TaskStatus.CANCELLED
    return log


# --- RT-01 / RT-02 ---------------------------------------------------------------


def test_rt_01_task_retry_replaces_a_crashed_attempt(store: ContractStore) -> None:
    new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)
    claim(store, record)
    assert store.mark_task_crashed(record.task_id, "lost", expected_attempt_id=record.attempt_id)
    rows = len(store.list_deliveries("run-1"))
    new_attempt = retry_task(store, record.task_id, expected_attempt_id=record.attempt_id)
    assert new_attempt is not None
    assert new_attempt != record.attempt_id
    after = task(store, record.task_id)
    assert after.status is TaskStatus.QUEUED
    assert (after.attempt_id, after.plan, after.generation) == (
        new_attempt,
        record.plan,
        record.generation,
    )
    assert [d.attempt_id for d in deliveries_for(store, record.task_id)].count(new_attempt) == 1
    assert len(store.list_deliveries("run-1")) == rows + 1
    launch = launch_of(store, "run-1", 0)
    assert launch is not None
    assert launch.complete is False


@pytest.mark.parametrize("state", ["queued", "running", "failed", "completed"])
def test_rt_01_only_crashed_attempts_are_retried(store: ContractStore, state: str) -> None:
    new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)
    if state != "queued":
        claim(store, record)
    if state == "failed":
        store.mark_task_failed(record.task_id, "e", expected_attempt_id=record.attempt_id)
    elif state == "completed":
        store.try_complete_task(record.task_id, emit("o"), expected_attempt_id=record.attempt_id)
    snapshot = fingerprint(store, "run-1")
    assert retry_task(store, record.task_id, expected_attempt_id=record.attempt_id) is None
    assert fingerprint(store, "run-1") == snapshot


def test_rt_01_task_retry_needs_a_running_run(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)
    claim(store, record)
    on_task_crashed(
        store,
        task_id=record.task_id,
        expected_attempt_id=record.attempt_id,
        error_message="lost",
        callbacks=log.callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.CRASHED
    assert retry_task(store, record.task_id, expected_attempt_id=record.attempt_id) is None
    assert task(store, record.task_id).status is TaskStatus.CRASHED


def test_rt_02_stale_expected_attempt_cannot_retry(store: ContractStore) -> None:
    new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)
    claim(store, record)
    store.mark_task_crashed(record.task_id, "lost", expected_attempt_id=record.attempt_id)
    second = retry_task(store, record.task_id, expected_attempt_id=record.attempt_id)
    assert second is not None
    claim(store, task(store, record.task_id))
    store.mark_task_crashed(record.task_id, "lost", expected_attempt_id=second)
    snapshot = fingerprint(store, "run-1")
    assert retry_task(store, record.task_id, expected_attempt_id=record.attempt_id) is None
    assert fingerprint(store, "run-1") == snapshot
    third = retry_task(store, record.task_id, expected_attempt_id=second)
    assert third is not None
    assert len({record.attempt_id, second, third}) == 3


# --- RT-03 / RT-04 -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("boundary", "message"),
    [
        ([], "must not be empty"),
        ([True], "integers"),
        ([1.0], "integers"),
        (["1"], "integers"),
        ([-1], "invalid"),
    ],
)
def test_rt_03_boundary_is_validated_before_the_store(
    store: ContractStore, boundary: list[Any], message: str
) -> None:
    _failed_diamond(store)
    proxy = StoreProxy(store)
    with pytest.raises(ValueError, match=message):
        retry_run(as_store(proxy), "run-1", boundary)
    assert proxy.calls["try_reopen_run"] == 0


def test_rt_03_boundary_is_sorted_and_deduplicated(store: ContractStore) -> None:
    _failed_diamond(store)
    seen: list[Any] = []

    def record_boundary(inner: ContractStore, run_id: str, boundary: Any) -> Any:
        seen.append(boundary)
        return inner.try_reopen_run(run_id, boundary)

    proxy = StoreProxy(store, try_reopen_run=record_boundary)
    result = retry_run(as_store(proxy), "run-1", [1, 1])
    assert seen == [(1,)]
    assert result.affected_nodes == (1, 2, 3)


def test_rt_03_store_results_are_checked(store: ContractStore) -> None:
    _failed_diamond(store)
    refused = StoreProxy(store, try_reopen_run=lambda inner, run_id, boundary: None)
    with pytest.raises(RetryRejectedError):
        retry_run(as_store(refused), "run-1")
    junk = StoreProxy(store, try_reopen_run=lambda inner, run_id, boundary: object())
    with pytest.raises(
        StoreContractError,
        match=r"^try_reopen_run returned object; expected RunReopenResult or None$",
    ):
        retry_run(as_store(junk), "run-1")

    def inexact(inner: ContractStore, run_id: str, boundary: Any) -> RunReopenResult:
        result = RunReopenResult(affected_nodes=(1,), retry_count=1, generations={1: 1})
        # A hand-built record that slipped past validation.
        object.__setattr__(result, "generations", MappingProxyType({1: 1, 2: 1}))
        return result

    with pytest.raises(
        StoreContractError,
        match=re.escape(
            "try_reopen_run returned generations for nodes [1, 2]; expected the affected nodes [1]"
        ),
    ):
        retry_run(as_store(StoreProxy(store, try_reopen_run=inexact)), "run-1")
    assert store.get_run_status("run-1") is RunStatus.FAILED


def test_rt_04_only_failed_crashed_and_cancelled_runs_reopen(store: ContractStore) -> None:
    log = new_run(store, [root("a")], "running")
    with pytest.raises(RetryRejectedError):
        retry_run(store, "running")
    new_run(store, [root("a")], "pending", start=False, log=log)
    with pytest.raises(RetryRejectedError):
        retry_run(store, "pending")
    new_run(store, [root("a")], "done", log=log)
    FakeWorker(store, log).drain("done")
    assert store.get_run_status("done") is RunStatus.COMPLETED
    with pytest.raises(RetryRejectedError):
        retry_run(store, "done")
    with pytest.raises(RetryRejectedError):
        retry_run(store, "missing")
    assert store.get_run_status("running") is RunStatus.RUNNING


def test_rt_04_cancelled_run_takes_no_boundary(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    cancel_run(store, "run-1", callbacks=log.callbacks)
    with pytest.raises(RetryRejectedError):
        retry_run(store, "run-1", [0])
    assert store.get_run_status("run-1") is RunStatus.CANCELLED
    assert retry_run(store, "run-1").affected_nodes == (0,)


def test_rt_04_boundary_must_hold_an_active_failure(store: ContractStore) -> None:
    _failed_diamond(store)
    snapshot = fingerprint(store, "run-1")
    for boundary in ([0], [2], [3], [9], [1, 2]):
        # completed root, cancelled sibling, unlaunched join, unknown node
        with pytest.raises(RetryRejectedError):
            retry_run(store, "run-1", boundary)
    assert fingerprint(store, "run-1") == snapshot
    assert retry_run(store, "run-1", [1]).affected_nodes == (1, 2, 3)


@pytest.mark.parametrize("outcome", ["failed", "crashed"])
def test_rt_04_omitted_or_failing_boundary_is_accepted(store: ContractStore, outcome: str) -> None:
    log = new_run(store, [root("a")], "run-1")
    new_run(store, [root("a")], "run-2", log=log)
    handler = (lambda item: Fail("e")) if outcome == "failed" else (lambda item: Crash("e"))
    FakeWorker(store, log, handlers={"a": handler}).drain()
    expected = RunStatus.FAILED if outcome == "failed" else RunStatus.CRASHED
    assert store.get_run_status("run-1") is expected
    assert retry_run(store, "run-1").affected_nodes == (0,)
    assert retry_run(store, "run-2", [0]).affected_nodes == (0,)


# --- RT-05 .. RT-08 ------------------------------------------------------------------


def test_rt_05_affected_set_is_derived_by_the_store(store: ContractStore) -> None:
    _failed_diamond(store)
    result = retry_run(store, "run-1")
    assert result.affected_nodes == (1, 2, 3)
    assert dict(result.generations) == {1: 1, 2: 1, 3: 1}
    assert result.retry_count == 1


def test_rt_06_generation_is_invalidated_as_a_unit(store: ContractStore) -> None:
    nodes = [root("r"), child("m", "r"), child("z", "m", mode=InputMode.ALL)]
    log = new_run(store, nodes)
    top = only_task(store, "run-1", 0)
    claim(store, top)
    on_task_complete(
        store,
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        outputs=emit("r1", "r2"),
        callbacks=log.callbacks,
    )
    root_launch = launch_of(store, "run-1", 0)
    good, bad = tasks_of(store, "run-1", 1)
    claim(store, good)
    claim(store, bad)
    assert store.try_complete_task(good.task_id, emit("m1"), expected_attempt_id=good.attempt_id)
    on_task_failed(
        store,
        task_id=bad.task_id,
        expected_attempt_id=bad.attempt_id,
        error_message="boom",
        callbacks=log.callbacks,
    )
    assert run_record(store, "run-1").error == "boom"
    result = retry_run(store, "run-1")
    assert result.affected_nodes == (1, 2)
    # The unlaunched descendant advances its generation too.
    assert dict(result.generations) == {1: 1, 2: 1}
    record = run_record(store, "run-1")
    assert (record.status, record.error, record.retry_count) == (RunStatus.RUNNING, None, 1)
    assert record.settled_nodes == 1
    assert launch_of(store, "run-1", 0) == root_launch
    assert launch_of(store, "run-1", 1) is None
    # The successful sibling is invalidated with its outputs.
    old = {t.task_id: t for t in store.list_tasks("run-1", include_invalidated=True)}
    assert old[good.task_id].invalidated and old[bad.task_id].invalidated
    assert old[good.task_id].status is TaskStatus.COMPLETED
    assert store.get_output_ids("run-1", 1) == ()
    assert "m1" not in store.resolve_outputs("run-1", ("m1",))
    edge = PlannedEdgeInput(edge="m", source_index=1, role=InputRole.MAIN, output_ids=("m1",))
    plan = TaskInputPlan(generation=0, edges=(edge,), parameters=FrozenDict())
    with pytest.raises(MaterializationError):
        resolve_task_inputs(store, run_id="run-1", plan=plan)
    assert store.resolve_outputs("run-1", ("r1",))["r1"].id == "r1"
    # Replanning uses the new generation.
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    replanned = tasks_of(store, "run-1", 1)
    assert len(replanned) == 2
    assert {t.generation for t in replanned} == {1}
    assert not {t.task_id for t in replanned} & {good.task_id, bad.task_id}


def test_rt_07_snapshots_from_before_a_retry_are_stale(store: ContractStore) -> None:
    nodes = [
        root("r"),
        root("s"),
        child("b", "r", mode=InputMode.ALL),
        child("t", "s", mode=InputMode.ALL),
    ]
    log = new_run(store, nodes)
    worker = FakeWorker(store, log, handlers={"s": lambda item: Fail("boom")})
    first = only_task(store, "run-1", 0)
    claim(store, first)
    assert store.try_complete_task(first.task_id, emit("x"), expected_attempt_id=first.attempt_id)
    unaffected = snapshot_for(store, "run-1", 2)
    affected = snapshot_for(store, "run-1", 3)
    worker.process(next(d for d in store.list_deliveries("run-1") if d.node_index == 1))
    assert store.get_run_status("run-1") is RunStatus.FAILED
    result = retry_run(store, "run-1")
    assert result.affected_nodes == (1, 3)
    for index, snap, plugin in ((2, unaffected, "b"), (3, affected, "t")):
        created = store.try_create_node_launch(
            "run-1",
            index,
            plugin,
            snap.token,
            (TaskInputPlan(generation=snap.generation, parameters=FrozenDict()),),
            None,
        )
        assert created.status is LaunchCreateStatus.STALE
    assert launch_of(store, "run-1", 2) is None
    assert launch_of(store, "run-1", 3) is None


def test_rt_08_cancelled_run_reopens_only_interrupted_work(store: ContractStore) -> None:
    nodes = [root("r"), child("c", "r", mode=InputMode.ALL)]
    log = new_run(store, nodes)
    top = only_task(store, "run-1", 0)
    claim(store, top)
    on_task_complete(
        store,
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        outputs=emit("x"),
        callbacks=log.callbacks,
    )
    root_launch = launch_of(store, "run-1", 0)
    assert cancel_run(store, "run-1", callbacks=log.callbacks)
    result = retry_run(store, "run-1")
    assert result.affected_nodes == (1,)
    assert launch_of(store, "run-1", 0) == root_launch
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    FakeWorker(store, log).drain()
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert log.kinds() == ["cancelled", "completed"]


def test_rt_08_cancelled_run_without_launches_reopens(store: ContractStore) -> None:
    log = new_run(store, [root("a")], start=False)
    assert cancel_run(store, "run-1", callbacks=log.callbacks)
    result = retry_run(store, "run-1")
    assert (result.affected_nodes, result.retry_count) == ((), 1)
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    assert len(store.list_tasks("run-1")) == 1


# --- RT-09 .. RT-13 ----------------------------------------------------------------


def test_rt_09_only_one_retry_wins_and_a_rejection_changes_nothing(store: ContractStore) -> None:
    _failed_diamond(store)
    assert retry_run(store, "run-1").retry_count == 1
    snapshot = fingerprint(store, "run-1")
    with pytest.raises(RetryRejectedError):
        retry_run(store, "run-1")
    with pytest.raises(RetryRejectedError):
        retry_run(store, "run-1", [1])
    assert fingerprint(store, "run-1") == snapshot
    assert run_record(store, "run-1").retry_count == 1


def test_rt_10_retries_use_the_stored_topology(store: ContractStore) -> None:
    nodes = _diamond()
    log = new_run(store, nodes)
    nodes[1].plugin = "changed-by-caller"
    FakeWorker(store, log, handlers={"left": lambda item: Fail("boom")}).drain()
    retry_run(store, "run-1")
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    launch = launch_of(store, "run-1", 1)
    assert launch is not None
    assert launch.plugin_name == "left"


def test_rt_11_replanned_node_gets_new_tasks_and_completes(store: ContractStore) -> None:
    log = _failed_diamond(store)
    old = {t.task_id: t for t in store.list_tasks("run-1")}
    retry_run(store, "run-1")
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    fresh = {t.task_id for t in store.list_tasks("run-1") if t.node_index in (1, 2)}
    assert len(fresh) == 2
    assert not fresh & set(old)
    # Late callbacks from the old generation change nothing.
    snapshot = fingerprint(store, "run-1")
    for record in old.values():
        on_task_complete(
            store,
            task_id=record.task_id,
            expected_attempt_id=record.attempt_id,
            outputs=emit(f"late-{record.task_id}"),
            callbacks=log.callbacks,
        )
        on_task_failed(
            store,
            task_id=record.task_id,
            expected_attempt_id=record.attempt_id,
            error_message="late",
            callbacks=log.callbacks,
        )
        assert not store.try_finalize_run(
            "run-1",
            RunStatus.FAILED,
            cause=TaskAttemptRef(task_id=record.task_id, attempt_id=record.attempt_id),
        )
    assert fingerprint(store, "run-1") == snapshot
    FakeWorker(store, log).drain()
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert log.kinds() == ["failed", "completed"]


def test_rt_12_run_reopen_result_validates_and_freezes() -> None:
    generations = {1: 1, 3: 2}
    result = RunReopenResult(affected_nodes=(1, 3), retry_count=2, generations=generations)
    generations[1] = 99
    assert dict(result.generations) == {1: 1, 3: 2}
    with pytest.raises(TypeError):
        result.generations[1] = 5  # type: ignore[index]
    bad: list[dict[str, Any]] = [
        {"affected_nodes": (3, 1), "retry_count": 1, "generations": {1: 1, 3: 1}},
        {"affected_nodes": (1, 1), "retry_count": 1, "generations": {1: 1}},
        {"affected_nodes": (-1,), "retry_count": 1, "generations": {-1: 1}},
        {"affected_nodes": (1,), "retry_count": 0, "generations": {1: 1}},
        {"affected_nodes": (1,), "retry_count": True, "generations": {1: 1}},
        {"affected_nodes": (1,), "retry_count": 1, "generations": {1: 0}},
        {"affected_nodes": (1,), "retry_count": 1, "generations": {2: 1}},
        {"affected_nodes": (True,), "retry_count": 1, "generations": {True: 1}},
    ]
    for kwargs in bad:
        with pytest.raises(ValueError):
            RunReopenResult(**kwargs)


def test_rt_13_reconcile_waits_for_a_successful_retry(store: ContractStore) -> None:
    log = _failed_diamond(store)
    snapshot = fingerprint(store, "run-1")
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    assert fingerprint(store, "run-1") == snapshot
    retry_run(store, "run-1")
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    assert len(tasks_of(store, "run-1", 1)) == 1
    assert abort_run(store, run_id="run-1", reason="stop", callbacks=log.callbacks)
