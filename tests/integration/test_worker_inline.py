"""A started worker runs a batch's lone attempt on its loop thread
(runtime/_inline.py; W2): a hop saves two thread hand-offs, and a
plugin that hangs, ignores its abort or leaves still cannot stall the worker.
On a SQLite file, with the worker's real actor thread."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dagwerk.backends.sqlite.store import SqliteStore
from dagwerk.constants import InputMode, RunStatus
from dagwerk.models import DagNode, InputEdge, TaskInputs
from dagwerk.orchestrator import OrchestratorCallbacks, cancel_run, start_run
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.plugins import PluginRegistry
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.worker import Worker
from dagwerk.testing.waits import wait_until

WAIT = 30.0
_NOOP = OrchestratorCallbacks(lambda r: None, lambda r: None, lambda r: None, lambda r: None)
_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("_VAR", default="unset")


@pytest.fixture
def escaped() -> Iterator[list[BaseException | None]]:
    """Exceptions that ended a thread (none may: LoopHandedOver is caught)."""
    seen: list[BaseException | None] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)
    yield seen
    threading.excepthook = previous


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore(str(tmp_path / "dag.db"))
    yield opened
    opened.close()


def _start(store: SqliteStore, run_id: str, nodes: list[DagNode]) -> None:
    store.create_run(run_id, nodes, run_input={})
    start_run(store, run_id, callbacks=_NOOP)


def _worker(store: SqliteStore, plugins: PluginRegistry, tmp_path: Path) -> Worker:
    return Worker(
        store,
        plugins,
        poll_interval=0.02,
        cancel_check_interval=0.02,
        execution_root=tmp_path,
        callbacks=_NOOP,
    )


def _actor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dagwerk-actor" and t.is_alive()]


def _deaf() -> tuple[threading.Event, threading.Event, Callable[[TaskInputs, TaskContext], object]]:
    """A plugin that ignores its abort until released, and its two events."""
    entered, release = threading.Event(), threading.Event()

    def deaf(inputs: TaskInputs, ctx: TaskContext) -> object:
        entered.set()
        release.wait(WAIT)
        return {"late": True}

    return entered, release, deaf


def test_each_step_of_a_chain_runs_on_the_loop_thread(tmp_path: Path, store: SqliteStore) -> None:
    on_loop: list[bool] = []

    def step(inputs: TaskInputs, ctx: TaskContext) -> object:
        on_loop.append(worker.actor.in_loop_thread())
        return {"n": 1}

    worker = _worker(store, PluginRegistry({"step": step}), tmp_path)
    nodes = [DagNode(slug="s0", plugin="step")] + [
        DagNode(
            slug=f"s{i}",
            plugin="step",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="in", source=f"s{i - 1}"),),
        )
        for i in range(1, 4)
    ]
    _start(store, "chain", nodes)
    worker.start()
    try:
        assert worker.wait_for_run("chain", timeout=WAIT) is RunStatus.COMPLETED
    finally:
        worker.stop()
    assert on_loop == [True] * 4


def test_a_hung_lone_attempt_times_out_and_the_worker_moves_on(
    tmp_path: Path, store: SqliteStore, escaped: list[BaseException | None]
) -> None:
    entered, release = threading.Event(), threading.Event()
    ran_on: list[threading.Thread] = []

    def hang(inputs: TaskInputs, ctx: TaskContext) -> object:
        ran_on.append(threading.current_thread())
        entered.set()
        release.wait(WAIT)  # ignores its abort
        return {"late": True}

    plugins = PluginRegistry()
    plugins.register("hang", hang, timeout_seconds=0.2, retry=RetryPolicy(max_attempts=1))
    plugins.register("quick", lambda i, c: {"ok": True})
    worker = _worker(store, plugins, tmp_path)
    _start(store, "hung", [DagNode(slug="h", plugin="hang")])
    worker.start()
    try:
        assert entered.wait(WAIT)
        (stuck,) = ran_on
        assert stuck.name == "dagwerk-actor"
        # Settled as a timeout (recorded as a crash) while the plugin hangs on.
        assert worker.wait_for_run("hung", timeout=WAIT) is RunStatus.CRASHED
        _start(store, "next", [DagNode(slug="q", plugin="quick")])
        assert worker.wait_for_run("next", timeout=WAIT) is RunStatus.COMPLETED
        # ... served by a new loop thread while the old one is still stuck.
        assert not release.is_set() and stuck.is_alive()
        assert len(_actor_threads()) == 2
    finally:
        release.set()
        worker.stop(WAIT)
    wait_until(lambda: not stuck.is_alive(), "the stuck thread's end")
    wait_until(lambda: _actor_threads() == [], "no loop thread left")
    assert escaped == []
    assert store.get_output_ids("hung", 0) == ()  # the late result was discarded
    assert worker.actor.max_steps_in_flight == 1
    actions = [(r.task_id, r.action) for r in worker.reports]
    assert [a for _, a in actions] == ["timed_out", "completed"]


def test_cancelling_a_run_whose_lone_attempt_ignores_its_abort(
    tmp_path: Path, store: SqliteStore, escaped: list[BaseException | None]
) -> None:
    entered, release, deaf = _deaf()
    plugins = PluginRegistry({"deaf": deaf, "quick": lambda i, c: {"ok": True}})
    worker = _worker(store, plugins, tmp_path)
    _start(store, "deaf", [DagNode(slug="d", plugin="deaf")])
    worker.start()
    try:
        assert entered.wait(WAIT)
        assert cancel_run(store, "deaf")
        # The monitor sees the cancellation and aborts the attempt; the
        # worker settles it and serves the next run while the plugin hangs.
        wait_until(lambda: [r.action for r in worker.reports] == ["cancelled"], "cancelled")
        _start(store, "next", [DagNode(slug="q", plugin="quick")])
        assert worker.wait_for_run("next", timeout=WAIT) is RunStatus.COMPLETED
        assert not release.is_set()
    finally:
        release.set()
        worker.stop(WAIT)
    wait_until(lambda: _actor_threads() == [], "no loop thread left")
    assert escaped == []
    assert store.get_run_status("deaf") is RunStatus.CANCELLED
    assert store.get_output_ids("deaf", 0) == ()


def test_stop_releases_a_lone_attempt_that_ignores_its_abort(
    tmp_path: Path, store: SqliteStore, escaped: list[BaseException | None]
) -> None:
    entered, release, deaf = _deaf()
    worker = _worker(store, PluginRegistry({"deaf": deaf}), tmp_path)
    _start(store, "deaf", [DagNode(slug="d", plugin="deaf")])
    worker.start()
    try:
        assert entered.wait(WAIT)
        worker.stop(WAIT)  # returns although the plugin still runs
        assert not release.is_set()
        assert worker.actor.state.value == "stopped"
        assert [r.action for r in worker.reports] == ["released"]
    finally:
        release.set()
    wait_until(lambda: _actor_threads() == [], "no loop thread left")
    assert escaped == []
    assert store.get_run_status("deaf") is RunStatus.RUNNING  # redelivery recovers it
    assert store.get_output_ids("deaf", 0) == ()


def test_plugins_on_the_loop_thread_share_no_context_and_may_leave(
    tmp_path: Path, store: SqliteStore, escaped: list[BaseException | None]
) -> None:
    seen: list[str] = []

    def mark(inputs: TaskInputs, ctx: TaskContext) -> object:
        seen.append(_VAR.get())
        _VAR.set(ctx.run_id)
        return None

    def leave(inputs: TaskInputs, ctx: TaskContext) -> object:
        raise SystemExit(3)

    plugins = PluginRegistry()
    plugins.register("mark", mark)
    plugins.register("leave", leave, retry=RetryPolicy(max_attempts=1))
    worker = _worker(store, plugins, tmp_path)
    worker.start()
    try:
        _start(store, "m1", [DagNode(slug="m", plugin="mark")])
        assert worker.wait_for_run("m1", timeout=WAIT) is RunStatus.COMPLETED
        _start(store, "exit", [DagNode(slug="x", plugin="leave")])
        assert worker.wait_for_run("exit", timeout=WAIT) is RunStatus.FAILED
        _start(store, "m2", [DagNode(slug="m", plugin="mark")])
        assert worker.wait_for_run("m2", timeout=WAIT) is RunStatus.COMPLETED
    finally:
        worker.stop(WAIT)
    assert seen == ["unset", "unset"]
    assert escaped == []
    run = store.get_run("exit")
    assert run is not None and run.error is not None and "SystemExit" in run.error
