"""Gated dispatch (seed 004, contracts GD-*): re-run, the backstop, stall
detection and the per-node "why" explanation, on the in-memory store with a
fake clock."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import FailurePolicy, InputMode, RunStatus
from dagwerk.engine import Engine
from dagwerk.execution import claim_task
from dagwerk.metrics import Metrics
from dagwerk.models import DagNode, EmittedOutput, InputEdge
from dagwerk.orchestrator import OrchestratorCallbacks, on_task_complete, on_task_failed, start_run
from dagwerk.retry import rerun_nodes
from dagwerk.runtime.backstop import Backstop, diagnose_stored_run
from dagwerk.runtime.clock import FakeClock
from dagwerk.runtime.worker import Worker
from dagwerk.stall import NodeState
from dagwerk.store import LeasedDelivery, RerunRefusedError, TaskRecord
from dagwerk.waiting import wait_task


def _noop(run_id: str) -> None:
    return None


CALLBACKS = OrchestratorCallbacks(_noop, _noop, _noop, _noop)


def _root(slug: str, **settings: object) -> DagNode:
    return DagNode(slug=slug, plugin=slug, **settings)


def _child(slug: str, *sources: str) -> DagNode:
    return DagNode(
        slug=slug,
        plugin=slug,
        input_mode=InputMode.EACH,
        edges=tuple(InputEdge(name=s, source=s) for s in sources),
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock=clock.time)


def _start(
    store: MemoryStore,
    nodes: list[DagNode],
    run_id: str = "run-1",
    policy: FailurePolicy = FailurePolicy.FAIL_FAST,
) -> str:
    assert store.create_run(run_id, nodes, failure_policy=policy)
    start_run(store, run_id, callbacks=CALLBACKS)
    return run_id


def _tasks(store: MemoryStore, run_id: str, node: int) -> list[TaskRecord]:
    return [t for t in store.list_tasks(run_id) if t.node_index == node]


def _lease_claim(store: MemoryStore, task: TaskRecord) -> LeasedDelivery:
    rows = store.dequeue("w", limit=100, lease_seconds=60.0)
    (row,) = [r for r in rows if r.task_id == task.task_id]
    for other in rows:
        if other is not row:
            store.nack(other.delivery_id, "w")
    assert claim_task(
        store,
        task.task_id,
        expected_attempt_id=task.attempt_id,
        expected_generation=task.generation,
    )
    return row


def _complete_without_reconcile(store: MemoryStore, task: TaskRecord, output: str) -> None:
    """Commit a completion and 'crash' before the reconcile that should follow."""
    row = _lease_claim(store, task)
    assert store.try_complete_task(
        task.task_id, (EmittedOutput(id=output, fields={}),), expected_attempt_id=task.attempt_id
    )
    assert store.ack(row.delivery_id, "w")


def _worker(store: MemoryStore, clock: FakeClock, tmp_path: Path, **options: object) -> Worker:
    plugins = {name: (lambda inputs, ctx: {"ok": True}) for name in ("a", "b", "c", "d", "slow")}
    return Worker(store, plugins, execution_root=tmp_path, clock=clock, **options)  # type: ignore[arg-type]


# --- re-run (the reset contract, GD-08) ---------------------------------------------


def test_gd_08_rerun_from_completed_resets_the_node_and_its_descendants(
    store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    run_id = _start(store, [_root("a"), _child("b", "a"), _child("c", "b")])
    worker = _worker(store, clock, tmp_path)
    worker.run_until_idle()
    assert store.get_run_status(run_id) is RunStatus.COMPLETED
    old_b = store.get_output_ids(run_id, 1)
    old_a_task = _tasks(store, run_id, 0)[0]
    result = rerun_nodes(store, run_id, [1])
    assert result.affected_nodes == (1, 2)
    assert store.get_run_status(run_id) is RunStatus.RUNNING
    assert store.get_output_ids(run_id, 1) == ()  # old outputs stop resolving
    assert store.resolve_outputs(run_id, old_b) == {}
    from dagwerk.orchestrator import reconcile_run

    reconcile_run(store, run_id, callbacks=CALLBACKS)
    worker.run_until_idle()
    assert store.get_run_status(run_id) is RunStatus.COMPLETED
    assert _tasks(store, run_id, 0)[0] == old_a_task  # the upstream node was not re-run
    assert _tasks(store, run_id, 1)[0].generation == 1
    assert set(store.get_output_ids(run_id, 1)).isdisjoint(old_b)  # ids stay reserved


def test_gd_08_rerun_of_a_running_node_is_refused_with_a_clear_error(
    store: MemoryStore,
) -> None:
    run_id = _start(store, [_root("a"), _child("b", "a")])
    (task,) = _tasks(store, run_id, 0)
    _lease_claim(store, task)
    before = store.list_tasks(run_id, include_invalidated=True)
    with pytest.raises(RerunRefusedError) as caught:
        rerun_nodes(store, run_id, [0])
    assert caught.value.code == "rerun_running"
    assert "running" in str(caught.value).lower()
    assert store.list_tasks(run_id, include_invalidated=True) == before


def test_gd_08_engine_rerun_refuses_a_running_node(tmp_path: Path) -> None:
    with Engine("memory://", execution_root=tmp_path) as engine:
        run_id = engine.submit([_root("a")])
        (task,) = engine.list_tasks(run_id)
        _lease_claim(engine.store, task)
        with pytest.raises(RerunRefusedError, match="running"):
            engine.rerun(run_id, ["a"])


def test_gd_08_late_callbacks_of_the_old_generation_change_nothing(
    store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    """A re-run racing a late completion or failure from the old generation:
    the stale callback is fenced out and the new generation runs on."""
    run_id = _start(store, [_root("a"), _child("b", "a")])
    (a_task,) = _tasks(store, run_id, 0)
    _complete_without_reconcile(store, a_task, "a-1")
    from dagwerk.orchestrator import reconcile_run

    reconcile_run(store, run_id, callbacks=CALLBACKS)
    (b_old,) = _tasks(store, run_id, 1)
    # b's old attempt is QUEUED (not running): the re-run may reset it.
    rerun_nodes(store, run_id, [0])
    reconcile_run(store, run_id, callbacks=CALLBACKS)
    snapshot = store.list_tasks(run_id, include_invalidated=True)
    outputs = store.get_output_ids(run_id, 0)
    # Late callbacks of the old generation, as a slow worker would send them.
    on_task_complete(
        store,
        task_id=a_task.task_id,
        expected_attempt_id=a_task.attempt_id,
        outputs=(EmittedOutput(id="late", fields={}),),
        callbacks=CALLBACKS,
    )
    on_task_failed(
        store,
        task_id=b_old.task_id,
        expected_attempt_id=b_old.attempt_id,
        error_message="late failure",
        callbacks=CALLBACKS,
    )
    assert store.list_tasks(run_id, include_invalidated=True) == snapshot
    assert store.get_output_ids(run_id, 0) == outputs
    assert store.get_run_status(run_id) is RunStatus.RUNNING
    _worker(store, clock, tmp_path).run_until_idle()
    assert store.get_run_status(run_id) is RunStatus.COMPLETED
    assert "late" not in store.get_output_ids(run_id, 0)


# --- the backstop (GD-09) -------------------------------------------------------------


def test_gd_09_backstop_repairs_a_deleted_delivery_row(
    store: MemoryStore, clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = _start(store, [_root("a"), _child("b", "a")])
    (row,) = store.list_deliveries(run_id)
    assert store.ack_delivery(row.delivery_id)  # the invariant breaks
    worker = _worker(store, clock, tmp_path)
    assert worker.run_until_idle() == 0  # nothing to deliver: the run would hang
    with caplog.at_level(logging.WARNING, logger="dagwerk.runtime.backstop"):
        report = Backstop(store, clock=clock).run_pass()
    assert report.ran and report.repaired == ((run_id, row.task_id),)
    assert "repaired invariant violation" in caplog.text and row.task_id in caplog.text
    worker.run_until_idle()
    assert store.get_run_status(run_id) is RunStatus.COMPLETED


def test_gd_09_backstop_finalises_a_run_whose_last_reconcile_was_lost(
    store: MemoryStore,
) -> None:
    run_id = _start(store, [_root("a"), _child("b", "a")])
    (a_task,) = _tasks(store, run_id, 0)
    _complete_without_reconcile(store, a_task, "a-1")
    assert _tasks(store, run_id, 1) == []  # b was never launched: the reconcile was lost
    report = Backstop(store).run_pass()
    assert report.finalised == () and store.get_run_status(run_id) is RunStatus.RUNNING
    (b_task,) = _tasks(store, run_id, 1)
    _complete_without_reconcile(store, b_task, "b-1")
    assert store.get_run_status(run_id) is RunStatus.RUNNING  # crash before finalising
    report = Backstop(store).run_pass()
    assert report.finalised == ((run_id, RunStatus.COMPLETED),)
    assert store.get_run_status(run_id) is RunStatus.COMPLETED


def test_gd_11_backstop_honours_stop_on_first_failure(store: MemoryStore) -> None:
    nodes = [_root("a"), _root("b"), _child("c", "b")]
    run_id = _start(store, nodes, policy=FailurePolicy.STOP_ON_FIRST_FAILURE)
    (a_task,) = _tasks(store, run_id, 0)
    (b_task,) = _tasks(store, run_id, 1)
    _lease_claim(store, a_task)
    assert store.mark_task_failed(a_task.task_id, "boom", expected_attempt_id=a_task.attempt_id)
    _complete_without_reconcile(store, b_task, "b-1")
    diagnosis = diagnose_stored_run(store, run_id)
    assert diagnosis is not None
    assert diagnosis.nodes[2].reason == "held by stop_on_first_failure (node a failed)"
    report = Backstop(store).run_pass()
    assert 2 not in store.list_node_launches(run_id)  # nothing new was dispatched
    assert report.finalised == ((run_id, RunStatus.FAILED),)


def test_gd_09_disabled_backstop_never_runs_and_first_enabled_call_runs(
    store: MemoryStore, clock: FakeClock
) -> None:
    assert Backstop(store, interval=None, clock=clock).maybe_run() is None
    backstop = Backstop(store, interval=30.0, clock=clock)
    assert backstop.maybe_run() is not None  # once at start
    assert backstop.maybe_run() is None  # throttled
    clock.advance(30.0)
    assert backstop.maybe_run() is not None


def test_gd_09_a_pass_is_skipped_while_another_holder_has_the_lease(
    store: MemoryStore,
) -> None:
    assert store.try_acquire_lease("dagwerk.backstop", "someone-else", 60.0)
    report = Backstop(store).run_pass()
    assert report.ran is False


# --- stall detection (GD-04, GD-12) ----------------------------------------------------


def _wait(store: MemoryStore, task: TaskRecord, wait_id: str) -> None:
    row = _lease_claim(store, task)
    assert wait_task(
        store, task.task_id, wait_id, expected_attempt_id=task.attempt_id, expected_generation=0
    )
    store.ack(row.delivery_id, "w")


def test_gd_12_waiting_forever_is_a_stall_reported_once(
    store: MemoryStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = _start(store, [_root("a", wait_timeout_seconds=60.0), _child("b", "a")])
    (task,) = _tasks(store, run_id, 0)
    _wait(store, task, "approve")
    metrics = Metrics(store=store)
    backstop = Backstop(store, clock=clock, on_report=metrics.backstop_finished)
    assert backstop.run_pass().stalls == ()  # waiting within its timeout
    clock.advance(61.0)
    with caplog.at_level(logging.WARNING, logger="dagwerk.runtime.backstop"):
        first = backstop.run_pass()
        second = backstop.run_pass()
    (stall,) = first.stalls
    assert stall.new and stall.held_nodes == ("a", "b")
    assert "waiting for resume of wait approve" in stall.reason
    assert [s.new for s in second.stalls] == [False]
    lines = [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]
    assert len(lines) == 1 and run_id in lines[0] and "a, b" in lines[0]
    assert metrics.stall_events._value.get() == 1
    assert metrics.stalled_runs._value.get() == 1
    (record,) = store.list_stalls()
    assert record.run_id == run_id


class _TaskReadCounter(MemoryStore):
    """Counts reads of a run's whole task list."""

    task_reads = 0

    def list_tasks(self, run_id: str, *, include_invalidated: bool = False) -> list[TaskRecord]:
        self.task_reads += 1
        return super().list_tasks(run_id, include_invalidated=include_invalidated)


def test_gd_12_a_pass_over_a_progressing_run_does_not_read_all_its_tasks(
    clock: FakeClock,
) -> None:
    """A pass diagnosed every RUNNING run from all its tasks, on the worker's
    loop: ~2 s for a run of 100,000 tasks, every 30 s. A run with a node that
    is plainly live (a RUNNING task, a QUEUED one with its row) is not stalled
    and is known to be so from one indexed probe."""
    store = _TaskReadCounter(clock=clock.time)
    run_id = _start(store, [_root("a", wait_timeout_seconds=5.0), _root("c")])
    waiting, queued = _tasks(store, run_id, 0)[0], _tasks(store, run_id, 1)[0]
    _wait(store, waiting, "w1")
    clock.advance(6.0)  # node a is held by its overdue wait; node c is queued
    store.task_reads = 0
    backstop = Backstop(store, clock=clock)
    assert backstop.run_pass().stalls == ()
    assert store.task_reads == 0
    # Without a live node the run is diagnosed, and the stall found.
    _complete_without_reconcile(store, queued, "c-1")
    (stall,) = backstop.run_pass().stalls
    assert stall.held_nodes == ("a",) and "wait timeout" in stall.reason
    assert store.task_reads >= 1


def test_gd_12_wait_timeout_counts_from_when_the_wait_began(
    store: MemoryStore, clock: FakeClock
) -> None:
    """The very first backstop pass after an overdue wait reports it: the age
    comes from the wait record, not from the first pass that saw the wait."""
    run_id = _start(store, [_root("a", wait_timeout_seconds=60.0)])
    (task,) = _tasks(store, run_id, 0)
    _wait(store, task, "approve")
    clock.advance(61.0)
    (stall,) = Backstop(store, clock=clock).run_pass().stalls
    assert stall.new and stall.held_nodes == ("a",)
    assert "for 61s (wait timeout 60s)" in stall.reason
    diagnosis = diagnose_stored_run(store, run_id)  # show --why agrees, without a pass
    assert diagnosis is not None and diagnosis.nodes[0].state is NodeState.HELD


def test_gd_12_a_wait_without_timeout_is_not_a_stall(store: MemoryStore, clock: FakeClock) -> None:
    run_id = _start(store, [_root("a")])
    (task,) = _tasks(store, run_id, 0)
    _wait(store, task, "approve")
    clock.advance(10_000.0)
    assert Backstop(store, clock=clock).run_pass().stalls == ()
    diagnosis = diagnose_stored_run(store, run_id)
    assert diagnosis is not None and diagnosis.nodes[0].state is NodeState.WAITING
    assert diagnosis.nodes[0].reason == "waiting for resume of wait approve"


def test_gd_12_lost_delivery_without_backstop_is_a_stall(
    store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    run_id = _start(store, [_root("a"), _child("b", "a")])
    (row,) = store.list_deliveries(run_id)
    store.ack_delivery(row.delivery_id)
    worker = _worker(store, clock, tmp_path, backstop_interval=None)
    assert worker.backstop is not None and worker.backstop.maybe_run() is None
    worker.run_until_idle()
    diagnosis = diagnose_stored_run(store, run_id)
    assert diagnosis is not None and diagnosis.stall is not None
    assert diagnosis.stall.held_nodes == (0, 1)
    assert "delivery is missing" in diagnosis.stall.reason
    assert diagnosis.nodes[1].reason == "waiting on node a"
    assert store.get_run_status(run_id) is RunStatus.RUNNING


def test_gd_12_a_stall_that_ends_is_cleared_and_a_new_one_is_new(
    store: MemoryStore, clock: FakeClock
) -> None:
    run_id = _start(store, [_root("a", wait_timeout_seconds=5.0), _root("c")])
    (task,) = _tasks(store, run_id, 0)
    (c_task,) = _tasks(store, run_id, 1)
    _wait(store, task, "w1")
    _complete_without_reconcile(store, c_task, "c-1")
    backstop = Backstop(store, clock=clock)
    backstop.run_pass()
    clock.advance(6.0)
    assert [s.new for s in backstop.run_pass().stalls] == [True]
    from dagwerk.waiting import resume_task

    assert resume_task(
        store, task.task_id, "w1", expected_attempt_id=task.attempt_id, expected_generation=0
    )
    assert backstop.run_pass().stalls == ()
    assert store.list_stalls() == []
    (resumed,) = _tasks(store, run_id, 0)
    _wait(store, resumed, "w2")
    backstop.run_pass()
    clock.advance(6.0)
    assert [s.new for s in backstop.run_pass().stalls] == [True]


def test_gd_03_why_explains_each_node(store: MemoryStore) -> None:
    nodes = [_root("a"), _child("b", "a"), _root("x"), _child("y", "x"), _child("z", "y")]
    run_id = _start(store, nodes, policy=FailurePolicy.CONTINUE_OTHERS)
    (x_task,) = _tasks(store, run_id, 2)
    _lease_claim(store, x_task)
    on_task_failed(
        store,
        task_id=x_task.task_id,
        expected_attempt_id=x_task.attempt_id,
        error_message="boom",
        callbacks=CALLBACKS,
    )
    diagnosis = diagnose_stored_run(store, run_id)
    assert diagnosis is not None
    why = {n.slug: (n.state, n.reason) for n in diagnosis.nodes}
    assert why["a"] == (NodeState.QUEUED, "queued for a worker")
    assert why["b"] == (NodeState.PENDING, "waiting on node a")
    assert why["x"][0] is NodeState.FAILED and "boom" in why["x"][1]
    assert why["y"] == (NodeState.UPSTREAM_FAILED, "upstream failed at x")
    assert why["z"] == (NodeState.UPSTREAM_FAILED, "upstream failed at x")
    assert diagnosis.stall is None


def test_gd_09_worker_runs_the_backstop_once_at_start(store: MemoryStore, tmp_path: Path) -> None:
    run_id = _start(store, [_root("a")])
    (row,) = store.list_deliveries(run_id)
    store.ack_delivery(row.delivery_id)
    worker = Worker(
        store, {"a": lambda inputs, ctx: {}}, execution_root=tmp_path, poll_interval=0.05
    )
    worker.start()
    try:
        assert worker.wait_for_run(run_id, timeout=30) is RunStatus.COMPLETED
    finally:
        worker.stop()
    assert worker.backstop is not None and worker.backstop.last_report is not None
    assert worker.backstop.last_report.repaired == ((run_id, row.task_id),)
