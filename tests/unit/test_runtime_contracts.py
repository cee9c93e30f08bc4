"""Worker contracts (WK-01..WK-21, AA-06, AA-08) that no other test proves.

Every test runs on a fake clock; threads synchronise on events, never on
sleeps. docs/worker-contracts.md maps each contract to its test.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.backends.sqlite.store import SqliteStore
from dagwerk.constants import FailurePolicy, RunStatus, TaskStatus
from dagwerk.execution import claim_task
from dagwerk.models import DagNode, RetryPolicySpec, TaskInputs
from dagwerk.orchestrator import OrchestratorCallbacks, start_run
from dagwerk.runtime.actor import AdvancementActor
from dagwerk.runtime.clock import FakeClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.errors import ExecutionRootError
from dagwerk.runtime.executors import ProcessExecutor
from dagwerk.runtime.worker import Worker
from dagwerk.waiting import resume_task


def _noop(run_id: str) -> None:
    return None


CALLBACKS = OrchestratorCallbacks(_noop, _noop, _noop, _noop)
WAIT = 10.0  # real-time bound on event waits; never a stand-in for time passing


def _start(store: Any, run_id: str, nodes: list[DagNode], **kw: Any) -> None:
    assert store.create_run(run_id, nodes, **kw)
    start_run(store, run_id, callbacks=CALLBACKS)


def _worker(store: Any, plugins: Any, clock: FakeClock, root: Path, **kw: Any) -> Worker:
    return Worker(store, plugins, clock=clock, execution_root=root, **kw)


def _lose_a_running_task(store: Any, worker_id: str = "lost") -> tuple[str, str]:
    """Claim the next delivery and drop its row: a RUNNING task no redelivery reaches."""
    (row,) = store.dequeue(worker_id, limit=1, lease_seconds=5)
    assert claim_task(store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0)
    assert store.ack(row.delivery_id, worker_id)
    return row.task_id, row.attempt_id


def _in_thread(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


# --- leases (WK-01..WK-05) --------------------------------------------------------------


def test_wk_01_a_lease_held_elsewhere_is_contention_not_an_error(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    ran: list[int] = []
    _start(store, "run", [DagNode(slug="a", plugin="p")])
    (held,) = store.dequeue("other", limit=1, lease_seconds=5)
    worker = _worker(store, {"p": lambda i, c: ran.append(c.attempt)}, clock, tmp_path)
    assert worker.process_once() == 0  # processed: false, and no error
    assert list(worker.reports) == [] and ran == []
    assert store.get_run_status("run") is RunStatus.RUNNING
    # Once the holder releases the lease the same delivery is processed.
    assert store.nack(held.delivery_id, "other")
    assert worker.run_until_idle() == 1
    assert ran == [1]
    assert [(r.delivery_id, r.action) for r in worker.reports] == [(held.delivery_id, "completed")]


def test_wk_02_the_lease_is_held_for_the_whole_execution_and_released_after(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    inside: list[object] = []

    def probe(inputs: TaskInputs, ctx: TaskContext) -> object:
        clock.advance(20)  # past the dequeue lease (5 s), inside the ownership bound
        inside.append(store.dequeue("spy", limit=1, lease_seconds=1))
        inside.append(len(store.list_deliveries("run")))
        return None

    _start(store, "run", [DagNode(slug="a", plugin="p")])
    worker = _worker(
        store, {"p": probe}, clock, tmp_path, lease_seconds=5, lease_grace=30, poll_interval=1e6
    )
    worker.run_until_idle()
    assert inside == [[], 1]  # visible from inside: held, row still there
    assert store.list_deliveries() == []  # released (acked) afterwards
    (attempt,) = store.list_attempts(store.list_tasks("run")[0].task_id)
    assert (attempt.status, attempt.worker_id) == (TaskStatus.COMPLETED, worker.worker_id)
    assert [r.action for r in worker.reports] == ["completed"]  # one execution


def test_wk_03_the_lease_is_taken_for_the_ownership_bound(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    extensions: list[tuple[str, float]] = []
    real_extend = store.extend_lease

    def spy_extend(delivery_id: str, worker_id: str, lease_seconds: float) -> bool:
        extensions.append((worker_id, lease_seconds))
        return real_extend(delivery_id, worker_id, lease_seconds)

    store.extend_lease = spy_extend  # type: ignore[method-assign]
    seen: list[object] = []

    def long_task(inputs: TaskInputs, ctx: TaskContext) -> object:
        clock.advance(599)  # inside the 600 s timeout, far past lease_seconds
        seen.append(store.dequeue("spy", limit=1, lease_seconds=1))
        return None

    _start(store, "run", [DagNode(slug="a", plugin="p", timeout_seconds=600.0)])
    worker = _worker(
        store,
        {"p": long_task},
        clock,
        tmp_path,
        lease_seconds=10,
        lease_grace=30,
        poll_interval=1e6,
        default_timeout=7.0,
    )
    worker.run_until_idle()
    # bound = max(timeout 600, lease 10) + grace 30, taken before the plugin runs
    assert extensions[0] == (worker.worker_id, 630.0)
    assert seen == [[]]  # a long task is not taken from under itself
    assert store.get_run_status("run") is RunStatus.COMPLETED
    # Without a node or plugin timeout the worker default applies.
    spec = worker.plugins.get("p")
    assert worker.timeout_of(DagNode(slug="b", plugin="p"), spec) == 7.0
    assert worker.lease_bound(7.0) == 40.0


def test_wk_04_a_task_between_lease_and_claim_or_mid_run_is_not_swept(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    _start(store, "leased", [DagNode(slug="a", plugin="p")])
    _start(store, "claimed", [DagNode(slug="a", plugin="p")])
    (leased,) = store.dequeue("w1", limit=1, lease_seconds=5, queues=None)
    (claimed,) = store.dequeue("w2", limit=1, lease_seconds=5)
    assert claim_task(
        store, claimed.task_id, expected_attempt_id=claimed.attempt_id, expected_generation=0
    )
    worker = _worker(store, {"p": lambda i, c: None}, clock, tmp_path)
    # Leased but not yet claimed (QUEUED) and claimed under a live row: nothing to sweep.
    assert worker.sweeper.sweep() == []
    for row in (leased, claimed):
        record = store.get_task(row.task_id)
        assert record is not None and record.attempt_id == row.attempt_id


def test_wk_05_a_live_owners_task_is_untouched_by_another_worker(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    entered, release = threading.Event(), threading.Event()
    attempts: list[int] = []

    def busy(inputs: TaskInputs, ctx: TaskContext) -> object:
        attempts.append(ctx.attempt)
        entered.set()
        release.wait(WAIT)
        return None

    _start(store, "run", [DagNode(slug="a", plugin="p")])
    owner = _worker(store, {"p": busy}, clock, tmp_path, poll_interval=1e6)
    other = _worker(store, {"p": busy}, clock, tmp_path, poll_interval=1e6)
    runner = _in_thread(owner.run_until_idle)
    assert entered.wait(WAIT)
    assert other.process_once() == 0
    assert list(other.reports) == [] and list(other.sweeper.reports) == []
    release.set()
    runner.join(WAIT)
    assert attempts == [1]
    assert store.get_run_status("run") is RunStatus.COMPLETED


def test_wk_05_a_recovered_attempt_counts_towards_the_retry_bound(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time, max_deliveries=5)
    seen: list[int] = []

    def flaky(inputs: TaskInputs, ctx: TaskContext) -> object:
        seen.append(ctx.attempt)
        raise ConnectionError("upstream down")

    spec = RetryPolicySpec(max_attempts=3, backoff_base=1.0, jitter=False)
    _start(store, "run", [DagNode(slug="a", plugin="p", retry=spec)])
    (row,) = store.dequeue("dead", limit=1, lease_seconds=5)
    assert claim_task(store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0)
    clock.advance(6)  # the dead worker's lease expires
    worker = _worker(store, {"p": flaky}, clock, tmp_path, lease_seconds=5, lease_grace=0)
    worker.run_until_idle()  # reclaim (attempt 2), then a retryable failure
    record = store.get_task(row.task_id)
    assert record is not None
    assert (record.status, record.attempt_number) == (TaskStatus.QUEUED, 3)
    clock.advance(60)
    worker.run_until_idle()
    assert seen == [2, 3]  # attempt 3 is the last one the bound allows
    assert store.get_run_status("run") is RunStatus.FAILED
    assert [r.action for r in worker.reports] == ["recovered", "retried", "failed"]


# --- composition, dead letters (WK-07..WK-09) ----------------------------------------


class _RecordingStore:
    """Records every attribute the worker touches."""

    def __init__(self) -> None:
        self.touched: list[str] = []

    def __getattr__(self, name: str) -> object:
        self.touched.append(name)
        raise AttributeError(name)


@pytest.mark.parametrize("root", [None, "", ".", "missing-dir"])
def test_wk_07_an_invalid_execution_root_is_rejected_before_the_queue(
    root: str | None, tmp_path: Path
) -> None:
    store = _RecordingStore()
    bad = str(tmp_path / root) if root == "missing-dir" else root
    with pytest.raises(ExecutionRootError):
        Worker(store, {}, execution_root=bad)  # type: ignore[arg-type]
    assert store.touched == []


def test_wk_07_the_default_policy_is_fail_fast_without_dead_letters(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    calls: list[int] = []

    def down(inputs: TaskInputs, ctx: TaskContext) -> object:
        calls.append(ctx.attempt)
        raise ConnectionError("down")

    _start(store, "run", [DagNode(slug="a", plugin="p")])
    worker = _worker(store, {"p": down}, clock, tmp_path)
    worker.run_until_idle()
    clock.advance(3600)
    worker.run_until_idle()
    assert calls == [1]
    assert store.get_run_status("run") is RunStatus.FAILED
    assert store.list_dead_letters() == []


def test_wk_08_09_dead_letter_keeps_its_source_and_reinjection_runs_a_fresh_attempt(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time, max_deliveries=1)
    ran: list[tuple[str, int]] = []
    nodes = [
        DagNode(slug="a", plugin="p"),
        DagNode(slug="b", plugin="p", queue="later"),  # keeps the run open
    ]
    _start(store, "run", nodes, failure_policy=FailurePolicy.CONTINUE_OTHERS)
    (row,) = store.dequeue("doomed", limit=1, lease_seconds=5, queues=["default"])
    assert claim_task(store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0)
    clock.advance(6)  # the doomed worker dies holding the only delivery allowed
    plugin = {"p": lambda i, c: ran.append((c.task_id, c.attempt))}
    worker = _worker(store, plugin, clock, tmp_path, queues=["default"])
    worker.run_until_idle()
    (letter,) = store.list_dead_letters()
    assert (letter.delivery_id, letter.task_id, letter.reason) == (
        row.delivery_id,
        row.task_id,
        "max_deliveries",
    )
    crashed = store.get_task(row.task_id)
    assert crashed is not None and crashed.status is TaskStatus.CRASHED
    assert store.get_run_status("run") is RunStatus.RUNNING and ran == []
    new_attempt = store.reinject_dead_letter(letter.dead_letter_id)
    assert new_attempt is not None
    assert store.reinject_dead_letter(letter.dead_letter_id) is None  # guarded: once
    worker.run_until_idle()
    assert ran == [(row.task_id, 2)]
    _worker(store, plugin, clock, tmp_path, queues=["later"]).run_until_idle()
    assert store.get_run_status("run") is RunStatus.COMPLETED


# --- timeouts, cancellation, isolation (WK-14..WK-16) ---------------------------------


def test_wk_14_a_late_result_after_a_timeout_changes_nothing(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def ignores_signal(inputs: TaskInputs, ctx: TaskContext) -> object:
        entered.set()
        release.wait(WAIT)
        returned.set()
        return {"late": True}

    _start(store, "run", [DagNode(slug="a", plugin="p", timeout_seconds=5.0)])
    worker = _worker(store, {"p": ignores_signal}, clock, tmp_path, poll_interval=1e6)
    runner = _in_thread(worker.run_until_idle)
    assert entered.wait(WAIT)
    assert clock.wait_for_waiters(2, WAIT)  # the deadline and the run watcher are armed
    clock.advance(5.0)
    runner.join(WAIT)
    assert not runner.is_alive()
    release.set()
    assert returned.wait(WAIT)
    (task,) = store.list_tasks("run")
    assert task.status is TaskStatus.CRASHED and "timed out" in (task.error or "")
    assert store.get_output_ids("run", 0) == ()
    # The timed-out attempt can no longer settle anything.
    assert store.try_complete_task(task.task_id, (), expected_attempt_id=task.attempt_id) is None
    assert [r.action for r in worker.reports] == ["timed_out"]


def test_wk_15_a_signal_registered_before_the_final_read_stops_a_stale_read(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    entered: list[bool] = []
    _start(store, "run", [DagNode(slug="a", plugin="p")])
    worker = _worker(store, {"p": lambda i, c: entered.append(True)}, clock, tmp_path)
    real = store.get_run_status

    def racing_read(run_id: str) -> RunStatus | None:
        status = real(run_id)
        if worker.monitor.running:  # the final read: shutdown races it and the read is stale
            worker.stop()
        return status

    worker.status.read = racing_read  # type: ignore[method-assign]
    worker.process_once()
    assert entered == []
    assert [r.action for r in worker.reports] == ["released"]
    assert len(store.list_deliveries("run")) == 1  # the delivery went back


def _stubborn_plugin(inputs: TaskInputs, ctx: TaskContext) -> object:
    _STUBBORN["entered"].set()
    _STUBBORN["release"].wait(WAIT)
    return {"late": True}


_STUBBORN: dict[str, threading.Event] = {}


class _StubbornProcess:
    """A 'child process' that runs in a thread and survives terminate and kill."""

    def __init__(self, *, target: Callable[..., None], args: tuple[Any, ...], **kw: Any) -> None:
        self.signals: list[str] = []
        # A real child holds its own copy of its end of the pipe; the parent
        # closes its copy right after start.
        args = tuple(
            Connection(os.dup(a.fileno())) if isinstance(a, Connection) else a for a in args
        )

        # Like a process's sentinel: readable once the "child" has ended.
        self.sentinel, ended = os.pipe()

        def run() -> None:
            try:
                target(*args)
            except Exception:  # the parent closed its end: the result has nowhere to go
                return
            finally:
                os.close(ended)

        self.thread = threading.Thread(target=run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def terminate(self) -> None:
        self.signals.append("terminate")

    def kill(self) -> None:
        self.signals.append("kill")

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(0)

    def is_alive(self) -> bool:
        return self.thread.is_alive()


class _StubbornContext:
    def __init__(self) -> None:
        self.processes: list[_StubbornProcess] = []

    def Pipe(self, duplex: bool = True) -> Any:
        return multiprocessing.Pipe(duplex)

    def Event(self) -> threading.Event:
        return threading.Event()

    def Process(self, **kw: Any) -> _StubbornProcess:
        process = _StubbornProcess(**kw)
        self.processes.append(process)
        return process


def test_wk_16_a_child_that_survives_terminate_keeps_the_timeout_and_disables_retry(
    tmp_path: Path,
) -> None:
    _STUBBORN.update(entered=threading.Event(), release=threading.Event())
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    executor = ProcessExecutor(join_timeout=0.0)
    context = _StubbornContext()
    executor._pool.context = context  # type: ignore[assignment]
    spec = RetryPolicySpec(max_attempts=3, backoff_base=0.0, jitter=False)
    _start(store, "run", [DagNode(slug="a", plugin="p", timeout_seconds=5.0, retry=spec)])
    worker = _worker(
        store, {"p": _stubborn_plugin}, clock, tmp_path, executor=executor, poll_interval=1e6
    )
    runner = _in_thread(worker.run_until_idle)
    try:
        assert _STUBBORN["entered"].wait(WAIT)
        assert clock.wait_for_waiters(2, WAIT)  # the deadline and the run watcher are armed
        clock.advance(5.0)
        runner.join(WAIT)
        assert not runner.is_alive()
        (process,) = context.processes
        assert process.signals == ["terminate", "kill"]
        (task,) = store.list_tasks("run")
        # The timeout won; the failed stop disabled the retry the policy allowed.
        assert task.status is TaskStatus.CRASHED
        assert "timed out" in (task.error or "") and "child did not stop" in (task.error or "")
        assert len(store.list_attempts(task.task_id)) == 1
        assert store.get_run_status("run") is RunStatus.CRASHED
        assert [r.action for r in worker.reports] == ["timed_out"]
    finally:
        _STUBBORN["release"].set()
        for process in context.processes:
            process.thread.join(WAIT)
    assert store.get_output_ids("run", 0) == ()


# --- idle sweep (WK-17..WK-21) -------------------------------------------------------------


def test_wk_17_idle_step_passes_the_idle_wait_to_dequeue(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    waits: list[float] = []
    real = store.dequeue

    def spy(worker_id: str, **kw: Any) -> Any:
        waits.append(kw["wait_seconds"])
        return real(worker_id, **{**kw, "wait_seconds": 0.0})

    store.dequeue = spy  # type: ignore[method-assign]
    worker = _worker(store, {}, clock, tmp_path, idle_wait=2.5)
    assert worker._step() is False
    assert waits == [2.5]


def test_wk_17_overlapping_sweeps_are_suppressed_and_the_throttle_starts_after_the_sweep(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    worker = _worker(store, {}, clock, tmp_path, lease_seconds=10)
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []
    real = store.list_runs

    def slow_list(**kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            clock.advance(7)  # the first sweep takes 7 s
            entered.set()
            release.wait(WAIT)
        return real(**kw)

    store.list_runs = slow_list  # type: ignore[method-assign]
    first = _in_thread(worker.sweeper.maybe_sweep)
    assert entered.wait(WAIT)
    assert worker.sweeper.maybe_sweep() == []  # overlapping: suppressed
    release.set()
    first.join(WAIT)
    assert calls == [1]
    clock.advance(9)  # 16 s after the sweep began, 9 s after it ended
    worker.sweeper.maybe_sweep()
    assert calls == [1]
    clock.advance(1)
    worker.sweeper.maybe_sweep()
    assert calls == [1, 1]


def test_wk_19_a_failing_task_does_not_stop_the_sweep(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    _start(store, "run-1", [DagNode(slug="a", plugin="p")])
    bad_task, _ = _lose_a_running_task(store)
    _start(store, "run-2", [DagNode(slug="a", plugin="p")])
    good_task, _ = _lose_a_running_task(store)
    real = store.get_task

    def get_task(task_id: str) -> Any:
        if task_id == bad_task:
            raise OSError("row unreadable")
        return real(task_id)

    store.get_task = get_task  # type: ignore[method-assign]
    worker = _worker(store, {}, clock, tmp_path)
    reports = {r.task_id: r for r in worker.sweeper.sweep()}
    assert reports[bad_task].action == "failed" and "row unreadable" in reports[bad_task].detail
    assert reports[good_task].action == "requeued"


def test_wk_20_concurrent_sweeps_requeue_once_and_a_later_sweep_does_not_reclaim(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    _start(store, "run", [DagNode(slug="a", plugin="p")])
    task_id, attempt_id = _lose_a_running_task(store)
    workers = [_worker(store, {}, clock, tmp_path, lease_seconds=10) for _ in range(2)]
    barrier = threading.Barrier(2)
    reports: list[list[Any]] = []

    def sweep(worker: Worker) -> None:
        barrier.wait(WAIT)
        reports.append(worker.sweeper.sweep())

    threads = [_in_thread(lambda w=w: sweep(w)) for w in workers]  # type: ignore[misc]
    for thread in threads:
        thread.join(WAIT)
    assert len(reports) == 2
    record = store.get_task(task_id)
    assert record is not None and record.attempt_number == 2
    assert len(store.list_attempts(task_id)) == 2
    (delivery,) = store.list_deliveries("run")
    assert delivery.attempt_id == record.attempt_id
    # Both sweeps saw the stale attempt; the second one to act finds it gone.
    assert workers[0].sweeper._sweep_task(task_id, attempt_id).action == "skipped"
    clock.advance(10)
    assert workers[1].sweeper.maybe_sweep() == []
    assert store.get_task(task_id) == record


def test_wk_21_an_abandoned_task_on_a_sqlite_file_is_recovered_by_the_idle_sweep(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    path = tmp_path / "dag.db"
    first = SqliteStore(str(path), clock=clock.time)
    _start(first, "run", [DagNode(slug="a", plugin="p")])
    task_id, _ = _lose_a_running_task(first)
    first.close()  # the process that held the task is gone
    reopened = SqliteStore(str(path), clock=clock.time)
    try:
        ran: list[int] = []
        worker = _worker(reopened, {"p": lambda i, c: ran.append(c.attempt)}, clock, tmp_path)
        worker.run_until_idle()
        assert [r.action for r in worker.sweeper.reports] == ["requeued"]
        assert ran == [2]
        assert reopened.get_run_status("run") is RunStatus.COMPLETED
        assert [a.status for a in reopened.list_attempts(task_id)] == [
            TaskStatus.CRASHED,
            TaskStatus.COMPLETED,
        ]
    finally:
        reopened.close()


# --- the advancement actor (AA-06, AA-08) ----------------------------------------------------


class _RecordingClock(FakeClock):
    """Records every timed wait and returns at once (the deadline 'passes')."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        self.waits.append(timeout)
        return event.is_set()


def test_aa_06_idle_backoff_doubles_to_500ms_resets_after_work_and_errors_wait_500ms() -> None:
    clock = _RecordingClock()
    script: list[object] = [False] * 7 + [True, False, False, "raise", "stop"]
    holder: dict[str, AdvancementActor] = {}
    finished = threading.Event()

    def step() -> bool:
        item = script.pop(0)
        if item == "raise":
            raise RuntimeError("queue unreachable")
        if item == "stop":
            holder["actor"].stop()
            finished.set()
            return False
        return bool(item)

    actor = AdvancementActor(step, lambda run_id: None, clock=clock, background=True)
    holder["actor"] = actor
    actor.start()
    assert finished.wait(WAIT)
    actor.stop(WAIT)  # joins the thread
    assert script == []
    assert clock.waits[:10] == [
        0.025, 0.05, 0.1, 0.2, 0.4, 0.5, 0.5,  # idle: doubling up to 500 ms
        # the processed step waits for nothing and resets the backoff
        0.025, 0.05,
        0.5,  # a failed step backs off 500 ms
    ]  # fmt: skip


def test_aa_06_new_demand_wakes_a_sleeping_actor() -> None:
    clock = FakeClock()
    steps: list[int] = []
    second = threading.Event()

    def idle_step() -> bool:
        steps.append(1)
        if len(steps) == 2:
            second.set()
        return False

    actor = AdvancementActor(idle_step, lambda run_id: None, clock=clock, background=True)
    actor.start()
    try:
        assert clock.wait_for_waiters(1, WAIT)  # asleep in a 25 ms backoff that never passes
        assert steps == [1]
        actor.notify()
        assert second.wait(WAIT)  # woken without the clock moving
    finally:
        actor.stop(WAIT)


def test_aa_06_the_worker_uses_the_seed_backoff_bounds(tmp_path: Path) -> None:
    worker = Worker(MemoryStore(), {}, execution_root=tmp_path)
    actor = worker.actor
    assert (actor._idle_min, actor._idle_max, actor._error_backoff) == (0.025, 0.5, 0.5)


def test_aa_08_every_task_gets_the_workers_root_never_cwd_or_run_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    elsewhere = tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    seen: list[Path] = []
    nodes = [DagNode(slug="a", plugin="p"), DagNode(slug="b", plugin="p")]
    _start(store, "run", nodes, run_input={"execution_root": str(elsewhere)})
    worker = _worker(store, {"p": lambda i, c: seen.append(c.execution_root)}, clock, root)
    worker.run_until_idle()
    assert seen == [root.resolve(), root.resolve()]


# --- secrets, shutdown and waits through the worker ------------------------------------------


def test_secrets_reach_ctx_secrets_and_never_the_plan_or_the_store(tmp_path: Path) -> None:
    secret = "tok-5ecr3t-Zq81"
    clock = FakeClock()
    path = tmp_path / "dag.db"
    store = SqliteStore(str(path), clock=clock.time)
    asked: list[tuple[str, str]] = []
    seen: list[dict[str, str]] = []
    errors: list[str] = []

    def resolver(run_id: str, plugin: str) -> dict[str, str]:
        asked.append((run_id, plugin))
        return {"api_token": secret}

    def uses_secret(inputs: TaskInputs, ctx: TaskContext) -> object:
        seen.append(dict(ctx.secrets))
        try:
            ctx.secrets["api_token"] = "x"  # type: ignore[index]
        except TypeError as exc:
            errors.append(type(exc).__name__)
        return {"authenticated": True}

    _start(store, "run", [DagNode(slug="a", plugin="fetch")])
    worker = _worker(store, {"fetch": uses_secret}, clock, tmp_path, secret_resolver=resolver)
    worker.run_until_idle()
    assert store.get_run_status("run") is RunStatus.COMPLETED
    (task,) = store.list_tasks("run")
    assert secret not in repr(task.plan)
    store.close()
    assert asked == [("run", "fetch")]
    assert seen == [{"api_token": secret}] and errors == ["TypeError"]
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("dag.db*"))
    assert b"authenticated" in stored and secret.encode() not in stored


def test_stop_returns_an_in_progress_delivery_for_another_worker(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    entered = threading.Event()
    runs: list[tuple[int, bool]] = []

    def cooperative(inputs: TaskInputs, ctx: TaskContext) -> object:
        if ctx.attempt == 1:
            entered.set()
            runs.append((1, ctx.cancelled.wait(WAIT)))
            return {"never": "published"}
        runs.append((ctx.attempt, False))
        return {"done": True}

    _start(store, "run", [DagNode(slug="a", plugin="p")])
    first = _worker(store, {"p": cooperative}, clock, tmp_path, poll_interval=0.01)
    first.start()
    assert entered.wait(WAIT)
    first.stop(WAIT)
    assert first.actor.state == "stopped"
    assert [r.action for r in first.reports] == ["released"]
    (task,) = store.list_tasks("run")
    assert (task.status, task.attempt_number) == (TaskStatus.RUNNING, 1)
    (row,) = store.list_deliveries("run")
    assert row.attempt_id == task.attempt_id
    second = _worker(store, {"p": cooperative}, clock, tmp_path)
    second.run_until_idle()
    assert [r.action for r in second.reports] == ["recovered", "completed"]
    assert runs == [(1, True), (2, False)]
    assert store.get_run_status("run") is RunStatus.COMPLETED
    (output_id,) = store.get_output_ids("run", 0)
    assert store.resolve_outputs("run", (output_id,))[output_id].fields == {"done": True}


def test_wait_through_the_worker_acks_and_resume_runs_a_new_attempt(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    seen: list[tuple[int, str, str | None, object]] = []

    def approve(inputs: TaskInputs, ctx: TaskContext) -> object:
        seen.append((ctx.attempt, ctx.attempt_id, ctx.resumed_from_wait_id, ctx.wait_response))
        if ctx.resumed_from_wait_id is None:
            ctx.wait("approval-1")
        return {"approved": True}

    _start(store, "run", [DagNode(slug="a", plugin="approve")])
    worker = _worker(store, {"approve": approve}, clock, tmp_path)
    worker.run_until_idle()
    (task,) = store.list_tasks("run")
    assert (task.status, task.active_wait_id) == (TaskStatus.WAITING, "approval-1")
    assert store.list_deliveries() == []  # the delivery was acked
    assert [(r.action, r.detail) for r in worker.reports] == [("waited", "approval-1")]
    assert store.get_run_status("run") is RunStatus.RUNNING
    assert worker.run_until_idle() == 0  # nothing runs while it waits
    assert resume_task(
        store,
        task.task_id,
        "approval-1",
        expected_attempt_id=task.attempt_id,
        expected_generation=0,
        response={"by": "ops"},
    )
    worker.run_until_idle()
    (first, second) = seen
    assert first == (1, task.attempt_id, None, None)
    assert second[0] == 2 and second[1] != task.attempt_id
    assert second[2:] == ("approval-1", {"by": "ops"})
    assert store.get_run_status("run") is RunStatus.COMPLETED
    attempts = store.list_attempts(task.task_id)
    assert [a.resumed_from_wait_id for a in attempts] == [None, "approval-1"]
    assert attempts[-1].status is TaskStatus.COMPLETED


def test_wk_03_the_monitor_extends_a_lease_only_once_a_tenth_of_it_has_passed(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    extensions: list[float] = []
    real_extend = store.extend_lease

    def spy_extend(delivery_id: str, worker_id: str, lease_seconds: float) -> bool:
        extensions.append(clock.monotonic())
        return real_extend(delivery_id, worker_id, lease_seconds)

    store.extend_lease = spy_extend  # type: ignore[method-assign]
    _start(store, "run", [DagNode(slug="a", plugin="p")])
    worker = _worker(
        store, {"p": lambda inputs, ctx: None}, clock, tmp_path, lease_seconds=10, lease_grace=5
    )
    (claimed,) = store.claim_deliveries(
        worker.worker_id, limit=1, lease_seconds=worker.lease_bound(None)
    )
    attempt = worker.preparer.prepare(
        claimed.delivery, claimed.task, leased_bound=worker.lease_bound(None)
    )
    assert attempt is not None and extensions == []  # the claim's lease covers the bound
    # Passes within a tenth of the lease write nothing: the lease was just taken.
    worker.monitor._check([attempt])
    clock.advance(0.9)
    worker.monitor._check([attempt])
    assert extensions == []
    clock.advance(0.1)
    worker.monitor._check([attempt])  # a tenth has passed: extended once ...
    worker.monitor._check([attempt])  # ... and not again at once
    assert extensions == [clock.monotonic()]
    clock.advance(1.0)
    worker.monitor._check([attempt])
    assert len(extensions) == 2
    worker.stop()
