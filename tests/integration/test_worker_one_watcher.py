"""One watcher per worker: on both delivery paths, the attempt monitor is
what aborts a running attempt whose run was cancelled; no attempt gets a
watcher thread of its own."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import RunStatus
from dagwerk.models import DagNode, TaskInputs
from dagwerk.orchestrator import OrchestratorCallbacks, cancel_run, start_run
from dagwerk.runtime.clock import FakeClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.worker import Worker


def _noop(run_id: str) -> None:
    return None


@pytest.mark.parametrize("batched", [False, True], ids=["one_by_one", "batched"])
def test_the_attempt_monitor_alone_aborts_a_cancelled_runs_attempts(
    tmp_path: Path, batched: bool
) -> None:
    entered = threading.Event()
    threads: list[str] = []
    exited: list[bool] = []
    # Threads of other tests' workers may still run: only this worker's count.
    earlier = set(threading.enumerate())

    def cooperative(inputs: TaskInputs, ctx: TaskContext) -> object:
        threads.extend(t.name for t in threading.enumerate() if t not in earlier)
        entered.set()
        exited.append(ctx.cancelled.wait(30))
        return {"should": "never publish"}

    clock = FakeClock()
    store = MemoryStore(clock=clock.time)
    nodes = [DagNode(slug="c", plugin="coop")]
    assert store.create_run("run-c", nodes)
    start_run(store, "run-c", callbacks=OrchestratorCallbacks(_noop, _noop, _noop, _noop))
    worker = Worker(
        store,
        {"coop": cooperative},
        clock=clock,
        cancel_check_interval=1.0,
        execution_root=tmp_path,
        batched=batched,
    )
    runner = threading.Thread(target=worker.run_until_idle)
    runner.start()
    try:
        assert entered.wait(10)
        assert worker.monitor.running == 1
        assert cancel_run(store, "run-c")
        clock.advance(1.0)  # one check interval of the monitor
        runner.join(10)
        assert not runner.is_alive()
    finally:
        worker.stop()
    assert exited == [True]
    assert [name for name in threads if name.startswith("dagwerk-watch")] == []
    assert threads.count("dagwerk-monitor") == 1
    assert store.get_run_status("run-c") is RunStatus.CANCELLED
    assert [r.action for r in worker.reports] == ["cancelled"]
    assert worker.monitor.running == 0
