"""Real worker processes on one SQLite file: SIGKILL recovery, process-executor
timeouts, cancellation of running attempts and poison tasks.

The workers are this file run as a script (``python test_worker_processes.py
work <db> <worker id> <concurrency> <lease> <check interval>``); each is a
separate interpreter with its own connection and a real ``Worker``. Plugins
report what they do by creating files in the worker's execution root, and
the tests poll for those files with a deadline (never a bare sleep).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import RUN_TERMINAL_STATUSES, FailurePolicy, InputMode, RunStatus, TaskStatus
from dagwerk.models import DagNode, EdgeSource, InputEdge, RetryPolicySpec, TaskInputs
from dagwerk.orchestrator import OrchestratorCallbacks, cancel_run, start_run
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.worker import Worker

RUN_ID = "run-1"
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")


def _noop(run_id: str) -> None:
    del run_id


CALLBACKS = OrchestratorCallbacks(_noop, _noop, _noop, _noop)


# --- plugins (run inside the worker processes) -------------------------------------


def _mark(ctx: TaskContext, kind: str, text: str = "") -> None:
    name = f"{kind}-{ctx.task_id.replace(':', '_')}-{ctx.attempt}"
    # Written aside and renamed: a reader globbing for the marker never sees
    # it empty (write_text creates the file before writing it).
    partial = ctx.execution_root / f".{name}.tmp"
    partial.write_text(text or str(time.time()))
    partial.replace(ctx.execution_root / name)


def gen(inputs: TaskInputs, ctx: TaskContext) -> object:
    return [{"n": n} for n in range(int(str(inputs.parameters["count"])))]


def block(inputs: TaskInputs, ctx: TaskContext) -> object:
    _mark(ctx, "started")
    release = ctx.execution_root / "release"
    while not release.exists():
        ctx.cancelled.wait(0.02)
    return {"n": inputs.parameters["n"]}


_HOLDING = threading.Semaphore(0)  # one release per hold() that has not returned yet
_HELD = [0]
_HELD_LOCK = threading.Lock()


def hold(inputs: TaskInputs, ctx: TaskContext) -> object:
    with _HELD_LOCK:
        _HELD[0] += 1
    _mark(ctx, "started")
    ctx.cancelled.wait(60)
    _mark(ctx, "stopped")
    _HOLDING.release()
    return {"n": inputs.parameters["n"]}


def poison(inputs: TaskInputs, ctx: TaskContext) -> object:
    _mark(ctx, "started")
    os.kill(os.getpid(), signal.SIGKILL)
    return None


def ok(inputs: TaskInputs, ctx: TaskContext) -> object:
    return {"ok": True}


def sleepy(inputs: TaskInputs, ctx: TaskContext) -> object:
    if ctx.attempt == 1:
        time.sleep(30)  # ignores its signal: only a hard stop ends it
        return {"late": True}
    return {"late": False}


PLUGINS: dict[str, Callable[[TaskInputs, TaskContext], object]] = {
    "gen": gen,
    "block": block,
    "hold": hold,
    "poison": poison,
    "ok": ok,
    "sleepy": sleepy,
}


def fan(slug: str, plugin: str) -> DagNode:
    return DagNode(
        slug=slug,
        plugin=plugin,
        input_mode=InputMode.EACH,
        edges=(InputEdge(name="items", source="gen"),),
        bindings={"n": EdgeSource(edge="items", field="n")},
    )


# --- the worker process ----------------------------------------------------------------


def worker_main(db: str, worker_id: str, concurrency: int, lease: float, interval: float) -> None:
    store = SqliteStore(db, max_deliveries=int(os.environ.get("DAGWERK_MAX_DELIVERIES", "3")))
    worker = Worker(
        store,
        PLUGINS,
        concurrency=concurrency,
        lease_seconds=lease,
        lease_grace=0.5,
        poll_interval=0.05,
        cancel_check_interval=interval,
        execution_root=os.environ["DAGWERK_EVENTS"],
        worker_id=worker_id,
    )
    while store.get_run_status(RUN_ID) not in RUN_TERMINAL_STATUSES:
        worker.process_once(wait_seconds=0.2)
    worker.stop(timeout=10)
    # A cancelled plugin is abandoned by its settled attempt and may still be
    # writing its mark: the process (and its daemon threads) ends after it.
    for _ in range(_HELD[0]):
        _HOLDING.acquire(timeout=10)


# --- helpers of the tests ------------------------------------------------------------


def _spawn(
    db: Path,
    events: Path,
    worker_id: str,
    *,
    concurrency: int = 1,
    lease: float = 1.0,
    interval: float = 0.25,
    max_deliveries: int = 3,
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DAGWERK_EVENTS": str(events),
        "DAGWERK_MAX_DELIVERIES": str(max_deliveries),
    }
    return subprocess.Popen(
        [
            sys.executable,
            __file__,
            "work",
            str(db),
            worker_id,
            str(concurrency),
            str(lease),
            str(interval),
        ],
        env=env,
    )


def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling with a deadline, not synchronisation by sleeping


def _files(events: Path, prefix: str) -> list[Path]:
    return sorted(events.glob(f"{prefix}-*"))


def _start(db: Path, nodes: list[DagNode], **run_input: object) -> SqliteStore:
    store = SqliteStore(db)
    policy = run_input.pop("failure_policy", FailurePolicy.FAIL_FAST)
    assert store.create_run(RUN_ID, nodes, run_input=run_input, failure_policy=policy)  # type: ignore[arg-type]
    start_run(store, RUN_ID, callbacks=CALLBACKS)
    return store


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


# --- the tests ---------------------------------------------------------------------------


def test_kill_9_mid_task_is_recovered_by_another_worker(tmp_path: Path) -> None:
    db, events = tmp_path / "w.db", tmp_path / "events"
    events.mkdir()
    store = _start(db, [DagNode(slug="gen", plugin="gen"), fan("work", "block")], count=3)
    first = _spawn(db, events, "w1")
    second: subprocess.Popen[bytes] | None = None
    try:
        _until(lambda: len(_files(events, "started")) == 1, 30, "the first attempt to start")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        (events / "release").write_text("go")
        second = _spawn(db, events, "w2")
        _until(lambda: store.get_run_status(RUN_ID) in RUN_TERMINAL_STATUSES, 60, "the run")
    finally:
        _stop(first, *(p for p in (second,) if p is not None))
    assert store.get_run_status(RUN_ID) is RunStatus.COMPLETED
    outputs = store.get_output_ids(RUN_ID, 1)
    assert len(outputs) == 3 == len(set(outputs))  # no output published twice
    attempts = {
        record.task_id: store.list_attempts(record.task_id) for record in store.list_tasks(RUN_ID)
    }
    killed = [a for history in attempts.values() for a in history if a.worker_id == "w1"]
    assert [a.status for a in killed if a.status is not TaskStatus.COMPLETED] == [
        TaskStatus.CRASHED
    ]
    store.close()


def test_process_executor_timeout_retries_and_drops_the_late_result(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    store = _start(
        db,
        [
            DagNode(
                slug="s",
                plugin="sleepy",
                # The deadline covers spawning the child too: 1 s timed out the
                # healthy second attempt on a loaded machine.
                timeout_seconds=5.0,
                retry=RetryPolicySpec(max_attempts=2, backoff_base=0.0, backoff_max=0.0),
            )
        ],
    )
    worker = Worker(store, PLUGINS, executor="process", execution_root=tmp_path)
    started = time.monotonic()
    deadline = started + 60
    while store.get_run_status(RUN_ID) not in RUN_TERMINAL_STATUSES and time.monotonic() < deadline:
        worker.process_once(wait_seconds=0.2)
    worker.stop(timeout=10)
    assert time.monotonic() - started < 25  # the 30 s attempt was terminated
    assert store.get_run_status(RUN_ID) is RunStatus.COMPLETED
    (record,) = store.list_tasks(RUN_ID)
    first, second = store.list_attempts(record.task_id)
    assert first.status is TaskStatus.FAILED and "timed out" in (first.error or "")
    assert second.status is TaskStatus.COMPLETED
    resolved = store.resolve_outputs(RUN_ID, store.get_output_ids(RUN_ID, 0))
    assert [dict(o.fields) for o in resolved.values()] == [{"late": False}]
    store.close()


def test_cancel_stops_50_running_tasks_across_two_worker_processes(tmp_path: Path) -> None:
    db, events = tmp_path / "c.db", tmp_path / "events"
    events.mkdir()
    interval = 1.0
    store = _start(db, [DagNode(slug="gen", plugin="gen"), fan("hold", "hold")], count=50)
    procs = [
        _spawn(db, events, f"w{n}", concurrency=25, lease=5.0, interval=interval) for n in (1, 2)
    ]
    try:
        _until(lambda: len(_files(events, "started")) == 50, 60, "50 running attempts")
        cancelled_at = time.time()
        assert cancel_run(store, RUN_ID)
        _until(lambda: len(_files(events, "stopped")) == 50, 30, "every attempt to stop")
        stopped = [float(path.read_text()) for path in _files(events, "stopped")]
        for proc in procs:
            proc.wait(30)
    finally:
        _stop(*procs)
    # Each worker polls durable run state every interval: all stop within two.
    assert max(stopped) - cancelled_at <= 2 * interval
    assert store.get_run_status(RUN_ID) is RunStatus.CANCELLED
    assert store.get_output_ids(RUN_ID, 1) == ()
    assert {r.status for r in store.list_tasks(RUN_ID) if r.node_index == 1} == {
        TaskStatus.CANCELLED
    }
    store.close()


def test_poison_task_reaches_the_dead_letter_queue_and_the_run_follows_its_policy(
    tmp_path: Path,
) -> None:
    db, events = tmp_path / "p.db", tmp_path / "events"
    events.mkdir()
    store = _start(
        db,
        [DagNode(slug="ok", plugin="ok"), DagNode(slug="poison", plugin="poison")],
        failure_policy=FailurePolicy.CONTINUE_OTHERS,
    )
    spawned: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + 90
        while store.get_run_status(RUN_ID) not in RUN_TERMINAL_STATUSES:
            assert time.monotonic() < deadline, "the run never ended"
            proc = _spawn(db, events, f"w{len(spawned)}", max_deliveries=2)
            spawned.append(proc)
            proc.wait(60)  # it dies on the poison task or exits when the run ends
    finally:
        _stop(*spawned)
    assert store.get_run_status(RUN_ID) in (RunStatus.FAILED, RunStatus.CRASHED)
    (letter,) = store.list_dead_letters(RUN_ID)
    assert letter.reason == "max_deliveries"
    poison_task = next(r for r in store.list_tasks(RUN_ID) if r.node_index == 1)
    assert poison_task.status is TaskStatus.CRASHED
    assert len(_files(events, "started")) == 2  # executed max_deliveries times
    ok_task = next(r for r in store.list_tasks(RUN_ID) if r.node_index == 0)
    assert ok_task.status is TaskStatus.COMPLETED
    store.close()


if __name__ == "__main__":
    if sys.argv[1] == "work":
        worker_main(
            sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
        )
