"""The worker runtime end to end on the in-memory store."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import InputMode, InputRole, RunStatus, TaskStatus
from dagwerk.errors import DagwerkError
from dagwerk.execution import claim_task
from dagwerk.models import DagNode, EdgeSource, EmittedOutput, InputEdge, TaskInputs
from dagwerk.orchestrator import OrchestratorCallbacks, cancel_run, start_run
from dagwerk.runtime.clock import FakeClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.errors import ExecutionRootError, NonRetryableError, WorkerStoppedError
from dagwerk.runtime.plugins import PluginRegistry
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.worker import Worker

NODES = [
    DagNode(slug="load", plugin="load"),
    DagNode(slug="settings", plugin="load_settings"),
    DagNode(
        slug="transform",
        plugin="transform",
        input_mode=InputMode.EACH,
        edges=(InputEdge(name="records", source="load"),),
        bindings={"title": EdgeSource(edge="records", field="title")},
    ),
    DagNode(
        slug="publish",
        plugin="publish",
        input_mode=InputMode.ALL,
        edges=(
            InputEdge(name="results", source="transform"),
            InputEdge(name="settings", source="settings", role=InputRole.SIDE, required=False),
        ),
    ),
]


def load(inputs: TaskInputs, ctx: TaskContext) -> object:
    titles = inputs.parameters.get("titles", ())
    assert isinstance(titles, tuple)
    return [{"title": str(title)} for title in titles]


def load_settings(inputs: TaskInputs, ctx: TaskContext) -> object:
    return EmittedOutput(id="settings", fields={"separator": " | "})


async def transform(inputs: TaskInputs, ctx: TaskContext) -> object:
    title = str(inputs.parameters["title"])
    return {"title": title.upper()}


def publish(inputs: TaskInputs, ctx: TaskContext) -> object:
    titles = sorted(str(out.fields["title"]) for out in inputs.edges["results"])
    settings = inputs.edges["settings"]
    separator = str(settings[0].fields["separator"]) if settings else ", "
    return EmittedOutput(id="page", fields={"text": separator.join(titles)})


def _registry() -> PluginRegistry:
    return PluginRegistry(
        {"load": load, "load_settings": load_settings, "transform": transform, "publish": publish}
    )


def _callbacks(finished: dict[str, str]) -> OrchestratorCallbacks:
    return OrchestratorCallbacks(
        on_run_completed=lambda r: finished.__setitem__(r, "completed"),
        on_run_failed=lambda r: finished.__setitem__(r, "failed"),
        on_run_crashed=lambda r: finished.__setitem__(r, "crashed"),
        on_run_cancelled=lambda r: finished.__setitem__(r, "cancelled"),
    )


def _start(store: MemoryStore, run_id: str, nodes: list[DagNode], **run_input: object) -> None:
    store.create_run(run_id, nodes, run_input=run_input)
    start_run(store, run_id, callbacks=_callbacks({}))


@pytest.mark.parametrize("concurrency", [1, 4])
def test_example_pipeline_completes_through_the_worker(tmp_path: Path, concurrency: int) -> None:
    store = MemoryStore()
    finished: dict[str, str] = {}
    worker = Worker(
        store,
        _registry(),
        concurrency=concurrency,
        clock=FakeClock(),
        execution_root=tmp_path,
        callbacks=_callbacks(finished),
    )
    _start(store, "run-1", NODES, titles=["alpha", "beta", "gamma", "delta", "eps"])
    handled = worker.run_until_idle()
    assert handled == 1 + 1 + 5 + 1
    run = store.get_run("run-1")
    assert run is not None and run.status is RunStatus.COMPLETED, run
    assert finished == {"run-1": "completed"}
    (page_id,) = store.get_output_ids("run-1", 3)
    page = store.resolve_outputs("run-1", (page_id,))[page_id]
    assert page.fields["text"] == "ALPHA | BETA | DELTA | EPS | GAMMA"
    # Default output ids derive from the task id and position.
    load_task = store.list_tasks("run-1")[0]
    assert store.get_output_ids("run-1", 0) == tuple(f"{load_task.task_id}/{i}" for i in range(5))
    assert store.list_deliveries() == []


def test_started_worker_drives_a_run_observed_with_wait_for_run(tmp_path: Path) -> None:
    store = MemoryStore()
    worker = Worker(store, _registry(), concurrency=2, poll_interval=0.01, execution_root=tmp_path)
    _start(store, "run-bg", NODES, titles=["x", "y"])
    worker.start()
    worker.start()  # idempotent
    try:
        assert worker.wait_for_run("run-bg", timeout=30) is RunStatus.COMPLETED
    finally:
        worker.stop()
        worker.stop()
    assert worker.actor.max_steps_in_flight == 1
    with pytest.raises(WorkerStoppedError):
        worker.start()


def test_failing_plugin_succeeds_on_the_third_attempt(tmp_path: Path) -> None:
    attempts_seen: list[int] = []

    def flaky(inputs: TaskInputs, ctx: TaskContext) -> object:
        attempts_seen.append(ctx.attempt)
        if len(attempts_seen) < 3:
            raise ConnectionError(f"flaky {len(attempts_seen)}")
        return {"ok": True}

    registry = PluginRegistry()
    registry.register("flaky", flaky, retry=RetryPolicy(max_attempts=3, backoff_base=2.0))
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    worker = Worker(store, registry, clock=clock, execution_root=tmp_path)
    _start(store, "run-r", [DagNode(slug="a", plugin="flaky")])
    worker.run_until_idle()
    (task,) = store.list_tasks("run-r")
    # The failure and the reserved retry committed together (WK-06, WK-13).
    assert (task.status, task.attempt_number) == (TaskStatus.QUEUED, 2)
    (first, _) = store.list_attempts(task.task_id)
    assert (first.status, first.error) == (TaskStatus.FAILED, "ConnectionError: flaky 1")
    assert store.get_run_status("run-r") is RunStatus.RUNNING
    for _ in range(2):
        clock.advance(60)  # past any jittered backoff (cap 60 s)
        worker.run_until_idle()
    assert attempts_seen == [1, 2, 3]
    assert store.get_run_status("run-r") is RunStatus.COMPLETED
    actions = [r.action for r in worker.reports]
    assert actions.count("retried") == 2 and actions[-1] == "completed"


def test_retries_stop_at_max_attempts_and_non_retryable_fails_at_once(tmp_path: Path) -> None:
    calls: list[str] = []

    def always(inputs: TaskInputs, ctx: TaskContext) -> object:
        calls.append("always")
        raise ConnectionError("down")

    def refuses(inputs: TaskInputs, ctx: TaskContext) -> object:
        calls.append("refuses")
        raise NonRetryableError("bad input")

    registry = PluginRegistry()
    registry.register("always", always, retry=RetryPolicy(max_attempts=2, jitter=False))
    registry.register("refuses", refuses, retry=RetryPolicy(max_attempts=5))
    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    worker = Worker(store, registry, clock=clock, execution_root=tmp_path)
    _start(store, "r-a", [DagNode(slug="a", plugin="always")])
    _start(store, "r-b", [DagNode(slug="b", plugin="refuses")])
    for _ in range(4):
        worker.run_until_idle()
        clock.advance(10)
    assert calls.count("always") == 2 and calls.count("refuses") == 1
    run_a, run_b = store.get_run("r-a"), store.get_run("r-b")
    assert run_a is not None and run_a.status is RunStatus.FAILED
    assert run_a.error is not None and "ConnectionError: down" in run_a.error
    assert run_b is not None and run_b.status is RunStatus.FAILED
    assert run_b.error == "bad input"


def test_process_executor_enforces_the_timeout_and_stores_no_late_result(
    tmp_path: Path,
) -> None:
    registry = PluginRegistry()
    registry.register("slow", _slow_plugin, timeout_seconds=1.0)
    store = MemoryStore()
    worker = Worker(store, registry, executor="process", execution_root=tmp_path)
    _start(store, "run-t", [DagNode(slug="s", plugin="slow")])
    started = time.monotonic()
    worker.run_until_idle()
    assert time.monotonic() - started < 30  # the 60 s plugin was terminated
    run = store.get_run("run-t")
    # A timeout that cannot be retried is recorded as a crash (decisions.md).
    assert run is not None and run.status is RunStatus.CRASHED
    assert run.error is not None and "timed out" in run.error
    assert store.get_output_ids("run-t", 0) == ()


def _slow_plugin(inputs: TaskInputs, ctx: TaskContext) -> object:
    time.sleep(60)
    return {"late": True}


def test_wk_15_cancellation_reaches_a_running_attempt(tmp_path: Path) -> None:
    entered = threading.Event()
    finished = threading.Event()
    exited: list[bool] = []

    def cooperative(inputs: TaskInputs, ctx: TaskContext) -> object:
        entered.set()
        exited.append(ctx.cancelled.wait(30))
        finished.set()
        return {"should": "never publish"}

    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    worker = Worker(
        store,
        PluginRegistry({"coop": cooperative}),
        clock=clock,
        cancel_check_interval=1.0,
        execution_root=tmp_path,
    )
    _start(store, "run-c", [DagNode(slug="c", plugin="coop")])
    runner = threading.Thread(target=worker.run_until_idle)
    runner.start()
    assert entered.wait(10)
    assert cancel_run(store, "run-c")
    clock.advance(1.0)  # one lease-check interval
    runner.join(10)
    assert finished.wait(10)
    assert exited == [True]
    assert store.get_run_status("run-c") is RunStatus.CANCELLED
    assert store.get_output_ids("run-c", 0) == ()
    assert [r.action for r in worker.reports] == ["cancelled"]


def test_wk_15_cancelled_run_never_enters_the_plugin(tmp_path: Path) -> None:
    called: list[int] = []
    store = MemoryStore()
    worker = Worker(
        store,
        PluginRegistry({"p": lambda i, c: called.append(1)}),
        clock=FakeClock(),
        execution_root=tmp_path,
    )
    _start(store, "run-x", [DagNode(slug="p", plugin="p")])
    cancel_run(store, "run-x")
    worker.run_until_idle()
    assert called == []


def test_plugin_error_and_invalid_output_fail_the_task(tmp_path: Path) -> None:
    store = MemoryStore()
    worker = Worker(
        store,
        PluginRegistry({"bad": lambda i, c: 42}),
        clock=FakeClock(),
        execution_root=tmp_path,
    )
    _start(store, "run-o", [DagNode(slug="b", plugin="bad")])
    worker.run_until_idle()
    run = store.get_run("run-o")
    assert run is not None and run.status is RunStatus.FAILED
    assert run.error is not None and "PluginOutputError" in run.error


def test_wk_05_redelivered_running_task_is_recovered_under_a_new_attempt(
    tmp_path: Path,
) -> None:
    # A worker that "dies" mid-task: a lease that expires while the task is
    # RUNNING and no settlement ever happens.
    clock = FakeClock()
    store = MemoryStore(clock=clock.time, max_deliveries=3)
    seen: list[int] = []
    worker = Worker(
        store,
        PluginRegistry({"p": lambda i, c: seen.append(c.attempt)}),
        clock=clock,
        lease_seconds=5,
        lease_grace=0,
        execution_root=tmp_path,
    )
    _start(store, "run-d", [DagNode(slug="p", plugin="p")])
    (delivery,) = worker.queue.dequeue("dead-worker", limit=1, lease_seconds=5)
    assert claim_task(
        store,
        delivery.task_id,
        expected_attempt_id=delivery.attempt_id,
        expected_generation=delivery.generation,
    )
    clock.advance(6)  # the dead worker's lease expires
    worker.run_until_idle()
    assert [r.action for r in worker.reports] == ["recovered", "completed"]
    assert seen == [2]  # the durable attempt number, not a per-process count
    assert store.get_run_status("run-d") is RunStatus.COMPLETED
    # The dead worker's late settle is stale: nothing changes.
    assert (
        store.try_complete_task(delivery.task_id, (), expected_attempt_id=delivery.attempt_id)
        is None
    )
    first, second = store.list_attempts(delivery.task_id)
    assert (first.status, first.worker_id) == (TaskStatus.CRASHED, "dead-worker")
    assert (second.status, second.worker_id) == (TaskStatus.COMPLETED, worker.worker_id)


def test_poison_task_reaches_the_dead_letter_queue_and_the_run_crashes(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock.time, max_deliveries=2)
    worker = Worker(
        store,
        PluginRegistry({"p": lambda i, c: None}),
        clock=clock,
        lease_seconds=5,
        lease_grace=0,
        execution_root=tmp_path,
    )
    _start(store, "run-p", [DagNode(slug="p", plugin="p")])
    for _ in range(2):
        # Every execution kills its worker: claim, then never settle.
        (row,) = store.dequeue("doomed", limit=1, lease_seconds=5)
        assert claim_task(
            store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0
        )
        clock.advance(6)
        # The next lease holder recovers the task under a new attempt, until
        # the carried delivery count sends the row to the dead-letter queue.
        worker.process_once()
    assert store.get_run_status("run-p") is RunStatus.CRASHED
    (letter,) = store.list_dead_letters()
    assert letter.reason == "max_deliveries"
    assert [r.action for r in worker.reports] == ["recovered", "dead_lettered"]
    run = store.get_run("run-p")
    assert run is not None and run.error == "dead-lettered: max_deliveries"


def test_aa_08_execution_root_is_required_and_validated(tmp_path: Path) -> None:
    store = MemoryStore()
    for bad in (None, "", ".", "relative/dir", tmp_path / "missing"):
        with pytest.raises(ExecutionRootError):
            Worker(store, {}, execution_root=bad)
    worker = Worker(store, {}, execution_root=tmp_path)
    assert worker.execution_root == tmp_path.resolve()
    with pytest.raises(DagwerkError):  # no durable queue, no worker
        Worker(object(), {}, execution_root=tmp_path)  # type: ignore[arg-type]
