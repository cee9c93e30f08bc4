"""Contract tests: orchestration, reconciliation and finalisation (OR-01..OR-20)."""

from __future__ import annotations

from typing import Any

import pytest

from dagwerk.constants import (
    MAX_SNAPSHOT_RETRIES,
    CorrelationMode,
    InputMode,
    LaunchCreateStatus,
    NodeDisposition,
    RunStatus,
    TaskStatus,
)
from dagwerk.json import FrozenDict
from dagwerk.models import LaunchCreateResult, NodeLaunch, TaskInputPlan, output_ref_routing_size
from dagwerk.orchestrator import (
    RunStartRejectedError,
    abort_run,
    on_task_complete,
    on_task_crashed,
    on_task_failed,
    reconcile_run,
    start_run,
)
from dagwerk.retry import retry_run, retry_task
from dagwerk.store import (
    NodeLaunchRef,
    StoreContractError,
    TaskAttemptRef,
    TaskCompletionResult,
    TaskFailureResult,
)
from dagwerk.testing.helpers import (
    CallbackLog,
    Complete,
    ContractStore,
    FakeWorker,
    StoreProxy,
    as_store,
    chain,
    child,
    claim,
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
from dagwerk.waiting import resume_task, wait_task


def _complete_root_quietly(store: ContractStore, run_id: str, *ids: str) -> None:
    """Complete node 0's only task at the store level (no reconciliation)."""
    record = only_task(store, run_id, 0)
    claim(store, record)
    assert store.try_complete_task(
        record.task_id, emit(*ids), expected_attempt_id=record.attempt_id
    )


# --- OR-01 .. OR-03 ------------------------------------------------------------


def test_or_01_start_rejects_a_missing_topology(store: ContractStore) -> None:
    with pytest.raises(ValueError, match="no stored node definition"):
        start_run(store, "missing", callbacks=CallbackLog().callbacks)


def test_or_01_invalid_graph_never_reaches_running(store: ContractStore) -> None:
    cyclic = [child("a", "b"), child("b", "a")]
    try:
        created = store.create_run("run-1", cyclic)
    except ValueError:
        # Rejecting the graph at creation is stricter and also satisfies OR-01.
        assert store.get_run("run-1") is None
        return
    assert created is True
    with pytest.raises(ValueError):
        start_run(store, "run-1", callbacks=CallbackLog().callbacks)
    assert store.get_run_status("run-1") is RunStatus.PENDING
    assert dict(store.list_node_launches("run-1")) == {}
    assert store.list_deliveries("run-1") == []


def test_or_01_terminal_run_is_rejected_without_writing_work(store: ContractStore) -> None:
    log = new_run(store, [root("a")], start=False)
    abort_run(
        store, run_id="run-1", reason="x", callbacks=log.callbacks, status=RunStatus.CANCELLED
    )
    snapshot = fingerprint(store, "run-1")
    with pytest.raises(RunStartRejectedError):
        start_run(store, "run-1", callbacks=log.callbacks)
    assert fingerprint(store, "run-1") == snapshot


def test_or_01_start_returns_roots_and_uses_the_stored_definition(store: ContractStore) -> None:
    nodes = [root("a"), child("b", "a"), root("c")]
    store.create_run("run-1", nodes)
    # The caller's objects change after creation; the stored copy does not.
    nodes[0].plugin = "changed"
    copy = store.get_run_nodes("run-1")
    assert copy is not None
    copy[2].plugin = "also-changed"
    assert start_run(store, "run-1", callbacks=CallbackLog().callbacks) == [0, 2]
    launches = store.list_node_launches("run-1")
    assert sorted(launches) == [0, 2]
    assert launches[0].plugin_name == "a"
    assert launches[2].plugin_name == "c"


def test_or_02_start_is_idempotent_and_roots_launch_once(store: ContractStore) -> None:
    log = new_run(store, [root("a"), root("b"), child("c", "a", "b", mode=InputMode.ALL)])
    snapshot = fingerprint(store, "run-1")
    assert len(store.list_deliveries("run-1")) == 2
    assert start_run(store, "run-1", callbacks=log.callbacks) == [0, 1]
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    assert fingerprint(store, "run-1") == snapshot


def test_or_03_reconcile_ignores_runs_that_are_not_running(store: ContractStore) -> None:
    log = new_run(store, [root("a")], start=False)
    proxy = StoreProxy(store)
    reconcile_run(as_store(proxy), "run-1", callbacks=log.callbacks)
    reconcile_run(as_store(proxy), "missing", callbacks=log.callbacks)
    assert proxy.calls["get_run_nodes"] == 0
    assert proxy.calls["try_create_node_launch"] == 0
    assert store.get_run_status("run-1") is RunStatus.PENDING
    abort_run(store, run_id="run-1", reason="x", callbacks=log.callbacks)
    reconcile_run(as_store(proxy), "run-1", callbacks=log.callbacks)
    assert proxy.calls["get_run_nodes"] == 0


def test_or_03_running_run_without_topology_is_a_contract_error(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    proxy = StoreProxy(store, get_run_nodes=lambda inner, run_id: None)
    with pytest.raises(StoreContractError):
        reconcile_run(as_store(proxy), "run-1", callbacks=log.callbacks)


def test_or_03_reconcile_launches_a_node_that_was_ready_before_the_call(
    store: ContractStore,
) -> None:
    log = new_run(store, chain(2))
    _complete_root_quietly(store, "run-1", "x")
    assert launch_of(store, "run-1", 1) is None
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    assert len(tasks_of(store, "run-1", 1)) == 1


# --- OR-04 .. OR-08 ------------------------------------------------------------


def test_or_04_reconcile_reports_the_lowest_failed_node(store: ContractStore) -> None:
    nodes = [root("r"), child("b", "r", mode=InputMode.ALL), child("c", "r", mode=InputMode.ALL)]
    log = new_run(store, nodes)
    _complete_root_quietly(store, "run-1", "x")
    for index in (2, 1):  # the higher index first, so store order cannot decide
        token = snapshot_for(store, "run-1", index).token
        created = store.try_create_node_launch(
            "run-1", index, nodes[index].plugin, token, (), NodeDisposition.FAILED, f"err-{index}"
        )
        assert created.status is LaunchCreateStatus.CREATED

    def reversed_launches(inner: ContractStore, run_id: str) -> dict[int, NodeLaunch]:
        return dict(reversed(list(inner.list_node_launches(run_id).items())))

    proxy = StoreProxy(store, list_node_launches=reversed_launches)
    reconcile_run(as_store(proxy), "run-1", callbacks=log.callbacks)
    record = run_record(store, "run-1")
    assert record.status is RunStatus.FAILED
    assert record.error == "err-1"
    assert log.kinds() == ["failed"]


def test_or_05_a_join_waits_for_every_parent(store: ContractStore) -> None:
    log = new_run(store, [root("a"), root("b"), child("j", "a", "b", mode=InputMode.ALL)])
    first = only_task(store, "run-1", 0)
    claim(store, first)
    on_task_complete(
        store,
        task_id=first.task_id,
        expected_attempt_id=first.attempt_id,
        outputs=emit("x"),
        callbacks=log.callbacks,
    )
    assert launch_of(store, "run-1", 2) is None
    second = only_task(store, "run-1", 1)
    claim(store, second)
    on_task_complete(
        store,
        task_id=second.task_id,
        expected_attempt_id=second.attempt_id,
        outputs=emit("y"),
        callbacks=log.callbacks,
    )
    join = only_task(store, "run-1", 2)
    assert {e.edge: e.output_ids for e in join.plan.edges} == {"a": ("x",), "b": ("y",)}


def test_or_05_task_launches_complete_only_through_workers(store: ContractStore) -> None:
    new_run(store, [root("a")])
    launch = launch_of(store, "run-1", 0)
    assert launch is not None
    assert launch.disposition is NodeDisposition.LAUNCHED
    assert launch.complete is False


def test_or_05_zero_task_chain_finishes_in_one_call(store: ContractStore) -> None:
    length = 120
    log = new_run(store, chain(length))
    top = only_task(store, "run-1", 0)
    claim(store, top)
    proxy = StoreProxy(store)
    # The root emits nothing: every EACH descendant becomes a zero-task launch.
    on_task_complete(
        as_store(proxy),
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        outputs=(),
        callbacks=log.callbacks,
    )
    launches = store.list_node_launches("run-1")
    assert len(launches) == length
    assert all(launches[i].task_ids == () and launches[i].complete for i in range(1, length))
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert log.kinds() == ["completed"]
    assert proxy.calls["get_run_nodes"] == 1
    assert proxy.calls["list_node_launches"] == 1
    assert proxy.calls["get_planning_snapshot"] == length - 1


def test_or_06_stale_snapshot_is_retried_without_duplicate_launch(store: ContractStore) -> None:
    store.create_run("run-1", [root("a")])
    stale_once = {"left": 1}

    def racing(inner: ContractStore, *args: Any, **kwargs: Any) -> LaunchCreateResult:
        if stale_once["left"]:
            stale_once["left"] -= 1
            return LaunchCreateResult(status=LaunchCreateStatus.STALE)
        result: LaunchCreateResult = inner.try_create_node_launch(*args, **kwargs)
        return result

    proxy = StoreProxy(store, try_create_node_launch=racing)
    start_run(as_store(proxy), "run-1", callbacks=CallbackLog().callbacks)
    assert proxy.calls["get_planning_snapshot"] == 2
    assert len(store.list_tasks("run-1")) == 1
    assert len(store.list_deliveries("run-1")) == 1


def test_or_06_persistently_stale_node_is_deferred_not_failed(store: ContractStore) -> None:
    store.create_run("run-1", [root("a")])
    proxy = StoreProxy(
        store,
        try_create_node_launch=lambda inner, *a, **kw: LaunchCreateResult(
            status=LaunchCreateStatus.STALE
        ),
    )
    log = CallbackLog()
    start_run(as_store(proxy), "run-1", callbacks=log.callbacks)
    assert proxy.calls["get_planning_snapshot"] == MAX_SNAPSHOT_RETRIES
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert dict(store.list_node_launches("run-1")) == {}
    assert log.kinds() == []
    # A later reconcile picks the node up.
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    assert len(store.list_tasks("run-1")) == 1


def test_or_06_already_existing_launch_from_a_race_is_accepted_once(
    store: ContractStore,
) -> None:
    store.create_run("run-1", [root("a")])

    def raced(inner: ContractStore, *args: Any, **kwargs: Any) -> LaunchCreateResult:
        inner.try_create_node_launch(*args, **kwargs)  # the other process wins
        again: LaunchCreateResult = inner.try_create_node_launch(*args, **kwargs)
        assert again.status is LaunchCreateStatus.ALREADY_EXISTS
        return again

    proxy = StoreProxy(store, try_create_node_launch=raced)
    start_run(as_store(proxy), "run-1", callbacks=CallbackLog().callbacks)
    assert proxy.calls["try_create_node_launch"] == 1
    assert len(store.list_tasks("run-1")) == 1
    assert len(store.list_deliveries("run-1")) == 1


def test_or_06_existing_launch_of_another_generation_retries(store: ContractStore) -> None:
    store.create_run("run-1", [root("a")])
    calls = {"n": 0}

    def newer(inner: ContractStore, *args: Any, **kwargs: Any) -> LaunchCreateResult:
        calls["n"] += 1
        if calls["n"] == 1:
            return LaunchCreateResult(
                status=LaunchCreateStatus.ALREADY_EXISTS,
                launch=NodeLaunch(
                    id="elsewhere",
                    run_id="run-1",
                    node_index=0,
                    plugin_name="a",
                    generation=7,
                    disposition=NodeDisposition.LAUNCHED,
                    task_ids=("t",),
                ),
            )
        result: LaunchCreateResult = inner.try_create_node_launch(*args, **kwargs)
        return result

    proxy = StoreProxy(store, try_create_node_launch=newer)
    start_run(as_store(proxy), "run-1", callbacks=CallbackLog().callbacks)
    assert calls["n"] == 2
    assert proxy.calls["get_planning_snapshot"] == 2
    assert len(store.list_tasks("run-1")) == 1


_LAUNCH_MUTATIONS: dict[str, dict[str, object]] = {
    "run_id": {"run_id": "other-run"},
    "node_index": {"node_index": 5},
    "plugin_name": {"plugin_name": "other-plugin"},
    "generation": {"generation": 3},
    "task_count": {"task_ids": ("t-1", "t-2")},
    "complete": {"complete": True},
    "disposition": {"disposition": NodeDisposition.SKIPPED, "task_ids": (), "complete": True},
}


@pytest.mark.parametrize("mutation", sorted(_LAUNCH_MUTATIONS))
def test_or_07_launch_results_must_match_the_request(store: ContractStore, mutation: str) -> None:
    store.create_run("run-1", [root("a")])

    def lying(inner: ContractStore, *args: Any, **kwargs: Any) -> LaunchCreateResult:
        real: LaunchCreateResult = inner.try_create_node_launch(*args, **kwargs)
        assert real.launch is not None
        launch = real.launch.model_copy(update=_LAUNCH_MUTATIONS[mutation])
        return LaunchCreateResult(status=real.status, launch=launch)

    proxy = StoreProxy(store, try_create_node_launch=lying)
    with pytest.raises(StoreContractError):
        start_run(as_store(proxy), "run-1", callbacks=CallbackLog().callbacks)


def test_or_07_launch_result_must_be_a_launch_create_result(store: ContractStore) -> None:
    store.create_run("run-1", [root("a")])
    proxy = StoreProxy(store, try_create_node_launch=lambda inner, *a, **kw: object())
    with pytest.raises(StoreContractError):
        start_run(as_store(proxy), "run-1", callbacks=CallbackLog().callbacks)


def test_or_07_zero_task_launch_result_must_be_complete(store: ContractStore) -> None:
    log = new_run(store, chain(2))
    top = only_task(store, "run-1", 0)
    claim(store, top)

    def incomplete(inner: ContractStore, *args: Any, **kwargs: Any) -> LaunchCreateResult:
        real: LaunchCreateResult = inner.try_create_node_launch(*args, **kwargs)
        assert real.launch is not None
        # model_construct skips validation: the lie a broken store could tell.
        bad = NodeLaunch.model_construct(**{**dict(real.launch), "complete": False})
        return LaunchCreateResult.model_construct(status=real.status, launch=bad)

    proxy = StoreProxy(store, try_create_node_launch=incomplete)
    with pytest.raises(StoreContractError):
        on_task_complete(
            as_store(proxy),
            task_id=top.task_id,
            expected_attempt_id=top.attempt_id,
            outputs=(),
            callbacks=log.callbacks,
        )


def test_or_08_planning_failure_fails_the_run_and_is_retryable(store: ContractStore) -> None:
    # EACH over outputs of a root declared NONE must inherit an absent
    # correlation: planning fails (CR-03).
    nodes = [root("a", correlation_mode=CorrelationMode.NONE), child("b", "a")]
    log = new_run(store, nodes)
    FakeWorker(store, log).drain()
    launch = launch_of(store, "run-1", 1)
    assert launch is not None
    assert launch.disposition is NodeDisposition.FAILED
    assert launch.task_ids == ()
    assert "correlation" in launch.error
    record = run_record(store, "run-1")
    assert record.status is RunStatus.FAILED
    assert record.error == launch.error
    assert log.kinds() == ["failed"]
    assert retry_run(store, "run-1").affected_nodes == (1,)


# --- OR-09 .. OR-13 ------------------------------------------------------------


def test_or_09_completion_requires_every_node_settled(store: ContractStore) -> None:
    log = new_run(store, chain(2))
    assert not store.try_finalize_run("run-1", RunStatus.COMPLETED)  # task QUEUED
    top = only_task(store, "run-1", 0)
    claim(store, top)
    assert not store.try_finalize_run("run-1", RunStatus.COMPLETED)  # task RUNNING
    store.try_complete_task(top.task_id, emit("x"), expected_attempt_id=top.attempt_id)
    # node 1 has no launch yet
    assert not store.try_finalize_run("run-1", RunStatus.COMPLETED)
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    last = only_task(store, "run-1", 1)
    claim(store, last)
    store.try_complete_task(last.task_id, emit("y"), expected_attempt_id=last.attempt_id)
    assert store.try_finalize_run("run-1", RunStatus.COMPLETED)
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert run_record(store, "run-1").settled_nodes == 2
    assert log.kinds() == []


def test_or_09_terminal_transaction_rechecks_task_state(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    top = only_task(store, "run-1", 0)
    claim(store, top)
    assert store.mark_task_crashed(top.task_id, "lost", expected_attempt_id=top.attempt_id)
    retry_task(store, top.task_id, expected_attempt_id=top.attempt_id)
    assert not store.try_finalize_run("run-1", RunStatus.COMPLETED)
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert log.kinds() == []


def test_or_09_failed_launch_blocks_completion(store: ContractStore) -> None:
    nodes = [root("r"), child("b", "r", mode=InputMode.ALL)]
    new_run(store, nodes)
    _complete_root_quietly(store, "run-1", "x")
    token = snapshot_for(store, "run-1", 1).token
    store.try_create_node_launch("run-1", 1, "b", token, (), NodeDisposition.FAILED, "bad")
    assert not store.try_finalize_run("run-1", RunStatus.COMPLETED)


def test_or_10_finalize_argument_rules(store: ContractStore) -> None:
    new_run(store, [root("a")])
    top = only_task(store, "run-1", 0)
    ref = TaskAttemptRef(task_id=top.task_id, attempt_id=top.attempt_id)
    with pytest.raises(ValueError):
        store.try_finalize_run("run-1", RunStatus.RUNNING)
    with pytest.raises(ValueError):
        store.try_finalize_run("run-1", RunStatus.PENDING, reason="x")
    with pytest.raises(ValueError):
        store.try_finalize_run("run-1", RunStatus.FAILED, cause=ref, reason="x")
    with pytest.raises(ValueError):
        store.try_finalize_run("run-1", RunStatus.COMPLETED, reason="x")
    with pytest.raises(ValueError):
        store.try_finalize_run("run-1", RunStatus.COMPLETED, cause=ref)
    assert store.try_finalize_run("missing", RunStatus.FAILED, reason="x") is False
    assert store.get_run_status("run-1") is RunStatus.RUNNING


def test_or_10_a_cause_must_be_current_and_match_the_status(store: ContractStore) -> None:
    nodes = [root("a"), root("b"), root("c")]
    new_run(store, nodes)
    running, failed, crashed = (only_task(store, "run-1", i) for i in range(3))
    for record in (running, failed, crashed):
        claim(store, record)
    store.mark_task_failed(failed.task_id, "f", expected_attempt_id=failed.attempt_id)
    store.mark_task_crashed(crashed.task_id, "c", expected_attempt_id=crashed.attempt_id)

    def ref(record: Any, attempt: str | None = None) -> TaskAttemptRef:
        return TaskAttemptRef(task_id=record.task_id, attempt_id=attempt or record.attempt_id)

    snapshot = fingerprint(store, "run-1")
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, cause=ref(running))
    assert not store.try_finalize_run("run-1", RunStatus.CRASHED, cause=ref(failed))
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, cause=ref(crashed))
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, cause=ref(failed, "other"))
    launch = launch_of(store, "run-1", 0)
    assert launch is not None
    launch_ref = NodeLaunchRef(launch_id=launch.id, node_index=0, generation=launch.generation)
    # A launch cause needs an active FAILED launch.
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, cause=launch_ref)
    assert fingerprint(store, "run-1") == snapshot
    assert store.try_finalize_run("run-1", RunStatus.CRASHED, cause=ref(crashed))
    finished = run_record(store, "run-1")
    assert (finished.status, finished.error) == (RunStatus.CRASHED, "c")
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, reason="again")


def test_or_10_launch_cause_must_match_id_and_generation(store: ContractStore) -> None:
    nodes = [root("r"), child("b", "r", mode=InputMode.ALL)]
    new_run(store, nodes)
    _complete_root_quietly(store, "run-1", "x")
    token = snapshot_for(store, "run-1", 1).token
    created = store.try_create_node_launch(
        "run-1", 1, "b", token, (), NodeDisposition.FAILED, "bad"
    )
    assert created.launch is not None
    failed = created.launch
    wrong_gen = NodeLaunchRef(launch_id=failed.id, node_index=1, generation=failed.generation + 1)
    wrong_id = NodeLaunchRef(launch_id="other", node_index=1, generation=failed.generation)
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, cause=wrong_gen)
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, cause=wrong_id)
    good = NodeLaunchRef(launch_id=failed.id, node_index=1, generation=failed.generation)
    assert not store.try_finalize_run("run-1", RunStatus.CRASHED, cause=good)
    assert store.try_finalize_run("run-1", RunStatus.FAILED, cause=good)
    assert run_record(store, "run-1").error == "bad"


def test_or_11_run_error_is_the_persisted_attempt_error(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    top = only_task(store, "run-1", 0)
    claim(store, top)
    assert store.mark_task_failed(top.task_id, "first", expected_attempt_id=top.attempt_id)
    # The redelivered callback carries other text; the persisted error wins.
    on_task_failed(
        store,
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        error_message="second",
        callbacks=log.callbacks,
    )
    record = run_record(store, "run-1")
    assert (record.status, record.error) == (RunStatus.FAILED, "first")
    assert log.kinds() == ["failed"]


def test_or_12_failure_cancels_unfinished_work_and_invalidates_waits(
    store: ContractStore,
) -> None:
    nodes = [root("r"), child("c", "r")]
    log = new_run(store, nodes)
    top = only_task(store, "run-1", 0)
    claim(store, top)
    on_task_complete(
        store,
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        outputs=emit("x1", "x2", "x3", "x4"),
        callbacks=log.callbacks,
    )
    waiting, running, queued, failing = tasks_of(store, "run-1", 1)
    for record in (waiting, running, failing):
        claim(store, record)
    assert wait_task(
        store,
        waiting.task_id,
        "w",
        expected_attempt_id=waiting.attempt_id,
        expected_generation=waiting.generation,
    )
    on_task_failed(
        store,
        task_id=failing.task_id,
        expected_attempt_id=failing.attempt_id,
        error_message="boom",
        callbacks=log.callbacks,
    )
    run_state = run_record(store, "run-1")
    assert run_state.status is RunStatus.FAILED
    assert run_state.error == "boom"
    statuses = [task(store, r.task_id).status for r in (waiting, running, queued, failing)]
    assert statuses == [
        TaskStatus.CANCELLED,
        TaskStatus.CANCELLED,
        TaskStatus.CANCELLED,
        TaskStatus.FAILED,
    ]
    assert task(store, waiting.task_id).active_wait_id is None
    assert (
        resume_task(
            store,
            waiting.task_id,
            "w",
            expected_attempt_id=waiting.attempt_id,
            expected_generation=waiting.generation,
        )
        is None
    )
    # Only the root settled; tasks cancelled by the transition are no progress.
    assert run_state.settled_nodes == 1
    assert store.list_deliveries("run-1") == [] or all(
        store.try_claim_task(
            d.task_id, expected_attempt_id=d.attempt_id, expected_generation=d.generation
        )
        is None
        for d in store.list_deliveries("run-1")
    )
    assert log.kinds() == ["failed"]


def test_or_13_completion_callback_observes_committed_state(store: ContractStore) -> None:
    seen: list[tuple[RunStatus, int, int]] = []
    log = CallbackLog()

    def observe(run_id: str) -> None:
        record = run_record(store, run_id)
        seen.append((record.status, record.settled_nodes, record.node_count))

    log.hooks["completed"] = observe
    new_run(store, chain(3), log=log)
    FakeWorker(store, log).drain()
    assert seen == [(RunStatus.COMPLETED, 3, 3)]
    assert log.kinds() == ["completed"]


def test_or_13_raising_callback_cannot_strand_work(store: ContractStore) -> None:
    log = CallbackLog()

    def explode(run_id: str) -> None:
        raise RuntimeError("callback failed")

    log.hooks["failed"] = explode
    new_run(store, [root("a"), root("b")], log=log)
    failing, other = only_task(store, "run-1", 0), only_task(store, "run-1", 1)
    claim(store, failing)
    claim(store, other)
    with pytest.raises(RuntimeError, match="callback failed"):
        on_task_failed(
            store,
            task_id=failing.task_id,
            expected_attempt_id=failing.attempt_id,
            error_message="boom",
            callbacks=log.callbacks,
        )
    assert store.get_run_status("run-1") is RunStatus.FAILED
    assert task(store, other.task_id).status is TaskStatus.CANCELLED
    # A redelivery neither cancels again nor fires again.
    on_task_failed(
        store,
        task_id=failing.task_id,
        expected_attempt_id=failing.attempt_id,
        error_message="boom",
        callbacks=log.callbacks,
    )
    assert log.kinds() == ["failed"]


# --- OR-14 .. OR-17 ------------------------------------------------------------


def test_or_14_non_final_completions_do_not_read_the_graph(store: ContractStore) -> None:
    width = 20
    log = new_run(store, [root("r"), child("c", "r"), child("d", "c", mode=InputMode.ALL)])
    top = only_task(store, "run-1", 0)
    claim(store, top)
    ids = tuple(f"x{i}" for i in range(width))
    on_task_complete(
        store,
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        outputs=emit(*ids),
        callbacks=log.callbacks,
    )
    siblings = tasks_of(store, "run-1", 1)
    assert len(siblings) == width
    proxy = StoreProxy(store)
    for index, record in enumerate(siblings):
        claim(store, record)
        on_task_complete(
            as_store(proxy),
            task_id=record.task_id,
            expected_attempt_id=record.attempt_id,
            outputs=emit(f"y{index}"),
            callbacks=log.callbacks,
        )
        if index < width - 1:
            assert proxy.calls["get_run_nodes"] == 0
            assert proxy.calls["list_node_launches"] == 0
    assert proxy.calls["get_run_nodes"] == 1
    assert proxy.calls["list_node_launches"] == 1
    assert len(tasks_of(store, "run-1", 2)) == 1


def test_or_14_completion_results_are_checked(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    top = only_task(store, "run-1", 0)
    claim(store, top)
    # None: return silently.
    on_task_complete(
        store, task_id=top.task_id, expected_attempt_id="other", outputs=(), callbacks=log.callbacks
    )

    def foreign(inner: ContractStore, task_id: str, outputs: Any, **kw: Any) -> Any:
        return TaskCompletionResult(
            task_id="someone-else",
            attempt_id=kw["expected_attempt_id"],
            run_id="run-1",
            node_index=0,
            generation=0,
            launch_complete=False,
        )

    proxy = StoreProxy(store, try_complete_task=foreign)
    with pytest.raises(StoreContractError):
        on_task_complete(
            as_store(proxy),
            task_id=top.task_id,
            expected_attempt_id=top.attempt_id,
            outputs=(),
            callbacks=log.callbacks,
        )


def test_or_15_failure_and_crash_callbacks_finalise_the_run(store: ContractStore) -> None:
    log = new_run(store, [root("a")], "run-f")
    new_run(store, [root("a")], "run-c", log=log)
    for run_id, handler in (("run-f", on_task_failed), ("run-c", on_task_crashed)):
        record = only_task(store, run_id, 0)
        # None from the store: nothing happens.
        handler(
            store,
            task_id=record.task_id,
            expected_attempt_id=record.attempt_id,
            error_message="queued",
            callbacks=log.callbacks,
        )
        assert store.get_run_status(run_id) is RunStatus.RUNNING
        claim(store, record)
        handler(
            store,
            task_id=record.task_id,
            expected_attempt_id=record.attempt_id,
            error_message="err",
            callbacks=log.callbacks,
        )
    assert store.get_run_status("run-f") is RunStatus.FAILED
    assert store.get_run_status("run-c") is RunStatus.CRASHED
    assert task(store, only_task(store, "run-c", 0).task_id).status is TaskStatus.CRASHED
    assert log.events == [("failed", "run-f"), ("crashed", "run-c")]


def test_or_15_failure_results_are_checked(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    top = only_task(store, "run-1", 0)
    claim(store, top)

    def wrong_status(inner: ContractStore, task_id: str, error: str, **kw: Any) -> Any:
        return TaskFailureResult(
            task_id=task_id,
            attempt_id=kw["expected_attempt_id"],
            run_id="run-1",
            node_index=0,
            generation=0,
            status=TaskStatus.CRASHED,
        )

    proxy = StoreProxy(store, mark_task_failed=wrong_status)
    with pytest.raises(StoreContractError):
        on_task_failed(
            as_store(proxy),
            task_id=top.task_id,
            expected_attempt_id=top.attempt_id,
            error_message="e",
            callbacks=log.callbacks,
        )
    assert log.kinds() == []


def test_or_16_task_retry_winning_before_finalisation_keeps_the_run(
    store: ContractStore,
) -> None:
    log = new_run(store, [root("a")])
    top = only_task(store, "run-1", 0)
    claim(store, top)

    def retry_first(inner: ContractStore, run_id: str, status: RunStatus, **kw: Any) -> bool:
        # A concurrent task retry commits between the crash record and the
        # terminal transaction.
        assert retry_task(inner, top.task_id, expected_attempt_id=top.attempt_id) is not None
        result: bool = inner.try_finalize_run(run_id, status, **kw)
        return result

    proxy = StoreProxy(store, try_finalize_run=retry_first)
    on_task_crashed(
        as_store(proxy),
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        error_message="lost",
        callbacks=log.callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert task(store, top.task_id).status is TaskStatus.QUEUED
    assert log.kinds() == []


def test_or_17_abort_reports_whether_it_made_the_transition(store: ContractStore) -> None:
    log = new_run(store, [root("a")], "run-1")
    new_run(store, [root("a")], "run-2", log=log)
    new_run(store, [root("a")], "run-3", log=log)
    for bad in (RunStatus.COMPLETED, RunStatus.RUNNING, RunStatus.PENDING):
        with pytest.raises(ValueError):
            abort_run(store, run_id="run-1", reason="x", callbacks=log.callbacks, status=bad)
    assert abort_run(store, run_id="run-1", reason="stop", callbacks=log.callbacks)
    assert not abort_run(store, run_id="run-1", reason="stop", callbacks=log.callbacks)
    assert abort_run(
        store, run_id="run-2", reason="x", callbacks=log.callbacks, status=RunStatus.CRASHED
    )
    assert abort_run(
        store, run_id="run-3", reason="x", callbacks=log.callbacks, status=RunStatus.CANCELLED
    )
    assert not abort_run(store, run_id="missing", reason="x", callbacks=log.callbacks)
    assert run_record(store, "run-1").error == "stop"
    assert [store.get_run_status(r) for r in ("run-1", "run-2", "run-3")] == [
        RunStatus.FAILED,
        RunStatus.CRASHED,
        RunStatus.CANCELLED,
    ]
    assert log.events == [("failed", "run-1"), ("crashed", "run-2"), ("cancelled", "run-3")]


# --- OR-18 .. OR-20 ------------------------------------------------------------


def test_or_18_terminal_run_rejects_launches_and_claims(store: ContractStore) -> None:
    nodes = [root("r"), root("s"), child("b", "r", mode=InputMode.ALL)]
    log = new_run(store, nodes)
    queued = only_task(store, "run-1", 1)
    _complete_root_quietly(store, "run-1", "x")
    snapshot = snapshot_for(store, "run-1", 2)
    abort_run(store, run_id="run-1", reason="stop", callbacks=log.callbacks)
    plan = TaskInputPlan(generation=snapshot.generation, parameters=FrozenDict())
    created = store.try_create_node_launch("run-1", 2, "b", snapshot.token, (plan,), None)
    assert created.status is LaunchCreateStatus.STALE
    assert launch_of(store, "run-1", 2) is None
    assert (
        store.try_claim_task(
            queued.task_id, expected_attempt_id=queued.attempt_id, expected_generation=0
        )
        is None
    )


def test_or_19_snapshot_goes_stale_when_a_source_publishes(store: ContractStore) -> None:
    nodes = [root("r"), child("m", "r"), child("c", "m", mode=InputMode.ALL)]
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
    first, second = tasks_of(store, "run-1", 1)
    claim(store, first)
    claim(store, second)
    store.try_complete_task(first.task_id, emit("m1"), expected_attempt_id=first.attempt_id)
    old = snapshot_for(store, "run-1", 2)
    store.try_complete_task(second.task_id, emit("m2"), expected_attempt_id=second.attempt_id)
    plan = TaskInputPlan(generation=old.generation, parameters=FrozenDict())
    stale = store.try_create_node_launch("run-1", 2, "c", old.token, (plan,), None)
    assert stale.status is LaunchCreateStatus.STALE
    assert launch_of(store, "run-1", 2) is None
    fresh = snapshot_for(store, "run-1", 2)
    assert [r.id for r in fresh.outputs_by_edge["m"]] == ["m1", "m2"]
    created = store.try_create_node_launch("run-1", 2, "c", fresh.token, (plan,), None)
    assert created.status is LaunchCreateStatus.CREATED
    again = store.try_create_node_launch("run-1", 2, "c", fresh.token, (plan,), None)
    assert again.status is LaunchCreateStatus.ALREADY_EXISTS
    assert again.launch == created.launch
    # STALE takes precedence over ALREADY_EXISTS for an outdated token.
    late = store.try_create_node_launch("run-1", 2, "c", old.token, (plan,), None)
    assert late.status is LaunchCreateStatus.STALE
    assert len(tasks_of(store, "run-1", 2)) == 1


def test_or_20_snapshot_returns_one_extra_output_per_edge_and_in_total(
    store: ContractStore,
) -> None:
    nodes = [root("a"), root("b"), child("j", "a", "b", mode=InputMode.ALL)]
    new_run(store, nodes)
    for index, prefix in ((0, "a"), (1, "b")):
        record = only_task(store, "run-1", index)
        claim(store, record)
        outputs = emit(*(f"{prefix}{i}" for i in range(5)))
        store.try_complete_task(record.task_id, outputs, expected_attempt_id=record.attempt_id)

    def read(per_edge: int, total: int, size: int = 1 << 24) -> dict[str, list[str]]:
        snap = store.get_planning_snapshot(
            "run-1",
            2,
            {"a": 0, "b": 1},
            max_outputs_per_edge=per_edge,
            max_outputs_total=total,
            max_routing_bytes=size,
        )
        return {edge: [r.id for r in refs] for edge, refs in snap.outputs_by_edge.items()}

    exact = read(5, 10)
    assert exact == {"a": [f"a{i}" for i in range(5)], "b": [f"b{i}" for i in range(5)]}
    per_edge = read(2, 100)
    assert per_edge == {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"]}
    total = read(100, 3)
    assert set(total) == {"a", "b"}
    assert sum(len(ids) for ids in total.values()) == 4
    for bad in ((-1, 10), (5, -1)):
        with pytest.raises(ValueError):
            read(*bad)
    with pytest.raises(ValueError):
        read(5, 10, -1)


def test_or_20_snapshot_stops_after_routing_byte_overflow(store: ContractStore) -> None:
    nodes = [root("a"), root("b"), child("j", "a", "b", mode=InputMode.ALL)]
    new_run(store, nodes)
    for index, prefix in ((0, "a"), (1, "b")):
        record = only_task(store, "run-1", index)
        claim(store, record)
        outputs = emit(*(f"{prefix}{i}" for i in range(3)), pad="x" * 50)
        store.try_complete_task(record.task_id, outputs, expected_attempt_id=record.attempt_id)
    full = snapshot_for(store, "run-1", 2)
    first = full.outputs_by_edge["a"][0]
    one = output_ref_routing_size(first)
    snap = store.get_planning_snapshot(
        "run-1",
        2,
        {"a": 0, "b": 1},
        max_outputs_per_edge=100,
        max_outputs_total=100,
        max_routing_bytes=one + 1,
    )
    # The second output crosses the limit and is kept as the overflow signal;
    # loading stops there, so the later edge is empty but present.
    assert [r.id for r in snap.outputs_by_edge["a"]] == ["a0", "a1"]
    assert list(snap.outputs_by_edge["b"]) == []
    assert snap.token  # the token still covers the full source state
    exact = store.get_planning_snapshot(
        "run-1",
        2,
        {"a": 0, "b": 1},
        max_outputs_per_edge=100,
        max_outputs_total=100,
        max_routing_bytes=sum(output_ref_routing_size(r) for r in full.outputs_by_edge["a"])
        + sum(output_ref_routing_size(r) for r in full.outputs_by_edge["b"]),
    )
    assert len(exact.outputs_by_edge["a"]) + len(exact.outputs_by_edge["b"]) == 6


def test_or_20_every_edge_key_is_present_and_dispositions_are_reported(
    store: ContractStore,
) -> None:
    nodes = [root("a"), root("b"), child("j", "a", side=("b",), mode=InputMode.ALL)]
    log = new_run(store, nodes)
    FakeWorker(store, log, handlers={"b": lambda item: Complete(())}).drain()
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    snap = snapshot_for(store, "run-1", 2)
    assert set(snap.outputs_by_edge) == {"a", "b"}
    assert dict(snap.source_dispositions) == {
        "a": NodeDisposition.LAUNCHED,
        "b": NodeDisposition.LAUNCHED,
    }
    assert snap.generation == 0
