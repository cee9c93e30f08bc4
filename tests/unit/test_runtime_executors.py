"""Executors: outcome conventions, deadlines and abort (WK-10, WK-16)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from dagwerk.models import ResolvedOutput, TaskInputs
from dagwerk.runtime.clock import Clock, FakeClock, SystemClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.executors import (
    AsyncExecutor,
    AttemptJob,
    AttemptSignal,
    ExecutionOutcome,
    Executor,
    OutcomeKind,
    ProcessExecutor,
    ThreadExecutor,
    make_executor,
)
from dagwerk.runtime.plugins import PluginFn


def _inputs() -> TaskInputs:
    return TaskInputs(
        edges={"e": (ResolvedOutput(id="o1", fields={"n": 2}, data={"blob": [1, 2]}),)},
        parameters={"k": "v"},
    )


def _ctx(signal: AttemptSignal) -> TaskContext:
    return TaskContext(
        run_id="r",
        task_id="task-1",
        node_index=0,
        generation=0,
        attempt_id="a1",
        attempt=1,
        plugin="p",
        execution_root=Path("/tmp"),
        cancelled=signal.abort,
    )


def _run(
    executor: Executor, fn: PluginFn, *, timeout: float | None = None, clock: Clock | None = None
) -> ExecutionOutcome:
    signal = AttemptSignal()
    return executor.execute(
        fn, _inputs(), _ctx(signal), timeout=timeout, signal=signal, clock=clock or SystemClock()
    )


# Module-level plugins, so the process executor's spawned child can import them.


def double(inputs: TaskInputs, ctx: TaskContext) -> object:
    (out,) = inputs.edges["e"]
    return {"n": int(str(out.fields["n"])) * 2, "k": inputs.parameters["k"]}


async def async_double(inputs: TaskInputs, ctx: TaskContext) -> object:
    await asyncio.sleep(0)
    return double(inputs, ctx)


def boom(inputs: TaskInputs, ctx: TaskContext) -> object:
    raise KeyError("missing thing")


def waits(inputs: TaskInputs, ctx: TaskContext) -> object:
    ctx.wait("approval")
    return None


def sleeps_forever(inputs: TaskInputs, ctx: TaskContext) -> object:
    # A plugin that ignores its abort signal: only a hard stop ends it.
    time.sleep(60)
    return {"late": True}


def writes_pid_then_sleeps(inputs: TaskInputs, ctx: TaskContext) -> object:
    Path(str(inputs.parameters["k"])).write_text(str(os.getpid()))
    time.sleep(60)
    return None


EXECUTORS = [ThreadExecutor(), AsyncExecutor(), ProcessExecutor()]


@pytest.mark.parametrize("executor", EXECUTORS, ids=["thread", "async", "process"])
def test_result_error_and_wait_outcomes(executor: Executor) -> None:
    ok = _run(executor, double)
    assert ok.kind is OutcomeKind.OK
    assert [dict(o.fields) for o in ok.outputs] == [{"n": 4, "k": "v"}]
    assert ok.outputs[0].id == "task-1/0"
    err = _run(executor, boom)
    assert err.kind is OutcomeKind.ERROR and isinstance(err.error, KeyError)
    wait = _run(executor, waits)
    assert wait.kind is OutcomeKind.WAIT and wait.wait_id == "approval"
    assert _run(executor, async_double).outputs == ok.outputs


def exits(inputs: TaskInputs, ctx: TaskContext) -> object:
    raise SystemExit(3)


@pytest.mark.parametrize("executor", EXECUTORS, ids=["thread", "async", "process"])
def test_a_plugin_raising_system_exit_fails_its_attempt(executor: Executor) -> None:
    # It once ended the plugin's thread with the attempt unsettled: the
    # attempt then waited for its deadline (or forever without one).
    outcome = _run(executor, exits, timeout=20.0)
    assert outcome.kind is OutcomeKind.ERROR
    assert isinstance(outcome.error, SystemExit) or "SystemExit" in str(outcome.error)


def test_a_plugin_raising_system_exit_fails_only_its_attempt_in_a_batch() -> None:
    jobs = []
    for fn in (exits, double):
        signal = AttemptSignal()
        jobs.append(AttemptJob(fn, _inputs(), _ctx(signal), 20.0, signal))
    outcomes = ThreadExecutor().execute_many(jobs, clock=SystemClock())
    assert [o.kind for o in outcomes] == [OutcomeKind.ERROR, OutcomeKind.OK]


@pytest.mark.parametrize("executor", EXECUTORS, ids=["thread", "async", "process"])
def test_wk_10_pre_aborted_attempt_never_enters_the_plugin(executor: Executor) -> None:
    entered = threading.Event()
    signal = AttemptSignal()
    signal.fire("run cancelled")

    def plugin(inputs: TaskInputs, ctx: TaskContext) -> object:
        entered.set()
        return None

    outcome = executor.execute(
        plugin, _inputs(), _ctx(signal), timeout=None, signal=signal, clock=SystemClock()
    )
    assert outcome.kind is OutcomeKind.CANCELLED and outcome.detail == "run cancelled"
    assert not entered.is_set()


def test_wk_10_thread_timeout_settles_first_then_aborts_and_discards_late_result() -> None:
    clock = FakeClock()
    release = threading.Event()
    saw_abort_before_release: list[bool] = []
    finished = threading.Event()

    def stubborn(inputs: TaskInputs, ctx: TaskContext) -> object:
        release.wait(10)
        saw_abort_before_release.append(ctx.cancelled.is_set())
        finished.set()
        return {"late": True}

    signal = AttemptSignal()
    result: list[ExecutionOutcome] = []
    runner = threading.Thread(
        target=lambda: result.append(
            ThreadExecutor().execute(
                stubborn, _inputs(), _ctx(signal), timeout=5.0, signal=signal, clock=clock
            )
        )
    )
    runner.start()
    assert clock.wait_for_waiters(1)
    clock.advance(5.0)
    runner.join(10)
    assert result[0].kind is OutcomeKind.TIMEOUT
    assert signal.abort.is_set()  # fired before the caller resumed
    # The plugin ignored the signal and kept running; its late result changes nothing.
    release.set()
    assert finished.wait(10)
    assert saw_abort_before_release == [True]
    assert result[0].kind is OutcomeKind.TIMEOUT and result[0].outputs == ()


def test_abort_during_execution_settles_as_cancelled() -> None:
    clock = FakeClock()
    started = threading.Event()

    def cooperative(inputs: TaskInputs, ctx: TaskContext) -> object:
        started.set()
        ctx.cancelled.wait(10)
        ctx.check_cancelled()
        return {"never": True}

    signal = AttemptSignal()
    result: list[ExecutionOutcome] = []
    runner = threading.Thread(
        target=lambda: result.append(
            ThreadExecutor().execute(
                cooperative, _inputs(), _ctx(signal), timeout=None, signal=signal, clock=clock
            )
        )
    )
    runner.start()
    assert started.wait(10)
    signal.fire("run cancelled")
    runner.join(10)
    assert result[0].kind is OutcomeKind.CANCELLED and result[0].outputs == ()


def test_async_executor_cancels_the_coroutine_on_timeout() -> None:
    clock = FakeClock()
    cancelled = threading.Event()

    async def slow(inputs: TaskInputs, ctx: TaskContext) -> object:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return None

    signal = AttemptSignal()
    result: list[ExecutionOutcome] = []
    runner = threading.Thread(
        target=lambda: result.append(
            AsyncExecutor().execute(
                slow, _inputs(), _ctx(signal), timeout=1.0, signal=signal, clock=clock
            )
        )
    )
    runner.start()
    assert clock.wait_for_waiters(1)
    clock.advance(1.0)
    runner.join(10)
    assert result[0].kind is OutcomeKind.TIMEOUT
    assert cancelled.wait(10)


def test_wk_16_process_timeout_terminates_and_joins_the_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    signal = AttemptSignal()
    inputs = TaskInputs(edges={}, parameters={"k": str(pid_file)})
    # A real deadline: the child is a separate process and cannot see a fake clock.
    outcome = ProcessExecutor().execute(
        writes_pid_then_sleeps,
        inputs,
        _ctx(signal),
        timeout=3.0,
        signal=signal,
        clock=SystemClock(),
    )
    assert outcome.kind is OutcomeKind.TIMEOUT and outcome.retryable
    assert signal.abort.is_set()
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # joined: the child is gone, not a zombie
        os.kill(pid, 0)


def test_process_abort_is_a_hard_stop() -> None:
    signal = AttemptSignal()
    result: list[ExecutionOutcome] = []
    runner = threading.Thread(
        target=lambda: result.append(
            ProcessExecutor().execute(
                sleeps_forever,
                _inputs(),
                _ctx(signal),
                timeout=None,
                signal=signal,
                clock=SystemClock(),
            )
        )
    )
    runner.start()
    signal.fire("run cancelled")
    runner.join(30)
    assert not runner.is_alive()
    assert result[0].kind is OutcomeKind.CANCELLED


def test_make_executor_names() -> None:
    assert isinstance(make_executor("thread"), ThreadExecutor)
    assert isinstance(make_executor("process"), ProcessExecutor)
    assert isinstance(make_executor("async"), AsyncExecutor)
    custom = ThreadExecutor()
    assert make_executor(custom) is custom
    with pytest.raises(ValueError):
        make_executor("fibre")
