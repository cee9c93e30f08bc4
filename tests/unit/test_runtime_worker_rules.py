"""Worker rules on the in-memory store with a fake clock: node settings, the
durable attempt number, retry reservations, heartbeats, lease bounds, idle
waits, the stale sweep, unreadable runs and wait responses."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.execution import claim_task
from dagwerk.models import DagNode, RetryPolicySpec, TaskInputs
from dagwerk.orchestrator import OrchestratorCallbacks, start_run
from dagwerk.runtime.clock import FakeClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.plugins import PluginRegistry
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.worker import Worker
from dagwerk.store import LeasedDelivery, TaskRecord
from dagwerk.waiting import resume_task


def _noop(run_id: str) -> None:
    return None


CALLBACKS = OrchestratorCallbacks(_noop, _noop, _noop, _noop)


def _start(store: MemoryStore, run_id: str, nodes: list[DagNode]) -> None:
    assert store.create_run(run_id, nodes)
    start_run(store, run_id, callbacks=CALLBACKS)


def _worker(
    store: MemoryStore, plugins: object, clock: FakeClock, root: Path, **kw: object
) -> Worker:
    return Worker(store, plugins, clock=clock, execution_root=root, **kw)  # type: ignore[arg-type]


def test_node_retry_setting_overrides_the_plugin_default_and_uses_durable_attempts(
    tmp_path: Path,
) -> None:
    seen: list[int] = []

    def flaky(inputs: TaskInputs, ctx: TaskContext) -> object:
        seen.append(ctx.attempt)
        raise TimeoutError("slow upstream")

    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    registry = PluginRegistry()
    registry.register("flaky", flaky, retry=RetryPolicy(max_attempts=1))
    spec = RetryPolicySpec(max_attempts=3, backoff_base=1.0, jitter=False, retry_on=("OSError",))
    _start(store, "run", [DagNode(slug="a", plugin="flaky", retry=spec)])
    worker = _worker(store, registry, clock, tmp_path)
    worker.run_until_idle()
    assert store.get_run_status("run") is RunStatus.RUNNING  # retry reserved in one commit
    clock.advance(1.0)  # backoff for attempt 1 is 1 s without jitter
    worker.run_until_idle()
    clock.advance(2.0)
    worker.run_until_idle()
    assert seen == [1, 2, 3]
    assert store.get_run_status("run") is RunStatus.FAILED
    (task,) = store.list_tasks("run")
    assert [a.status for a in store.list_attempts(task.task_id)] == [TaskStatus.FAILED] * 3


def test_retry_on_names_that_do_not_match_fail_at_once(tmp_path: Path) -> None:
    def broken(inputs: TaskInputs, ctx: TaskContext) -> object:
        raise KeyError("missing")

    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    spec = RetryPolicySpec(max_attempts=5, retry_on=("OSError",))
    _start(store, "run", [DagNode(slug="a", plugin="broken", retry=spec)])
    _worker(store, {"broken": broken}, clock, tmp_path).run_until_idle()
    assert store.get_run_status("run") is RunStatus.FAILED
    policy = RetryPolicy.from_spec(RetryPolicySpec(max_attempts=3, give_up_on=("KeyError",)))
    assert not policy.should_retry(KeyError("x"), 1)
    assert policy.should_retry(ValueError("x"), 1)
    assert not policy.should_retry(ValueError("x"), 3)


def test_wk_03_lease_bound_uses_the_node_timeout(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    registry = PluginRegistry()
    registry.register("p", lambda i, c: None, timeout_seconds=5.0)
    worker = _worker(store, registry, clock, tmp_path, lease_seconds=30, lease_grace=30)
    spec = registry.get("p")
    long_node = DagNode(slug="a", plugin="p", timeout_seconds=600.0)
    plain = DagNode(slug="b", plugin="p")
    assert worker.timeout_of(long_node, spec) == 600.0
    assert worker.timeout_of(plain, spec) == 5.0
    assert worker.lease_bound(600.0) == 630.0  # a long task is not swept from under itself
    assert worker.lease_bound(5.0) == 60.0


def test_heartbeat_extends_the_lease(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    beat = threading.Event()
    release = threading.Event()

    def slow(inputs: TaskInputs, ctx: TaskContext) -> object:
        clock.advance(4.0)
        ctx.heartbeat()  # renews the 6 s bound from t+4
        clock.advance(4.0)
        beat.set()
        release.wait(10)
        return None

    _start(store, "run", [DagNode(slug="a", plugin="slow")])
    worker = _worker(
        store, {"slow": slow}, clock, tmp_path, lease_seconds=5, lease_grace=1, poll_interval=60
    )
    runner = threading.Thread(target=worker.run_until_idle)
    runner.start()
    assert beat.wait(10)
    # The first bound (t+6) has passed, but the heartbeat renewed it to t+10:
    # another worker sees nothing to lease.
    assert store.dequeue("other", limit=1, lease_seconds=5) == []
    release.set()
    runner.join(10)
    assert store.get_run_status("run") is RunStatus.COMPLETED


def test_idle_dequeue_wakes_on_enqueue(tmp_path: Path) -> None:
    store = MemoryStore()
    worker = Worker(store, {"p": lambda i, c: None}, execution_root=tmp_path)
    got: list[int] = []
    parked = threading.Event()

    def idle() -> None:
        parked.set()
        got.append(worker.process_once(wait_seconds=20.0))

    thread = threading.Thread(target=idle)
    thread.start()
    assert parked.wait(5)
    began = time.monotonic()
    _start(store, "run", [DagNode(slug="a", plugin="p")])
    thread.join(20)
    assert got == [1] and time.monotonic() - began < 10


def test_wk_17_19_sweep_requeues_a_running_task_without_a_row_once_per_lease(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    _start(store, "run", [DagNode(slug="a", plugin="p")])
    (row,) = store.dequeue("lost", limit=1, lease_seconds=5)
    assert claim_task(store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0)
    assert store.ack(row.delivery_id, "lost")  # RUNNING with no row: no redelivery can reach it
    ran: list[int] = []
    worker = _worker(
        store, {"p": lambda i, c: ran.append(c.attempt)}, clock, tmp_path, lease_seconds=10
    )
    # The first idle tick sweeps and requeues; the requeued attempt then runs.
    worker.run_until_idle()
    assert [(r.task_id, r.action) for r in worker.sweeper.reports] == [(row.task_id, "requeued")]
    assert ran == [2]
    assert store.get_run_status("run") is RunStatus.COMPLETED
    # Throttled: no second sweep within one lease duration.
    assert worker.sweeper.maybe_sweep() == []
    clock.advance(10)
    assert worker.sweeper.maybe_sweep() == []  # swept, but nothing stale


def test_wk_19_sweep_abandons_a_task_at_its_attempt_bound(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time, max_deliveries=1)
    log: list[str] = []
    _start(store, "run", [DagNode(slug="a", plugin="p")])
    (row,) = store.dequeue("lost", limit=1, lease_seconds=5)
    assert claim_task(store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0)
    assert store.ack(row.delivery_id, "lost")
    worker = _worker(store, {"p": lambda i, c: log.append("ran")}, clock, tmp_path)
    worker.run_until_idle()
    (report,) = worker.sweeper.reports
    assert report.action == "abandoned"
    assert log == []
    assert store.get_run_status("run") is RunStatus.CRASHED


def test_wk_17_sweep_failure_is_reported_not_raised(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    worker = _worker(store, {}, clock, tmp_path)

    def broken(**kw: object) -> object:
        raise RuntimeError("db down")

    store.list_runs = broken  # type: ignore[method-assign, assignment]
    assert worker.process_once() == 0
    (report,) = worker.sweeper.reports
    assert report.action == "sweep_failed" and "db down" in report.detail


def test_wk_15_run_unreadable_after_claim_crashes_the_attempt(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    _start(store, "run", [DagNode(slug="a", plugin="p")])
    ran: list[bool] = []
    worker = _worker(store, {"p": lambda i, c: ran.append(True)}, clock, tmp_path)
    real = store.get_run_status

    def flaky_status(run_id: str) -> RunStatus | None:
        if worker.monitor.running:  # the read after the claim (the attempt is registered)
            raise OSError("disk gone")
        return real(run_id)

    worker.status.read = flaky_status  # type: ignore[method-assign]
    worker.run_until_idle()
    assert ran == []
    (task,) = store.list_tasks("run", include_invalidated=True)
    assert task.status is TaskStatus.CRASHED and "unreadable" in (task.error or "")
    assert store.get_run_status("run") is RunStatus.CRASHED
    assert store.list_deliveries() == []


def test_resumed_attempt_sees_the_wait_response(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    seen: list[object] = []

    def approve(inputs: TaskInputs, ctx: TaskContext) -> object:
        if ctx.resumed_from_wait_id is None:
            ctx.wait("approval")
        seen.append(ctx.wait_response)
        return None

    _start(store, "run", [DagNode(slug="a", plugin="approve")])
    worker = _worker(store, {"approve": approve}, clock, tmp_path)
    worker.run_until_idle()
    (task,) = store.list_tasks("run")
    assert task.status is TaskStatus.WAITING
    assert resume_task(
        store,
        task.task_id,
        "approval",
        expected_attempt_id=task.attempt_id,
        expected_generation=0,
        response={"approved": True},
    )
    worker.run_until_idle()
    assert seen == [{"approved": True}]
    assert store.get_run_status("run") is RunStatus.COMPLETED


@pytest.mark.parametrize("queue", ["gpu", "default"])
def test_worker_serves_only_its_queues(tmp_path: Path, queue: str) -> None:
    store = MemoryStore()
    _start(store, "run", [DagNode(slug="a", plugin="p", queue="gpu")])
    worker = Worker(store, {"p": lambda i, c: None}, execution_root=tmp_path, queues=[queue])
    worker.run_until_idle()
    expected = RunStatus.COMPLETED if queue == "gpu" else RunStatus.RUNNING
    assert store.get_run_status("run") is expected


class _CountingStore(MemoryStore):
    """Counts reads of a run's whole task list."""

    task_reads = 0

    def list_tasks(self, run_id: str, *, include_invalidated: bool = False) -> list[TaskRecord]:
        self.task_reads += 1
        return super().list_tasks(run_id, include_invalidated=include_invalidated)


class _StoreWithoutSweepRead(_CountingStore):
    running_without_delivery = None  # type: ignore[assignment]  # as a store without it


def _two_running(store: MemoryStore, *, rowless: int) -> list[LeasedDelivery]:
    """A run of two RUNNING tasks; the queue rows of the first ``rowless``
    are acked, so no redelivery can reach those tasks. The leased rows."""
    _start(store, "run", [DagNode(slug="a", plugin="p"), DagNode(slug="b", plugin="p")])
    leased = store.dequeue("lost", limit=2, lease_seconds=5)
    for row in leased:
        assert claim_task(
            store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0
        )
    for row in leased[:rowless]:
        assert store.ack(row.delivery_id, "lost")
    return leased


@pytest.mark.parametrize("store_type", [_CountingStore, _StoreWithoutSweepRead])
def test_wk_17_the_sweep_reads_only_running_tasks_where_the_store_can(
    tmp_path: Path, store_type: type[_CountingStore]
) -> None:
    """An idle worker swept every RUNNING run by reading all its tasks, once
    per lease duration: 100,000 task records for one wide run. A store that
    lists its RUNNING tasks without a queue row is asked that instead; any
    other store is still read in full, with the same result."""
    clock = FakeClock()
    store = store_type(clock=clock.time)
    leased = _two_running(store, rowless=1)
    worker = _worker(store, {"p": lambda i, c: None}, clock, tmp_path, lease_seconds=10)
    store.task_reads = 0
    swept = worker.sweeper.maybe_sweep()
    assert [(r.task_id, r.action) for r in swept] == [(leased[0].task_id, "requeued")]
    assert (store.task_reads == 0) is (store_type is _CountingStore)


def test_a_sweeper_keeps_only_its_latest_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagwerk.runtime.sweep as sweep_module

    monkeypatch.setattr(sweep_module, "SWEEP_REPORTS_KEPT", 1)
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    _two_running(store, rowless=2)
    worker = _worker(store, {"p": lambda i, c: None}, clock, tmp_path, lease_seconds=10)
    swept = worker.sweeper.maybe_sweep()
    assert [r.action for r in swept] == ["requeued", "requeued"]
    assert list(worker.sweeper.reports) == swept[-1:]


def test_a_worker_keeps_only_its_latest_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagwerk.runtime.worker as worker_module

    monkeypatch.setattr(worker_module, "REPORTS_KEPT", 3)
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    _start(store, "run", [DagNode(slug=f"n{i}", plugin="p") for i in range(5)])
    worker = _worker(store, {"p": lambda i, c: None}, clock, tmp_path)
    worker.run_until_idle()
    assert store.get_run_status("run") is RunStatus.COMPLETED
    assert len(worker.reports) == 3
    done = {t.task_id for t in store.list_tasks("run")}
    assert {r.task_id for r in worker.reports} <= done
