"""Contract tests: start, reconciliation and launch creation (OR-01..OR-08)."""

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
)
from dagwerk.models import LaunchCreateResult, NodeLaunch
from dagwerk.orchestrator import (
    RunStartRejectedError,
    abort_run,
    on_task_complete,
    reconcile_run,
    start_run,
)
from dagwerk.retry import retry_run
from dagwerk.store import (
    StoreContractError,
)
from dagwerk.testing.helpers import (
    CallbackLog,
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
    tasks_of,
)


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
