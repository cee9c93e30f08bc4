"""Contract tests: terminal staleness and planning snapshots (OR-18..OR-20)."""

from __future__ import annotations

import pytest

from dagwerk.constants import (
    InputMode,
    LaunchCreateStatus,
    NodeDisposition,
    RunStatus,
)
from dagwerk.json import FrozenDict
from dagwerk.models import TaskInputPlan, output_ref_routing_size
from dagwerk.orchestrator import (
    abort_run,
    on_task_complete,
)
from dagwerk.testing.helpers import (
    Complete,
    ContractStore,
    FakeWorker,
    child,
    claim,
    emit,
    launch_of,
    new_run,
    only_task,
    root,
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
