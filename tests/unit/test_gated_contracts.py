"""Gated dispatch contracts GD-01..GD-18 (contracts.md section 21) in this
engine's terms: units are tasks and nodes, markers are durable task and
launch records, the backstop is the periodic reconcile. Contracts covered
elsewhere or not applicable are mapped in docs/gated-dispatch.md.

In-memory store with a fake clock; the backstop and store parts also run on
SQLite and PostgreSQL through the store contract suite (contract_backstop).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

import dagwerk.runtime.backstop as backstop_module
from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import FailurePolicy, RunStatus, TaskStatus
from dagwerk.engine import Engine
from dagwerk.errors import GraphValidationError
from dagwerk.graph import validate_graph
from dagwerk.health import HealthServer, HealthState
from dagwerk.metrics import Metrics
from dagwerk.models import DagNode, EmittedOutput, InputEdge
from dagwerk.orchestrator import on_task_complete, on_task_failed, reconcile_run
from dagwerk.retry import rerun_nodes
from dagwerk.runtime.backstop import Backstop, diagnose_stored_run
from dagwerk.runtime.clock import FakeClock
from dagwerk.runtime.errors import WorkerStoppedError
from dagwerk.runtime.worker import Worker
from dagwerk.stall import NodeState, diagnose_run
from dagwerk.store import Delivery, LeasedDelivery, TaskRecord
from dagwerk.testing.helpers import CallbackLog, child, claim, new_run, root, tasks_of


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock=clock.time)


def _complete(store: MemoryStore, record: TaskRecord, log: CallbackLog, *ids: str) -> None:
    claim(store, record)
    on_task_complete(
        store,
        task_id=record.task_id,
        expected_attempt_id=record.attempt_id,
        outputs=tuple(EmittedOutput(id=i, fields={}) for i in ids),
        callbacks=log.callbacks,
    )


def _fail(store: MemoryStore, record: TaskRecord, log: CallbackLog) -> None:
    claim(store, record)
    on_task_failed(
        store,
        task_id=record.task_id,
        expected_attempt_id=record.attempt_id,
        error_message="boom",
        callbacks=log.callbacks,
    )


def _why(store: MemoryStore, run_id: str = "run-1") -> dict[str, tuple[NodeState, str]]:
    diagnosis = diagnose_stored_run(store, run_id)
    assert diagnosis is not None
    return {n.slug: (n.state, n.reason) for n in diagnosis.nodes}


def _only(store: MemoryStore, node: int, run_id: str = "run-1") -> TaskRecord:
    (record,) = tasks_of(store, run_id, node)
    return record


# --- GD-01 derived status ------------------------------------------------------------------


def test_gd_01_failed_beats_completed_within_a_node(store: MemoryStore) -> None:
    """A node with a completed and a failed task derives FAILED, not DONE."""
    log = new_run(
        store, [root("fan"), child("each", "fan")], failure_policy=FailurePolicy.CONTINUE_OTHERS
    )
    _complete(store, _only(store, 0), log, "x", "y")
    first, second = tasks_of(store, "run-1", 1)
    _complete(store, first, log, "ok")
    _fail(store, second, log)
    assert _why(store)["each"][0] is NodeState.FAILED


def test_gd_01_a_rerun_node_derives_ready_again_over_its_stale_completion(
    store: MemoryStore,
) -> None:
    """Dirtied (re-run) overrides a stale completed marker; status is derived
    on every read, never stored."""
    log = new_run(store, [root("a"), child("b", "a")])
    _complete(store, _only(store, 0), log, "a-1")
    _complete(store, _only(store, 1), log, "b-1")
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert _why(store)["a"][0] is NodeState.DONE
    rerun_nodes(store, "run-1", [0])
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    why = _why(store)
    assert why["a"][0] is NodeState.QUEUED
    assert why["b"] == (NodeState.PENDING, "waiting on node a")


# --- GD-02 dispatchable iff every prerequisite is done --------------------------------------


def test_gd_02_a_node_waits_for_all_prerequisites(store: MemoryStore) -> None:
    log = new_run(store, [root("a"), root("c"), child("b", "a", "c", mode=_all())])
    _complete(store, _only(store, 0), log, "a-1")
    assert tasks_of(store, "run-1", 2) == []  # c is not done yet: b is held
    assert _why(store)["b"] == (NodeState.PENDING, "waiting on node c")
    _complete(store, _only(store, 1), log, "c-1")
    assert len(tasks_of(store, "run-1", 2)) == 1


def test_gd_02_a_failed_prerequisite_holds_its_dependents_only(store: MemoryStore) -> None:
    log = new_run(
        store,
        [root("a"), child("b", "a"), root("x"), child("y", "x")],
        failure_policy=FailurePolicy.CONTINUE_OTHERS,
    )
    _fail(store, _only(store, 0), log)
    assert tasks_of(store, "run-1", 1) == []
    _complete(store, _only(store, 2), log, "x-1")
    assert len(tasks_of(store, "run-1", 3)) == 1  # the independent branch flows
    why = _why(store)
    assert why["b"] == (NodeState.UPSTREAM_FAILED, "upstream failed at a")
    assert why["y"][0] is NodeState.QUEUED


# --- GD-03 reasons -----------------------------------------------------------------------


def test_gd_03_waiting_names_the_first_unfinished_prerequisite_in_edge_order(
    store: MemoryStore,
) -> None:
    # Edges list c before a although a has the lower index.
    new_run(store, [root("a"), root("c"), child("b", "c", "a", mode=_all())])
    diagnosis = diagnose_stored_run(store, "run-1")
    assert diagnosis is not None
    assert [n.slug for n in diagnosis.nodes] == ["a", "c", "b"]  # one per node, node order
    assert diagnosis.nodes[2].reason == "waiting on node c"


# --- GD-04 stall -------------------------------------------------------------------------


def test_gd_04_not_stalled_for_an_empty_or_settled_or_progressing_run(store: MemoryStore) -> None:
    assert diagnose_run("r", RunStatus.RUNNING, [], {}, []).stall is None
    log = new_run(
        store,
        [root("a"), child("b", "a"), root("x")],
        failure_policy=FailurePolicy.CONTINUE_OTHERS,
    )
    _fail(store, _only(store, 0), log)
    diagnosis = diagnose_stored_run(store, "run-1")
    assert diagnosis is not None and diagnosis.stall is None  # x is still queued
    _complete(store, _only(store, 2), log, "x-1")
    assert store.get_run_status("run-1") is RunStatus.FAILED  # all settled: finalised
    diagnosis = diagnose_stored_run(store, "run-1")
    assert diagnosis is not None and diagnosis.stall is None


def test_gd_04_held_nodes_are_sorted_and_a_stall_is_only_reported(
    store: MemoryStore, clock: FakeClock
) -> None:
    new_run(store, [root("z"), child("y", "z"), child("x", "y")])
    (row,) = store.list_deliveries("run-1")
    store.ack_delivery(row.delivery_id)  # the delivery is lost
    diagnosis = diagnose_stored_run(store, "run-1")
    assert diagnosis is not None and diagnosis.stall is not None
    assert diagnosis.stall.held_nodes == (0, 1, 2)
    assert store.get_run_status("run-1") is RunStatus.RUNNING  # observability only
    assert store.list_stalls() == []  # diagnosing records nothing (GD-12: passes do)


def test_gd_04_a_cycle_never_reaches_a_run() -> None:
    """The seed's cycle stalls cannot arise: graph validation refuses cycles."""
    cyclic = [child("a", "b"), child("b", "a")]
    with pytest.raises(GraphValidationError):
        validate_graph(cyclic)
    with pytest.raises(GraphValidationError):
        validate_graph([child("a", "a")])


# --- GD-05 / GD-06 claim and publish in one commit -----------------------------------------


def test_gd_05_every_queued_task_has_its_delivery_from_the_same_commit(
    store: MemoryStore,
) -> None:
    log = new_run(store, [root("fan"), child("each", "fan")])
    _complete(store, _only(store, 0), log, "p", "q", "r")
    queued = {
        (t.task_id, t.attempt_id)
        for t in store.list_tasks("run-1")
        if t.status is TaskStatus.QUEUED
    }
    delivered = [
        (d.task_id, d.attempt_id) for d in store.list_deliveries("run-1") if d.node_index == 1
    ]
    assert len(queued) == 3 and sorted(queued) == sorted(delivered)


def test_gd_05_a_lost_claim_runs_nothing_and_the_task_stays_selectable(
    store: MemoryStore,
) -> None:
    from dagwerk.execution import claim_task

    new_run(store, [root("a")])
    record = _only(store, 0)
    assert (
        claim_task(store, record.task_id, expected_attempt_id="stale", expected_generation=0)
        is None
    )
    assert store.get_task(record.task_id).status is TaskStatus.QUEUED  # type: ignore[union-attr]
    (row,) = store.dequeue("w", limit=10, lease_seconds=30.0)
    assert row.task_id == record.task_id  # the next pass selects it again


# --- GD-07 in-flight dedup -----------------------------------------------------------------


def test_gd_07_reconcile_and_backstop_never_dispatch_a_task_twice(
    store: MemoryStore, clock: FakeClock
) -> None:
    log = new_run(store, [root("a"), root("b")])
    claim(store, _only(store, 0))  # a is in flight (claimed), b is queued
    before = (store.list_tasks("run-1"), store.list_deliveries("run-1"))
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    report = Backstop(store, clock=clock).run_pass()
    assert report.repaired == ()
    assert (store.list_tasks("run-1"), store.list_deliveries("run-1")) == before


def test_gd_07_a_rerun_node_is_dispatched_again_despite_its_old_claim(
    store: MemoryStore,
) -> None:
    log = new_run(store, [root("a")])
    old = _only(store, 0)
    _complete(store, old, log, "a-1")
    rerun_nodes(store, "run-1", [0])
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    new = _only(store, 0)
    assert new.task_id != old.task_id and new.status is TaskStatus.QUEUED
    assert [d.task_id for d in store.list_deliveries("run-1")] == [new.task_id]


# --- GD-10 resilient passes ------------------------------------------------------------------


class _FailingReads:
    """A store whose reads of runs fail; everything else goes to ``inner``."""

    def __init__(self, inner: MemoryStore, failing: set[str]) -> None:
        self._inner = inner
        self._failing = failing

    def __getattr__(self, name: str) -> Any:
        if name in self._failing:

            def fail(*args: object, **kwargs: object) -> object:
                raise ConnectionError(f"{name}: database went away")

            return fail
        return getattr(self._inner, name)


def test_gd_10_a_failed_read_skips_the_pass_without_raising_or_dispatching(
    store: MemoryStore, clock: FakeClock
) -> None:
    new_run(store, [root("a")])
    (row,) = store.list_deliveries("run-1")
    store.ack_delivery(row.delivery_id)
    broken = _FailingReads(store, {"list_runs"})
    report = Backstop(broken, clock=clock).run_pass()
    assert report.ran and report.repaired == () and report.errors
    assert "database went away" in report.errors[0]
    assert store.list_deliveries("run-1") == []  # nothing dispatched
    assert Backstop(store, clock=clock).run_pass().repaired == (("run-1", row.task_id),)


def test_gd_10_one_failing_run_does_not_stop_the_pass(
    store: MemoryStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    new_run(store, [root("a")], run_id="run-1")
    new_run(store, [root("a")], run_id="run-2")
    for run_id in ("run-1", "run-2"):
        (row,) = store.list_deliveries(run_id)
        store.ack_delivery(row.delivery_id)
    real = store.repair_missing_deliveries

    def flaky(run_id: str) -> list[str]:
        if run_id == "run-2":
            raise ConnectionError("read failed")
        return real(run_id)

    monkeypatch.setattr(store, "repair_missing_deliveries", flaky)
    report = Backstop(store, clock=clock).run_pass()
    assert [r for r, _ in report.repaired] == ["run-1"]
    assert len(report.errors) == 1 and report.errors[0].startswith("run-2: ")


# --- GD-11 failure policies -----------------------------------------------------------------


def test_gd_11_continue_others_keeps_independent_branches_dispatching_in_the_backstop(
    store: MemoryStore, clock: FakeClock
) -> None:
    log = new_run(
        store,
        [root("a"), child("b", "a"), root("x"), child("y", "x")],
        failure_policy=FailurePolicy.CONTINUE_OTHERS,
    )
    _fail(store, _only(store, 0), log)
    x = _only(store, 2)
    claim(store, x)
    # x's completion is committed but its reconcile is lost (a crash).
    assert store.try_complete_task(
        x.task_id, (EmittedOutput(id="x-1", fields={}),), expected_attempt_id=x.attempt_id
    )
    assert tasks_of(store, "run-1", 3) == []
    Backstop(store, clock=clock).run_pass()
    assert len(tasks_of(store, "run-1", 3)) == 1  # y launched by the backstop
    assert tasks_of(store, "run-1", 1) == []  # b stays held


def test_gd_11_an_unknown_failure_policy_is_a_config_error(tmp_path: Path) -> None:
    with Engine("memory://", execution_root=tmp_path) as engine:
        with pytest.raises(ValueError, match="is not a valid FailurePolicy"):
            engine.submit([DagNode(slug="a", plugin="a")], failure_policy="keep_going")
        assert engine.list_runs() == []


# --- GD-12 stall surfacing ------------------------------------------------------------------


def test_gd_12_running_work_is_not_a_stall(store: MemoryStore, clock: FakeClock) -> None:
    new_run(store, [root("a"), child("b", "a")])
    claim(store, _only(store, 0))
    clock.advance(10_000.0)
    assert Backstop(store, clock=clock).run_pass().stalls == ()
    assert _why(store)["a"] == (NodeState.RUNNING, "running")


def test_gd_12_stall_events_come_only_from_backstop_passes(
    store: MemoryStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    new_run(store, [root("a")])
    (row,) = store.list_deliveries("run-1")
    store.ack_delivery(row.delivery_id)
    metrics = Metrics(store=store)
    for _ in range(3):
        assert diagnose_stored_run(store, "run-1").stall is not None  # type: ignore[union-attr]
    # Reading (show --why, runs --stalled) records no stall and emits nothing.
    assert store.list_stalls() == [] and metrics.stall_events._value.get() == 0
    # A pass repairs what it can before judging: a repaired run is no stall.
    with caplog.at_level(logging.WARNING, logger="dagwerk.runtime.backstop"):
        backstop = Backstop(store, clock=clock, on_report=metrics.backstop_finished)
        assert backstop.run_pass().stalls == ()
    assert metrics.stall_events._value.get() == 0
    assert not [r for r in caplog.records if "stalled" in r.getMessage()]


# --- GD-13 whole-set read, capped with a warning ------------------------------------------


def test_gd_13_a_capped_pass_warns_that_it_was_truncated(
    store: MemoryStore,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for n in range(3):
        new_run(store, [root("a")], run_id=f"run-{n}")
    monkeypatch.setattr(backstop_module, "BACKSTOP_RUN_LIMIT", 2)
    with caplog.at_level(logging.WARNING, logger="dagwerk.runtime.backstop"):
        report = Backstop(store, clock=clock).run_pass()
    assert report.runs == 2
    assert any("truncated" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(backstop_module, "BACKSTOP_RUN_LIMIT", 4)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dagwerk.runtime.backstop"):
        assert Backstop(store, clock=clock).run_pass().runs == 3
    assert not any("truncated" in r.getMessage() for r in caplog.records)


# --- GD-14 dispatch messages carry references only --------------------------------------------


def test_gd_14_deliveries_carry_ids_and_routing_never_content(store: MemoryStore) -> None:
    references = {
        "delivery_id",
        "task_id",
        "attempt_id",
        "generation",
        "run_id",
        "node_index",
        "launch_id",
    }
    assert {f.name for f in dataclasses.fields(Delivery)} == references
    routing = {"queue", "priority", "delivery_count", "worker_id", "lease_expires_at", "offered_at"}
    assert {f.name for f in dataclasses.fields(LeasedDelivery)} == references | routing
    new_run(store, [root("a")], run_input={"secret": "s3cr3t"})
    (row,) = store.dequeue("w", limit=1, lease_seconds=30.0)
    assert "s3cr3t" not in repr(row)


# --- GD-15 a diamond end to end --------------------------------------------------------------


def test_gd_15_diamond_runs_each_node_once_in_dependency_order(tmp_path: Path) -> None:
    calls: list[str] = []
    lock = threading.Lock()

    def plugin(name: str) -> Any:
        def run(inputs: object, ctx: object) -> dict[str, str]:
            with lock:
                calls.append(name)
            return {"node": name}

        return run

    nodes = [
        DagNode(slug="a", plugin="a"),
        child("b", "a", mode=_all()),
        child("c", "a", mode=_all()),
        DagNode(
            slug="d",
            plugin="d",
            input_mode=_all(),
            edges=(InputEdge(name="b", source="b"), InputEdge(name="c", source="c")),
        ),
    ]
    with Engine("memory://", execution_root=tmp_path) as engine:
        for name in "abcd":
            engine.plugin(name)(plugin(name))
        result = engine.run(nodes, workers=4, timeout=60)
        assert result.status is RunStatus.COMPLETED
        attempts = [len(engine.list_attempts(t.task_id)) for t in engine.list_tasks(result.run_id)]
    assert sorted(calls) == ["a", "b", "c", "d"]
    assert calls[0] == "a" and calls[-1] == "d"
    assert attempts == [1, 1, 1, 1]


# --- GD-16 the run lifecycle completes exactly once -----------------------------------------


def test_gd_16_a_run_completes_once_however_many_passes_see_it(
    store: MemoryStore, clock: FakeClock
) -> None:
    log = new_run(store, [root("a")])
    record = _only(store, 0)
    claim(store, record)
    assert store.try_complete_task(
        record.task_id, (EmittedOutput(id="a-1", fields={}),), expected_attempt_id=record.attempt_id
    )
    fired: list[str] = []
    backstop = Backstop(
        store, clock=clock, callbacks=CallbackLog(hooks={"completed": fired.append}).callbacks
    )
    first = backstop.run_pass()
    assert first.finalised == (("run-1", RunStatus.COMPLETED),)
    for _ in range(2):
        assert backstop.run_pass().finalised == ()
        reconcile_run(store, "run-1", callbacks=log.callbacks)
    assert fired == ["run-1"] and log.kinds() == []
    assert store.get_run_status("run-1") is RunStatus.COMPLETED


def test_gd_16_an_empty_node_set_is_never_a_run() -> None:
    with pytest.raises(GraphValidationError):
        validate_graph([])


# --- GD-18 terminal lifecycle -----------------------------------------------------------------


def test_gd_18_a_stopped_worker_cannot_restart_and_stop_is_idempotent(
    store: MemoryStore, tmp_path: Path
) -> None:
    worker = Worker(store, {}, execution_root=tmp_path, backstop_interval=None)
    worker.start()
    worker.stop()
    worker.stop()  # a repeated stop is a no-op
    with pytest.raises(WorkerStoppedError):
        worker.start()


def test_gd_18_health_server_stop_is_idempotent(store: MemoryStore) -> None:
    server = HealthServer(Metrics(store=store), HealthState(store), port=0).start()
    server.stop()
    server.stop()


def _all() -> Any:
    from dagwerk.constants import InputMode

    return InputMode.ALL
