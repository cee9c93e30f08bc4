"""Orchestrator behaviour the contract suite does not pin down: failure policies,
call counts (OR-05, OR-14), launch-result checks (OR-07), cancel_run, limits."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import (
    FailurePolicy,
    InputMode,
    LaunchCreateStatus,
    NodeDisposition,
    RunStatus,
    TaskStatus,
)
from dagwerk.limits import Limits
from dagwerk.models import LaunchCreateResult, NodeLaunch
from dagwerk.orchestrator import (
    cancel_run,
    on_task_complete,
    on_task_failed,
    reconcile_run,
    start_run,
)
from dagwerk.retry import retry_run, retry_task
from dagwerk.store import StoreContractError
from dagwerk.testing.helpers import (
    CallbackLog,
    Complete,
    Crash,
    Fail,
    FakeWorker,
    Hold,
    StoreProxy,
    Wait,
    as_store,
    chain,
    child,
    claim,
    emit,
    new_run,
    only_task,
    root,
    tasks_of,
)
from dagwerk.waiting import resume_task


def _diamond() -> list[Any]:
    # a -> b -> d ; a -> c -> e ; (b, e) -> f
    return [
        root("a"),
        child("b", "a"),
        child("c", "a"),
        child("d", "b"),
        child("e", "c"),
        child("f", "b", "e", mode=InputMode.ALL),
    ]


def _dispositions(store: MemoryStore) -> dict[int, str]:
    return {i: launch.disposition.value for i, launch in store.list_node_launches("run-1").items()}


def test_continue_others_runs_independent_branches_and_marks_descendants() -> None:
    store = MemoryStore()
    log = new_run(store, _diamond(), failure_policy=FailurePolicy.CONTINUE_OTHERS)
    FakeWorker(store, log, handlers={"b": lambda item: Fail("b broke")}).drain()
    assert _dispositions(store) == {
        0: "launched",
        1: "launched",
        2: "launched",
        3: "upstream_failed",
        4: "launched",
        5: "upstream_failed",
    }
    # The independent branch a -> c -> e completed its work.
    assert all(t.status is TaskStatus.COMPLETED for t in tasks_of(store, "run-1", 4))
    record = store.get_run("run-1")
    assert record is not None
    assert record.status is RunStatus.FAILED
    assert record.error == "b broke"
    assert log.kinds() == ["failed"]


def test_continue_others_waits_for_a_waiting_task_before_failing() -> None:
    store = MemoryStore()
    log = new_run(store, _diamond(), failure_policy=FailurePolicy.CONTINUE_OTHERS)
    worker = FakeWorker(
        store, log, handlers={"b": lambda item: Fail("b broke"), "e": lambda item: Wait("w1")}
    )
    worker.drain()
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    waiting = only_task(store, "run-1", 4)
    assert waiting.status is TaskStatus.WAITING
    resume_task(
        store,
        waiting.task_id,
        "w1",
        expected_attempt_id=waiting.attempt_id,
        expected_generation=waiting.generation,
    )
    worker.handlers.pop("e")
    worker.drain()
    assert store.get_run_status("run-1") is RunStatus.FAILED
    assert log.kinds() == ["failed"]


def test_continue_others_without_failure_completes() -> None:
    store = MemoryStore()
    log = new_run(store, _diamond(), failure_policy=FailurePolicy.CONTINUE_OTHERS)
    FakeWorker(store, log).drain()
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert log.kinds() == ["completed"]


def test_continue_others_crash_only_ends_crashed_and_retry_recovers() -> None:
    store = MemoryStore()
    nodes = [root("a"), child("b", "a"), child("c", "a")]
    log = new_run(store, nodes, failure_policy=FailurePolicy.CONTINUE_OTHERS)
    FakeWorker(store, log, handlers={"b": lambda item: Crash("lost")}).drain()
    assert store.get_run_status("run-1") is RunStatus.CRASHED
    result = retry_run(store, "run-1")
    assert result.affected_nodes == (1,)
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    FakeWorker(store, log).drain()
    assert store.get_run_status("run-1") is RunStatus.COMPLETED


def test_stop_on_first_failure_lets_dispatched_tasks_finish_then_fails() -> None:
    store = MemoryStore()
    nodes = [root("a"), child("b", "a"), child("c", "a"), child("d", "c")]
    log = new_run(store, nodes, failure_policy=FailurePolicy.STOP_ON_FIRST_FAILURE)
    worker = FakeWorker(
        store, log, handlers={"b": lambda item: Fail("b broke"), "c": lambda item: Hold()}
    )
    worker.drain()
    # c is still running: the run waits for it and launches nothing new.
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    held = worker.held[0]
    on_task_complete(
        store,
        task_id=held.claim.task_id,
        expected_attempt_id=held.claim.attempt_id,
        outputs=emit("c-out"),
        callbacks=log.callbacks,
    )
    assert 3 not in store.list_node_launches("run-1")
    assert store.get_run_status("run-1") is RunStatus.FAILED
    assert log.kinds() == ["failed"]


def test_stop_on_first_failure_last_sibling_in_a_failed_launch_settles_the_run() -> None:
    store = MemoryStore()
    nodes = [root("a"), child("b", "a")]
    log = new_run(store, nodes, failure_policy=FailurePolicy.STOP_ON_FIRST_FAILURE)
    a = claim(store, only_task(store, "run-1", 0))
    on_task_complete(
        store,
        task_id=a.task_id,
        expected_attempt_id=a.attempt_id,
        outputs=emit("x", "y"),
        callbacks=log.callbacks,
    )
    first, second = tasks_of(store, "run-1", 1)
    c1, c2 = claim(store, first), claim(store, second)
    on_task_failed(
        store,
        task_id=c1.task_id,
        expected_attempt_id=c1.attempt_id,
        error_message="nope",
        callbacks=log.callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    # The sibling's completion does not complete the launch, yet it settles the run.
    on_task_complete(
        store, task_id=c2.task_id, expected_attempt_id=c2.attempt_id, callbacks=log.callbacks
    )
    assert store.get_run_status("run-1") is RunStatus.FAILED
    assert log.kinds() == ["failed"]


def test_fail_fast_is_the_default_and_cancels_running_work() -> None:
    store = MemoryStore()
    log = new_run(store, [root("a"), root("b")])
    worker = FakeWorker(
        store, log, handlers={"a": lambda item: Fail("x"), "b": lambda item: Hold()}
    )
    worker.drain()
    record = store.get_run("run-1")
    assert record is not None
    assert record.failure_policy is FailurePolicy.FAIL_FAST
    assert record.status is RunStatus.FAILED
    assert only_task(store, "run-1", 1).status is TaskStatus.CANCELLED


# --- cancel_run -------------------------------------------------------------


def test_cancel_run_cancels_pending_and_running_runs_once() -> None:
    store = MemoryStore()
    log = CallbackLog()
    new_run(store, [root("a")], "pending", start=False)
    assert cancel_run(store, "pending", callbacks=log.callbacks) is True
    assert cancel_run(store, "pending", callbacks=log.callbacks) is False
    new_run(store, [root("a"), child("b", "a")], "running", log=log)
    record = only_task(store, "running", 0)
    claim(store, record)
    store.try_wait_task(
        record.task_id, "w", expected_attempt_id=record.attempt_id, expected_generation=0
    )
    assert cancel_run(store, "running", callbacks=log.callbacks, reason="user") is True
    assert only_task(store, "running", 0).status is TaskStatus.CANCELLED
    assert only_task(store, "running", 0).active_wait_id is None
    assert store.list_deliveries("running") == []
    assert store.get_run("running").error == "user"  # type: ignore[union-attr]
    assert log.events == [("cancelled", "pending"), ("cancelled", "running")]
    assert cancel_run(store, "missing") is False


# --- OR-05 / OR-14 call counts ---------------------------------------------


def test_or_05_zero_task_chain_is_reconciled_in_one_pass() -> None:
    proxy = StoreProxy(MemoryStore())
    store = as_store(proxy)
    length = 1_100
    log = new_run(store, chain(length))
    a = claim(store, only_task(store, "run-1", 0))
    proxy.calls.clear()
    # The root publishes nothing, so every descendant is a zero-task launch.
    on_task_complete(
        store,
        task_id=a.task_id,
        expected_attempt_id=a.attempt_id,
        outputs=(),
        callbacks=log.callbacks,
    )
    assert proxy.calls["get_run_nodes"] == 1
    assert proxy.calls["list_node_launches"] == 1
    assert proxy.calls["get_planning_snapshot"] == length - 1
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert all(
        launch.disposition is not NodeDisposition.LAUNCHED
        for i, launch in store.list_node_launches("run-1").items()
        if i
    )


def test_or_14_non_final_completions_do_not_read_the_graph() -> None:
    proxy = StoreProxy(MemoryStore())
    store = as_store(proxy)
    log = new_run(store, [root("a"), child("b", "a")])
    a = claim(store, only_task(store, "run-1", 0))
    ids = tuple(f"o{n}" for n in range(200))
    on_task_complete(
        store,
        task_id=a.task_id,
        expected_attempt_id=a.attempt_id,
        outputs=emit(*ids),
        callbacks=log.callbacks,
    )
    claims = [claim(store, t) for t in tasks_of(store, "run-1", 1)]
    assert len(claims) == 200
    proxy.calls.clear()
    for won in claims[:-1]:
        on_task_complete(
            store, task_id=won.task_id, expected_attempt_id=won.attempt_id, callbacks=log.callbacks
        )
    assert proxy.calls["get_run_nodes"] == 0
    assert proxy.calls["list_node_launches"] == 0
    last = claims[-1]
    on_task_complete(
        store, task_id=last.task_id, expected_attempt_id=last.attempt_id, callbacks=log.callbacks
    )
    assert proxy.calls["get_run_nodes"] == 1
    assert log.kinds() == ["completed"]


# --- OR-07 launch results ---------------------------------------------------


def _wrong_launch(**changes: Any) -> Any:
    """The store's launch with ``changes``, built without validation (as a
    store that builds its own records might)."""

    def create(inner: MemoryStore, *args: Any, **kwargs: Any) -> LaunchCreateResult:
        result = inner.try_create_node_launch(*args, **kwargs)
        assert result.launch is not None
        launch = NodeLaunch.model_construct(**{**dict(result.launch), **changes})
        return LaunchCreateResult.model_construct(status=result.status, launch=launch)

    return create


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"run_id": "other"}, "run_id", "run_id 'other'; expected 'run-1'"),
        ({"node_index": 5}, "node_index", "node_index 5; expected 0"),
        ({"plugin_name": "other"}, "plugin_name", "plugin_name 'other'; expected 'a'"),
        ({"generation": 3}, "generation", "generation 3; expected 0"),
        ({"complete": True}, "complete", "complete True with 1 task ID to run; expected False"),
        ({"task_ids": ("t1", "t2")}, "task_ids", "2 task IDs; expected 1 (one per plan)"),
        (
            {"task_ids": ("t1", "t1")},
            "task_ids",
            "task ID 't1' twice; expected unique task IDs",
        ),
        ({"task_ids": ("",)}, "task_ids", "an empty task ID; expected non-empty task IDs"),
        (
            {"task_ids": ()},
            "task_ids",
            "disposition 'launched' with no task IDs; expected at least 1",
        ),
        (
            {"disposition": NodeDisposition.SKIPPED},
            "task_ids",
            "disposition 'skipped' with 1 task ID; expected none",
        ),
        (
            {"disposition": NodeDisposition.SKIPPED, "task_ids": ()},
            "complete",
            "complete False with disposition 'skipped'; expected True",
        ),
        (
            {"disposition": NodeDisposition.FAILED, "task_ids": (), "complete": True},
            "error",
            "error '' with disposition 'failed'; expected an error message",
        ),
        (
            {"disposition": NodeDisposition.SKIPPED, "task_ids": (), "complete": True},
            "disposition",
            "disposition 'skipped'; expected 'launched'",
        ),
    ],
)
def test_or_07_launch_results_must_match_the_request(
    changes: dict[str, Any], field: str, message: str
) -> None:
    store = MemoryStore()
    store.create_run("run-1", [root("a")])
    proxy = as_store(StoreProxy(store, try_create_node_launch=_wrong_launch(**changes)))
    with pytest.raises(StoreContractError) as info:
        start_run(proxy, "run-1", callbacks=CallbackLog().callbacks)
    assert str(info.value) == f"try_create_node_launch for node 0 returned {message}"
    assert info.value.field == field


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (None, "try_create_node_launch returned NoneType; expected LaunchCreateResult"),
        (
            LaunchCreateResult.model_construct(status=LaunchCreateStatus.CREATED, launch=None),
            "try_create_node_launch returned a created result whose launch is NoneType; "
            "expected NodeLaunch",
        ),
    ],
)
def test_or_07_a_non_result_is_a_contract_error(answer: object, message: str) -> None:
    store = MemoryStore()
    store.create_run("run-1", [root("a")])
    proxy = as_store(StoreProxy(store, try_create_node_launch=lambda inner, *a, **k: answer))
    with pytest.raises(StoreContractError) as info:
        start_run(proxy, "run-1", callbacks=CallbackLog().callbacks)
    assert str(info.value) == message


# --- limits -------------------------------------------------------------------


def test_store_limits_bound_publication_and_fail_the_run() -> None:
    store = MemoryStore(limits=Limits(max_outputs_per_task_completion=2))
    log = new_run(store, [root("a")])
    worker = FakeWorker(store, log, handlers={"a": lambda item: Complete(emit("x", "y", "z"))})
    worker.drain()
    record = store.get_run("run-1")
    assert record is not None
    assert record.status is RunStatus.FAILED
    assert record.error is not None
    assert "contains 3 outputs; maximum is 2" in record.error
    assert store.get_output_ids("run-1", 0) == ()


def test_task_retry_of_a_crash_under_continue_others_reopens_the_node() -> None:
    store = MemoryStore()
    log = new_run(store, [root("a"), root("b")], failure_policy=FailurePolicy.CONTINUE_OTHERS)
    worker = FakeWorker(
        store, log, handlers={"a": lambda item: Crash("lost"), "b": lambda item: Hold()}
    )
    worker.drain()
    crashed = only_task(store, "run-1", 0)
    assert crashed.status is TaskStatus.CRASHED
    new_attempt = retry_task(store, crashed.task_id, expected_attempt_id=crashed.attempt_id)
    assert new_attempt is not None
    worker.handlers.clear()
    worker.drain()
    held = worker.held[0]
    on_task_complete(
        store,
        task_id=held.claim.task_id,
        expected_attempt_id=held.claim.attempt_id,
        callbacks=log.callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.COMPLETED


# --- thread safety ----------------------------------------------------------


def test_concurrent_claims_let_exactly_one_delivery_win() -> None:
    store = MemoryStore()
    new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)
    barrier = threading.Barrier(8)
    wins: list[object] = []

    def attempt() -> None:
        barrier.wait()
        result = store.try_claim_task(
            record.task_id, expected_attempt_id=record.attempt_id, expected_generation=0
        )
        if result is not None:
            wins.append(result)

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wins) == 1
