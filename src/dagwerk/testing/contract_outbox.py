"""Contract tests: outbox atomicity (OB-01..OB-04) and task inputs (TI-01..TI-04)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from dagwerk.constants import InputMode, InputRole, NodeDisposition, RunStatus, TaskStatus
from dagwerk.errors import MaterializationError
from dagwerk.execution import recover_task
from dagwerk.json import FrozenDict
from dagwerk.models import PlannedEdgeInput, ResolvedOutput, TaskInputPlan
from dagwerk.orchestrator import on_task_complete, on_task_failed, reconcile_run
from dagwerk.retry import retry_run, retry_task
from dagwerk.task_input import resolve_task_inputs
from dagwerk.testing.helpers import (
    Complete,
    ContractStore,
    Fail,
    FakeWorker,
    Outcome,
    WorkItem,
    assert_queued_tasks_deliverable,
    child,
    claim,
    deliveries_for,
    emit,
    fingerprint,
    new_run,
    only_task,
    root,
    snapshot_for,
    task,
    tasks_of,
)
from dagwerk.waiting import resume_task, wait_task

# --- OB ------------------------------------------------------------------------


def test_ob_01_every_transition_into_queued_commits_its_delivery(store: ContractStore) -> None:
    new_run(store, [root("a"), root("b"), root("c")])
    assert_queued_tasks_deliverable(store, "run-1")  # launch creation
    resumed, recovered, retried = (only_task(store, "run-1", i) for i in range(3))
    for record in (resumed, recovered, retried):
        claim(store, record)
    wait_task(
        store, resumed.task_id, "w", expected_attempt_id=resumed.attempt_id, expected_generation=0
    )
    assert resume_task(
        store, resumed.task_id, "w", expected_attempt_id=resumed.attempt_id, expected_generation=0
    )
    assert recover_task(
        store, recovered.task_id, expected_attempt_id=recovered.attempt_id, expected_generation=0
    )
    store.mark_task_crashed(retried.task_id, "lost", expected_attempt_id=retried.attempt_id)
    assert retry_task(store, retried.task_id, expected_attempt_id=retried.attempt_id)
    for record in (resumed, recovered, retried):
        current = task(store, record.task_id)
        assert current.status is TaskStatus.QUEUED
        assert current.attempt_id != record.attempt_id
    assert_queued_tasks_deliverable(store, "run-1")


def test_ob_01_deliveries_survive_until_acknowledged(store: ContractStore) -> None:
    new_run(store, [root("a")])
    (row,) = store.list_deliveries("run-1")
    assert store.list_deliveries() == [row]
    assert store.ack_delivery(row.delivery_id) is True
    assert store.ack_delivery(row.delivery_id) is False
    assert store.list_deliveries("run-1") == []


def test_ob_02_invalid_launch_request_writes_nothing(store: ContractStore) -> None:
    nodes = [root("r"), child("b", "r", mode=InputMode.ALL)]
    new_run(store, nodes)
    top = only_task(store, "run-1", 0)
    claim(store, top)
    store.try_complete_task(top.task_id, emit("x"), expected_attempt_id=top.attempt_id)
    snap = snapshot_for(store, "run-1", 1)
    before = fingerprint(store, "run-1")
    good = TaskInputPlan(generation=snap.generation, parameters=FrozenDict())
    wrong_generation = TaskInputPlan(generation=snap.generation + 1, parameters=FrozenDict())
    for plans, disposition in (
        ((good, wrong_generation), None),  # a plan of another generation
        ((), None),  # no plans and no zero-task disposition
        ((), NodeDisposition.LAUNCHED),  # LAUNCHED needs tasks
    ):
        with pytest.raises((ValueError, RuntimeError)):
            store.try_create_node_launch("run-1", 1, "b", snap.token, plans, disposition)
        assert fingerprint(store, "run-1") == before


def test_ob_03_claim_and_wait_create_no_deliveries(store: ContractStore) -> None:
    new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)
    (row,) = store.list_deliveries("run-1")
    assert (row.task_id, row.attempt_id, row.generation) == (
        record.task_id,
        record.attempt_id,
        record.generation,
    )
    assert (row.run_id, row.node_index, row.launch_id) == ("run-1", 0, record.launch_id)
    claim(store, record)
    assert store.list_deliveries("run-1") == [row]
    wait_task(
        store, record.task_id, "w", expected_attempt_id=record.attempt_id, expected_generation=0
    )
    assert store.list_deliveries("run-1") == [row]


def test_ob_04_run_retry_invalidates_pending_deliveries(store: ContractStore) -> None:
    nodes = [root("r"), child("c", "r")]
    log = new_run(store, nodes)
    top = only_task(store, "run-1", 0)
    claim(store, top)
    on_task_complete(
        store,
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        outputs=emit("x1", "x2"),
        callbacks=log.callbacks,
    )
    failing, pending = tasks_of(store, "run-1", 1)
    claim(store, failing)
    on_task_failed(
        store,
        task_id=failing.task_id,
        expected_attempt_id=failing.attempt_id,
        error_message="boom",
        callbacks=log.callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.FAILED
    retry_run(store, "run-1")
    invalidated = {
        t.task_id for t in store.list_tasks("run-1", include_invalidated=True) if t.invalidated
    }
    assert {failing.task_id, pending.task_id} <= invalidated
    assert not [d for d in store.list_deliveries("run-1") if d.task_id in invalidated]
    assert (
        store.try_claim_task(
            pending.task_id, expected_attempt_id=pending.attempt_id, expected_generation=0
        )
        is None
    )
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    assert_queued_tasks_deliverable(store, "run-1")
    assert all(d.generation == 1 for d in store.list_deliveries("run-1") if d.node_index == 1)


# --- TI ------------------------------------------------------------------------


class _RecordingResolver:
    """An OutputResolver over a fixed table that records every request."""

    def __init__(self, table: Mapping[str, ResolvedOutput]) -> None:
        self.table = dict(table)
        self.requests: list[tuple[str, tuple[str, ...]]] = []

    def resolve_outputs(self, run_id: str, output_ids: tuple[str, ...]) -> Mapping[str, Any]:
        self.requests.append((run_id, tuple(output_ids)))
        return {i: self.table[i] for i in output_ids if i in self.table}


def _plan(*edges: tuple[str, tuple[str, ...]], **parameters: object) -> TaskInputPlan:
    return TaskInputPlan(
        generation=0,
        edges=tuple(
            PlannedEdgeInput(edge=name, source_index=n, role=InputRole.MAIN, output_ids=ids)
            for n, (name, ids) in enumerate(edges)
        ),
        parameters=FrozenDict(parameters),
    )


def test_ti_01_resolution_is_bulk_unique_and_restores_plan_order() -> None:
    table = {i: ResolvedOutput(id=i, fields=FrozenDict({"n": i})) for i in ("a", "b", "c")}
    resolver = _RecordingResolver(table)
    plan = _plan(("left", ("c", "a")), ("right", ("a", "b")), p=1)
    inputs = resolve_task_inputs(resolver, run_id="run-1", plan=plan)
    assert resolver.requests == [("run-1", ("c", "a", "b"))]
    assert [o.id for o in inputs.edges["left"]] == ["c", "a"]
    assert [o.id for o in inputs.edges["right"]] == ["a", "b"]
    assert dict(inputs.parameters) == {"p": 1}
    empty = _RecordingResolver({})
    nothing = resolve_task_inputs(empty, run_id="run-1", plan=_plan())
    assert empty.requests == [("run-1", ())]
    assert dict(nothing.edges) == {}


def test_ti_02_resolver_results_are_checked() -> None:
    plan = _plan(("e", ("a", "b")))
    good = {i: ResolvedOutput(id=i, fields=FrozenDict()) for i in ("a", "b")}

    class Fixed:
        def __init__(self, result: object) -> None:
            self.result = result

        def resolve_outputs(self, run_id: str, output_ids: tuple[str, ...]) -> Any:
            return self.result

    for result in (
        {"a": good["a"]},  # missing
        {**good, "z": ResolvedOutput(id="z", fields=FrozenDict())},  # extra
        {"a": good["b"], "b": good["a"]},  # key / ID mismatch
        [good["a"], good["b"]],  # not a mapping
        {"a": good["a"], "b": {"id": "b"}},  # not a ResolvedOutput
    ):
        with pytest.raises(MaterializationError):
            resolve_task_inputs(Fixed(result), run_id="run-1", plan=plan)

    class Broken:
        def resolve_outputs(self, run_id: str, output_ids: tuple[str, ...]) -> Any:
            raise OSError("disk gone")

    with pytest.raises(MaterializationError, match="materializer failed") as caught:
        resolve_task_inputs(Broken(), run_id="run-1", plan=plan)
    assert isinstance(caught.value.__cause__, OSError)


def test_ti_03_resolution_is_run_scoped(
    store: ContractStore,
) -> None:
    log = new_run(store, [root("a"), child("b", "a")], "run-1")
    new_run(store, [root("a")], "run-2", log=log)
    FakeWorker(
        store,
        log,
        handlers={"b": lambda item: Fail("boom")},
    ).drain("run-1")
    (root_output,) = store.get_output_ids("run-1", 0)
    plan = _plan(("a", (root_output,)))
    assert [o.id for o in resolve_task_inputs(store, run_id="run-1", plan=plan).edges["a"]] == [
        root_output
    ]
    with pytest.raises(MaterializationError):
        resolve_task_inputs(store, run_id="run-2", plan=plan)
    assert root_output not in store.resolve_outputs("run-2", (root_output,))


def test_ti_03_invalidated_outputs_stop_resolving(store: ContractStore) -> None:
    log = new_run(store, [root("a"), child("b", "a")])

    def half(item: WorkItem) -> Outcome:
        if item.inputs.edges["a"][0].id == "r2":
            return Fail("boom")
        return Complete(emit("b-ok"))

    handlers = {"a": lambda item: Complete(emit("r1", "r2")), "b": half}
    FakeWorker(store, log, handlers=handlers).drain()
    assert store.get_run_status("run-1") is RunStatus.FAILED
    plan = _plan(("b", ("b-ok",)))
    assert [o.id for o in resolve_task_inputs(store, run_id="run-1", plan=plan).edges["b"]] == [
        "b-ok"
    ]
    retry_run(store, "run-1")
    with pytest.raises(MaterializationError):
        resolve_task_inputs(store, run_id="run-1", plan=plan)
    # Unaffected outputs keep resolving.
    assert resolve_task_inputs(store, run_id="run-1", plan=_plan(("a", ("r1", "r2")))).edges["a"]


def test_ti_04_run_input_reaches_a_root_worker_unchanged(store: ContractStore) -> None:
    run_input = {"flag": False, "count": 0, "nested": {"k": [1, "two", None]}, "text": ""}
    log = new_run(store, [root("a")], run_input=run_input)
    record = only_task(store, "run-1", 0)
    assert dict(record.plan.parameters) == dict(FrozenDict(run_input))
    seen: list[Any] = []

    def capture(item: WorkItem) -> Outcome:
        seen.append(item.inputs.parameters)
        return Complete()

    FakeWorker(store, log, handlers={"a": capture}).drain()
    (parameters,) = seen
    assert type(parameters["flag"]) is bool
    assert parameters["flag"] is False
    assert type(parameters["count"]) is int
    assert parameters["nested"] == FrozenDict({"k": [1, "two", None]})
    assert isinstance(parameters["nested"], FrozenDict)
    assert deliveries_for(store, record.task_id) == []
