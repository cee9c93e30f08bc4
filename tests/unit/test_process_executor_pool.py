"""The process executor's warm processes: reuse across attempts, the hard
stop and its replacement, crashes, what carries over between attempts,
plugins that cannot travel, the start-up wait and the pool's shutdown.

Plugins are module-level functions, so a plugin process can import them;
each reports its process ID in its output.
"""

from __future__ import annotations

import contextvars
import multiprocessing
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import InputMode, RunStatus, TaskStatus
from dagwerk.models import DagNode, EdgeSource, InputEdge, TaskInputs
from dagwerk.runtime.clock import Clock, FakeClock, SystemClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.executors import (
    AttemptSignal,
    ExecutionOutcome,
    OutcomeKind,
    PluginTransferError,
    ProcessExecutor,
)
from dagwerk.runtime.plugins import PluginFn
from dagwerk.runtime.worker import Worker
from dagwerk.testing.helpers import new_run, root

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="POSIX signals and /proc")

WAIT = 60.0


def _ctx(signal_: AttemptSignal, task_id: str = "task-1") -> TaskContext:
    return TaskContext(
        run_id="r",
        task_id=task_id,
        node_index=0,
        generation=0,
        attempt_id="a1",
        attempt=1,
        plugin="p",
        execution_root=Path("/tmp"),
        cancelled=signal_.abort,
    )


def _run(
    executor: ProcessExecutor,
    fn: PluginFn,
    parameters: dict[str, object] | None = None,
    *,
    timeout: float | None = 30.0,
    clock: Clock | None = None,
) -> ExecutionOutcome:
    signal_ = AttemptSignal()
    return executor.execute(
        fn,
        TaskInputs(edges={}, parameters=parameters or {}),
        _ctx(signal_),
        timeout=timeout,
        signal=signal_,
        clock=clock or SystemClock(),
    )


def _pid(outcome: ExecutionOutcome) -> int:
    assert outcome.kind is OutcomeKind.OK, outcome
    pid = outcome.outputs[0].fields["pid"]
    assert isinstance(pid, int)
    return pid


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # polling with a deadline, not synchronisation by sleeping


def _wrote(file: Path) -> bool:
    return file.exists() and file.read_text() != ""


def _exited(pid: int) -> bool:
    """Dead, reaped or not (a zombie until its parent joins it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _gone(pid: int) -> bool:
    """No such process (a joined child is reaped, not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def executor() -> Iterator[ProcessExecutor]:
    made = ProcessExecutor(processes=2)
    try:
        yield made
    finally:
        made.close()


# --- plugins ---------------------------------------------------------------------------

_CALLS = [0]
_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


def pid(inputs: TaskInputs, ctx: TaskContext) -> object:
    return {"pid": os.getpid()}


def writes_pid_then_sleeps(inputs: TaskInputs, ctx: TaskContext) -> object:
    Path(str(inputs.parameters["file"])).write_text(str(os.getpid()))
    # Deaf to the abort event: only the hard stop can end it, so the test
    # cannot race a plugin that returns when asked to stop.
    time.sleep(60)
    return {"late": True}


def exits(inputs: TaskInputs, ctx: TaskContext) -> object:
    os._exit(7)


def segfaults(inputs: TaskInputs, ctx: TaskContext) -> object:
    os.kill(os.getpid(), signal.SIGSEGV)
    return None


def leaves_state(inputs: TaskInputs, ctx: TaskContext) -> object:
    _CALLS[0] += 1
    seen = {
        "pid": os.getpid(),
        "calls": _CALLS[0],
        "cwd": os.getcwd(),
        "env": os.environ.get("DAGWERK_POOL_TEST", "unset"),
        "var": _VAR.get(),
    }
    elsewhere = str(inputs.parameters["elsewhere"])
    os.makedirs(elsewhere, exist_ok=True)
    os.chdir(elsewhere)
    os.rmdir(elsewhere)  # and the directory it moved into is gone
    os.environ["DAGWERK_POOL_TEST"] = "set by a plugin"
    _VAR.set("set by a plugin")
    return seen


class _NeedsTwo(Exception):
    """Pickles as ``(message,)`` but wants two arguments to rebuild."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")


def raises_unrebuildable(inputs: TaskInputs, ctx: TaskContext) -> object:
    raise _NeedsTwo("the page", "is gone")


# --- reuse, the hard stop and crashes ------------------------------------------------


def test_attempts_reuse_one_warm_process(executor: ProcessExecutor) -> None:
    pids = [_pid(_run(executor, pid)) for _ in range(4)]
    assert len(set(pids)) == 1
    assert pids[0] != os.getpid()


def test_a_timeout_kills_only_that_process_and_a_fresh_one_replaces_it(
    executor: ProcessExecutor, tmp_path: Path
) -> None:
    warm = _pid(_run(executor, pid))
    file = tmp_path / "pid"
    outcome = _run(executor, writes_pid_then_sleeps, {"file": str(file)}, timeout=1.0)
    assert outcome.kind is OutcomeKind.TIMEOUT and outcome.retryable
    stopped = int(file.read_text())
    assert stopped == warm  # the warm process ran it, and the stop killed it
    assert _gone(stopped)
    fresh = _pid(_run(executor, pid))
    assert fresh != stopped


def test_a_cancellation_kills_the_process_and_the_next_attempt_gets_a_fresh_one(
    executor: ProcessExecutor, tmp_path: Path
) -> None:
    file = tmp_path / "pid"
    signal_ = AttemptSignal()
    result: list[ExecutionOutcome] = []
    runner = threading.Thread(
        target=lambda: result.append(
            executor.execute(
                writes_pid_then_sleeps,
                TaskInputs(edges={}, parameters={"file": str(file)}),
                _ctx(signal_),
                timeout=None,
                signal=signal_,
                clock=SystemClock(),
            )
        )
    )
    runner.start()
    _until(lambda: _wrote(file), "the plugin to start")
    signal_.fire("run cancelled")
    runner.join(WAIT)
    assert result[0].kind is OutcomeKind.CANCELLED
    stopped = int(file.read_text())
    assert _gone(stopped)
    assert _pid(_run(executor, pid)) != stopped


@pytest.mark.parametrize(
    ("plugin", "why"), [(exits, "exit code 7"), (segfaults, "killed by SIGSEGV")]
)
def test_a_plugin_that_kills_its_process_fails_only_its_attempt(
    executor: ProcessExecutor, plugin: PluginFn, why: str
) -> None:
    before = _pid(_run(executor, pid))
    crashed = _run(executor, plugin)
    assert crashed.kind is OutcomeKind.ERROR and crashed.retryable
    assert str(crashed.error) == f"plugin process exited without a result ({why})"
    assert _gone(before)
    assert _pid(_run(executor, pid)) != before


def test_an_idle_process_killed_from_outside_is_replaced(executor: ProcessExecutor) -> None:
    """The OOM killer, an operator's kill: the next attempt does not fail for it."""
    killed = _pid(_run(executor, pid))
    os.kill(killed, signal.SIGKILL)
    _until(lambda: _exited(killed), "the kill to land")  # it died while idle
    fresh = _pid(_run(executor, pid))
    assert fresh != killed
    assert _gone(killed)  # reaped by the pool, not left a zombie


# --- what carries over between attempts ----------------------------------------------------


def test_module_state_carries_over_but_cwd_environment_and_context_do_not(
    tmp_path: Path,
) -> None:
    executor = ProcessExecutor(processes=1)
    try:
        elsewhere: dict[str, object] = {"elsewhere": str(tmp_path / "elsewhere")}
        first, second = (_run(executor, leaves_state, elsewhere) for _ in "ab")
    finally:
        executor.close()
    one, two = (dict(o.outputs[0].fields) for o in (first, second))
    assert one["pid"] == two["pid"]
    assert (one["calls"], two["calls"]) == (1, 2)  # plain module state persists
    assert two["cwd"] == one["cwd"] != str(tmp_path / "elsewhere")
    assert two["env"] == one["env"] == "unset"
    assert two["var"] == one["var"] == "unset"


def test_a_plugin_directory_added_after_the_process_started_is_found(
    executor: ProcessExecutor, tmp_path: Path
) -> None:
    warm = _pid(_run(executor, pid))
    (tmp_path / "late_plugins_for_pool.py").write_text(
        "import os\n\ndef late(inputs, ctx):\n    return {'pid': os.getpid()}\n"
    )
    sys.path.append(str(tmp_path))
    try:
        import late_plugins_for_pool  # type: ignore[import-not-found]

        assert _pid(_run(executor, late_plugins_for_pool.late)) == warm
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("late_plugins_for_pool", None)


# --- what cannot travel ------------------------------------------------------------------


def test_a_plugin_that_cannot_be_pickled_fails_its_attempt_without_retry(
    executor: ProcessExecutor,
) -> None:
    outcome = _run(executor, lambda inputs, ctx: None)
    assert outcome.kind is OutcomeKind.ERROR
    assert isinstance(outcome.error, PluginTransferError)
    assert "cannot be sent to a plugin process" in str(outcome.error)
    assert outcome.error.code == "plugin_transfer_failed"


def test_a_plugin_whose_module_the_process_cannot_import_fails_its_attempt(
    executor: ProcessExecutor,
) -> None:
    ghost = types.ModuleType("dagwerk_ghost_plugins")
    exec("def ghost(inputs, ctx):\n    return None\n", ghost.__dict__)
    sys.modules["dagwerk_ghost_plugins"] = ghost
    try:
        outcome = _run(executor, ghost.ghost)
    finally:
        del sys.modules["dagwerk_ghost_plugins"]
    assert outcome.kind is OutcomeKind.ERROR
    assert isinstance(outcome.error, PluginTransferError)
    assert "No module named 'dagwerk_ghost_plugins'" in str(outcome.error)
    _pid(_run(executor, pid))  # the process that refused it still serves


def test_an_exception_that_cannot_be_rebuilt_arrives_as_its_text(
    executor: ProcessExecutor,
) -> None:
    outcome = _run(executor, raises_unrebuildable, timeout=20.0)
    assert outcome.kind is OutcomeKind.ERROR
    assert str(outcome.error) == "_NeedsTwo: the page: is gone"


# --- the start-up wait, with a process that runs in a thread ----------------------------------


class _ThreadProcess:
    """A 'plugin process' in a thread of this process, whose start the test
    holds back: ``serve`` only runs once ``release`` is set. Terminate and
    kill close its end of the pipe, so a released 'process' that was stopped
    finds its pipe closed and ends."""

    def __init__(self, *, target: Callable[..., None], args: tuple[Any, ...], **kw: Any) -> None:
        self.release = threading.Event()
        self.signals: list[str] = []
        # The parent closes its copy of the child end after start.
        self.conn = Connection(os.dup(args[0].fileno()))

        # Like a process's sentinel: readable once the "process" has ended.
        self.sentinel, ended = os.pipe()

        def run() -> None:
            try:
                self.release.wait(WAIT)
                target(self.conn, args[1])
            finally:
                os.close(ended)

        self.thread = threading.Thread(target=run, daemon=True)
        self.pid = None
        self.exitcode = None

    def start(self) -> None:
        self.thread.start()

    def terminate(self) -> None:
        self.signals.append("terminate")
        if not self.release.is_set():
            self.conn.close()

    def kill(self) -> None:
        self.signals.append("kill")

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(0)

    def is_alive(self) -> bool:
        return self.thread.is_alive()


class _ThreadContext:
    def __init__(self) -> None:
        self.processes: list[_ThreadProcess] = []
        self.started = threading.Event()

    def Pipe(self, duplex: bool = True) -> Any:
        return multiprocessing.Pipe(duplex)

    def Event(self) -> threading.Event:
        return threading.Event()

    def Process(self, **kw: Any) -> _ThreadProcess:
        process = _ThreadProcess(**kw)
        self.processes.append(process)
        self.started.set()
        return process


def quick(inputs: TaskInputs, ctx: TaskContext) -> object:
    return {"quick": True}


def test_the_deadline_runs_from_the_moment_the_process_is_ready() -> None:
    """An interpreter that takes longer to start than the attempt's timeout
    does not time the attempt out."""
    clock = FakeClock()
    executor = ProcessExecutor(processes=1)
    context = _ThreadContext()
    executor._pool.context = context  # type: ignore[assignment]
    result: list[ExecutionOutcome] = []
    runner = threading.Thread(
        target=lambda: result.append(_run(executor, quick, timeout=1.0, clock=clock))
    )
    runner.start()
    assert context.started.wait(WAIT)
    clock.advance(5.0)  # the start-up took five times the timeout
    (process,) = context.processes
    process.release.set()
    runner.join(WAIT)
    assert result[0].kind is OutcomeKind.OK
    assert [dict(o.fields) for o in result[0].outputs] == [{"quick": True}]
    executor.close()
    process.thread.join(WAIT)


def test_a_process_that_does_not_start_fails_the_attempt_and_is_stopped() -> None:
    executor = ProcessExecutor(processes=1, start_timeout=0.2, join_timeout=0.0)
    context = _ThreadContext()
    executor._pool.context = context  # type: ignore[assignment]
    outcome = _run(executor, quick)
    (process,) = context.processes
    try:
        assert outcome.kind is OutcomeKind.ERROR
        assert str(outcome.error) == "plugin process did not start within 0.2s"
        assert process.signals[:1] == ["terminate"]
    finally:
        process.release.set()
        process.thread.join(WAIT)
        executor.close()


# --- the pool's bound and its shutdown ------------------------------------------------------


def test_close_stops_idle_and_busy_processes(tmp_path: Path) -> None:
    executor = ProcessExecutor(processes=2)
    idle = _pid(_run(executor, pid))
    file = tmp_path / "pid"
    signal_ = AttemptSignal()
    result: list[ExecutionOutcome] = []
    runner = threading.Thread(
        target=lambda: result.append(
            executor.execute(
                writes_pid_then_sleeps,
                TaskInputs(edges={}, parameters={"file": str(file)}),
                _ctx(signal_),
                timeout=None,
                signal=signal_,
                clock=SystemClock(),
            )
        )
    )
    runner.start()
    _until(lambda: _wrote(file), "the plugin to start")
    busy = int(file.read_text())
    executor.close()
    runner.join(WAIT)
    assert _gone(idle) and _gone(busy)
    assert result[0].kind is OutcomeKind.ERROR  # its process was stopped under it
    with pytest.raises(RuntimeError, match="closed"):
        _run(executor, pid)


def _fan_out() -> list[DagNode]:
    return [
        root("gen"),
        DagNode(
            slug="each",
            plugin="pid",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="items", source="gen"),),
            bindings={"n": EdgeSource(edge="items", field="n")},
        ),
    ]


def gen(inputs: TaskInputs, ctx: TaskContext) -> object:
    return [{"n": n} for n in range(8)]


def test_a_workers_processes_are_bounded_by_its_concurrency_and_stop_with_it(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    new_run(store, _fan_out(), "run")
    worker = Worker(
        store, {"gen": gen, "pid": pid}, concurrency=2, executor="process", execution_root=tmp_path
    )
    try:
        worker.run_until_idle()
    finally:
        worker.stop()
    assert store.get_run_status("run") is RunStatus.COMPLETED
    tasks = [t for t in store.list_tasks("run") if t.node_index == 1]
    assert len(tasks) == 8 and {t.status for t in tasks} == {TaskStatus.COMPLETED}
    outputs = store.resolve_outputs("run", store.get_output_ids("run", 1)).values()
    pids = {o.fields["pid"] for o in outputs}
    assert 1 <= len(pids) <= 2
    assert all(_gone(p) for p in pids if isinstance(p, int))
