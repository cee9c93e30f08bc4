"""InlineRunner: a lone attempt's plugin on the calling (loop) thread, with
the semantics of a runner thread (W2)."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable

import pytest
from test_runtime_batch_exec import _job

from dagwerk.models import TaskInputs
from dagwerk.runtime._inline import InlineRunner
from dagwerk.runtime.actor import LoopHandedOver
from dagwerk.runtime.clock import FakeClock, SystemClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.executors import (
    AttemptJob,
    AttemptSignal,
    ExecutionOutcome,
    OutcomeKind,
)
from dagwerk.testing.waits import wait_until

WAIT = 10.0


def _never(outcome: ExecutionOutcome) -> None:
    raise AssertionError(f"handed over unexpectedly: {outcome}")


def _supervisors() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "dagwerk-inline" and t.is_alive())


class _Stuck:
    """Runs ``runner.run(job)`` on its own thread (the 'loop thread') and
    records how it ended: an outcome, or LoopHandedOver."""

    def __init__(self, runner: InlineRunner, job: AttemptJob) -> None:
        self.handed: list[ExecutionOutcome] = []
        self.handed_event = threading.Event()
        self.ended: list[object] = []
        self.thread = threading.Thread(target=self._run, args=(runner, job), daemon=True)
        self.thread.start()

    def _hand_over(self, outcome: ExecutionOutcome) -> None:
        self.handed.append(outcome)
        self.handed_event.set()

    def _run(self, runner: InlineRunner, job: AttemptJob) -> None:
        try:
            self.ended.append(runner.run(job, self._hand_over))
        except LoopHandedOver:
            self.ended.append(LoopHandedOver)


def test_the_plugin_runs_on_the_calling_thread_and_needs_no_other() -> None:
    threads: list[threading.Thread] = []

    def plugin(inputs: TaskInputs, ctx: TaskContext) -> object:
        threads.append(threading.current_thread())
        return {"ok": True}

    runner = InlineRunner(SystemClock())
    before = _supervisors()
    outcome = runner.run(_job(plugin, 0), _never)
    assert outcome.kind is OutcomeKind.OK and outcome.outputs[0].fields == {"ok": True}
    assert threads == [threading.current_thread()]
    # Neither a timeout nor an abort: no supervisor thread was woken or made.
    assert _supervisors() == before
    runner.stop()


def test_a_timeout_settles_first_then_aborts_and_hands_the_rest_over() -> None:
    clock = FakeClock()
    entered, release = threading.Event(), threading.Event()
    seen_abort: list[bool] = []

    def hang(inputs: TaskInputs, ctx: TaskContext) -> object:
        entered.set()
        release.wait(WAIT)  # ignores its abort
        seen_abort.append(ctx.cancelled.is_set())
        return {"late": True}

    runner = InlineRunner(clock)
    job = _job(hang, 0, timeout=5.0)
    stuck = _Stuck(runner, job)
    assert entered.wait(WAIT)
    assert clock.wait_for_waiters(1)  # the supervisor keeps the deadline
    clock.advance(4.9)
    assert not stuck.handed_event.wait(0.05)
    clock.advance(0.2)
    assert stuck.handed_event.wait(WAIT)
    (outcome,) = stuck.handed
    assert outcome.kind is OutcomeKind.TIMEOUT
    assert job.signal.abort.is_set() and job.signal.reason == "timeout 5.0s"
    assert stuck.ended == []  # the plugin still runs on its thread
    release.set()
    stuck.thread.join(WAIT)
    # Its late result is discarded: the thread leaves the loop instead.
    assert stuck.ended == [LoopHandedOver]
    assert seen_abort == [True]
    runner.stop()


def test_an_abort_while_running_settles_as_cancelled_and_hands_over() -> None:
    entered, release = threading.Event(), threading.Event()

    def hang(inputs: TaskInputs, ctx: TaskContext) -> object:
        entered.set()
        release.wait(WAIT)
        return {"late": True}

    runner = InlineRunner(SystemClock())
    job = _job(hang, 0)
    stuck = _Stuck(runner, job)
    assert entered.wait(WAIT)
    job.signal.fire("run is CANCELLED")
    assert stuck.handed_event.wait(WAIT)
    assert [o.kind for o in stuck.handed] == [OutcomeKind.CANCELLED]
    assert stuck.handed[0].detail == "run is CANCELLED"
    release.set()
    stuck.thread.join(WAIT)
    assert stuck.ended == [LoopHandedOver]
    runner.stop()


def test_a_result_before_the_deadline_wins_and_nothing_is_handed_over() -> None:
    clock = FakeClock()
    runner = InlineRunner(clock)
    outcome = runner.run(_job(lambda i, c: {"n": 1}, 0, timeout=5.0), _never)
    assert outcome.kind is OutcomeKind.OK
    clock.advance(10.0)  # the deadline passes with nothing in the supervisor's care
    runner.stop()
    wait_until(lambda: _supervisors() == 0, "the supervisor's end")


def test_a_pre_aborted_attempt_never_enters_its_plugin() -> None:
    called: list[int] = []
    job = _job(lambda i, c: called.append(1), 0)
    job.signal.fire("worker stopping")
    outcome = InlineRunner(SystemClock()).run(job, _never)
    assert outcome.kind is OutcomeKind.CANCELLED and outcome.detail == "worker stopping"
    assert called == []


def test_context_variables_set_by_one_plugin_are_not_seen_by_the_next() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[str] = []

    def plugin(inputs: TaskInputs, ctx: TaskContext) -> object:
        seen.append(var.get())
        var.set("set by a plugin")
        return None

    runner = InlineRunner(SystemClock())
    runner.run(_job(plugin, 0), _never)
    runner.run(_job(plugin, 0), _never)
    assert seen == ["unset", "unset"]
    assert var.get() == "unset"


def test_a_plugin_raising_system_exit_is_a_task_error_not_the_threads_end() -> None:
    def leave(inputs: TaskInputs, ctx: TaskContext) -> object:
        raise SystemExit(3)

    outcome = InlineRunner(SystemClock()).run(_job(leave, 0), _never)
    assert outcome.kind is OutcomeKind.ERROR
    assert isinstance(outcome.error, SystemExit)


class _FiresAsItBinds(AttemptSignal):
    """A signal aborted just as the runner binds to it (a cancellation racing
    the attempt's start), which waits until the supervisor has taken the
    attempt over before the runner goes on."""

    def __init__(self, taken: threading.Event) -> None:
        super().__init__()
        self._taken = taken

    def bind(self, listener: Callable[[str], object]) -> None:
        self.fire("run is CANCELLED")
        super().bind(listener)
        assert self._taken.wait(WAIT)


def test_an_attempt_taken_over_before_its_plugin_started_leaves_the_loop_to_the_new_thread() -> (
    None
):
    called: list[int] = []
    taken = threading.Event()
    handed: list[ExecutionOutcome] = []

    def hand_over(outcome: ExecutionOutcome) -> None:
        handed.append(outcome)
        taken.set()

    job = _job(lambda i, c: called.append(1), 0)
    job = AttemptJob(job.fn, job.inputs, job.ctx, None, _FiresAsItBinds(taken))
    runner = InlineRunner(SystemClock())
    with pytest.raises(LoopHandedOver):
        runner.run(job, hand_over)
    assert called == []  # never entered
    assert [o.kind for o in handed] == [OutcomeKind.CANCELLED]
    runner.stop()
