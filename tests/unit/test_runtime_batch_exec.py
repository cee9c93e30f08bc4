"""ThreadExecutor.execute_many: a batch of attempts on as few threads as it
needs, with the semantics of one thread per attempt."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dagwerk.models import TaskInputs
from dagwerk.runtime import _batch_exec
from dagwerk.runtime.clock import FakeClock, SystemClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.executors import (
    AttemptJob,
    AttemptSignal,
    ExecutionOutcome,
    OutcomeKind,
    ThreadExecutor,
)
from dagwerk.runtime.plugins import PluginFn

WAIT = 10.0


def _job(fn: PluginFn, n: int, timeout: float | None = None) -> AttemptJob:
    signal = AttemptSignal()
    ctx = TaskContext(
        run_id="r",
        task_id=f"t{n}",
        node_index=0,
        generation=0,
        attempt_id=f"a{n}",
        attempt=1,
        plugin="p",
        execution_root=Path("/tmp"),
        cancelled=signal.abort,
    )
    return AttemptJob(fn, TaskInputs(edges={}, parameters={"n": n}), ctx, timeout, signal)


def test_slow_attempts_fan_out_until_all_run_at_once() -> None:
    # Each plugin returns only once all of them are inside their plugins: the
    # batch finishes only if every attempt got its own thread.
    count = 6
    barrier = threading.Barrier(count, timeout=WAIT)

    def meet(inputs: TaskInputs, ctx: TaskContext) -> object:
        barrier.wait()
        return {"n": inputs.parameters["n"]}

    outcomes = ThreadExecutor().execute_many(
        [_job(meet, n) for n in range(count)], clock=SystemClock()
    )
    assert [o.kind for o in outcomes] == [OutcomeKind.OK] * count
    assert [o.outputs[0].fields["n"] for o in outcomes] == list(range(count))


def test_a_hung_attempt_times_out_and_the_queue_moves_on() -> None:
    release = threading.Event()
    ran: list[int] = []

    def hang(inputs: TaskInputs, ctx: TaskContext) -> object:
        release.wait(WAIT)
        return {"late": True}

    def quick(inputs: TaskInputs, ctx: TaskContext) -> object:
        ran.append(int(str(inputs.parameters["n"])))
        return None

    jobs = [_job(hang, 0, timeout=0.05)] + [_job(quick, n) for n in range(1, 5)]
    outcomes = ThreadExecutor().execute_many(jobs, clock=SystemClock())
    release.set()
    assert outcomes[0].kind is OutcomeKind.TIMEOUT
    assert jobs[0].signal.abort.is_set()  # aborted at once, not after the batch
    assert [o.kind for o in outcomes[1:]] == [OutcomeKind.OK] * 4
    assert sorted(ran) == [1, 2, 3, 4]


def test_a_timed_out_attempt_keeps_its_timeout_outcome_when_its_result_arrives() -> None:
    clock = FakeClock()
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def slow(inputs: TaskInputs, ctx: TaskContext) -> object:
        entered.set()
        release.wait(WAIT)
        returned.set()
        return {"late": True}

    jobs = [_job(slow, 0, timeout=5.0)]
    result: list[object] = []
    runner = threading.Thread(
        target=lambda: result.extend(ThreadExecutor().execute_many(jobs, clock=clock))
    )
    runner.start()
    assert entered.wait(WAIT)
    assert clock.wait_for_waiters(1, WAIT)
    clock.advance(5.0)
    runner.join(WAIT)
    assert not runner.is_alive()
    release.set()
    assert returned.wait(WAIT)
    (outcome,) = result
    assert outcome.kind is OutcomeKind.TIMEOUT  # type: ignore[attr-defined]


def test_an_attempt_aborted_before_it_starts_never_enters_its_plugin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No second runner: the second attempt waits in the queue behind the first.
    monkeypatch.setattr(_batch_exec, "RAMP_SECONDS", 3600.0)
    entered: list[int] = []
    gate = threading.Event()

    def first(inputs: TaskInputs, ctx: TaskContext) -> object:
        jobs[1].signal.fire("run is cancelled")  # the next one is still queued
        gate.set()
        return None

    def second(inputs: TaskInputs, ctx: TaskContext) -> object:
        entered.append(1)
        return None

    jobs = [_job(first, 0), _job(second, 1)]
    outcomes = ThreadExecutor().execute_many(jobs, clock=SystemClock())
    assert gate.is_set()
    assert outcomes[0].kind is OutcomeKind.OK
    assert outcomes[1].kind is OutcomeKind.CANCELLED
    assert entered == []


def test_a_pre_aborted_batch_runs_nothing() -> None:
    entered: list[int] = []
    jobs = [_job(lambda i, c: entered.append(1), n) for n in range(3)]
    for job in jobs:
        job.signal.fire("worker stopping")
    outcomes = ThreadExecutor().execute_many(jobs, clock=SystemClock())
    assert [o.kind for o in outcomes] == [OutcomeKind.CANCELLED] * 3
    assert entered == []


def test_results_returned_while_one_attempt_blocks_are_flushed_before_it_ends() -> None:
    release = threading.Event()
    flushed: list[list[int]] = []
    flushed_before_release = threading.Event()

    def block(inputs: TaskInputs, ctx: TaskContext) -> object:
        # Returns once the quick ones were flushed (or, failing that, after WAIT).
        flushed_before_release.wait(WAIT)
        release.wait(WAIT)
        return {"slow": True}

    def quick(inputs: TaskInputs, ctx: TaskContext) -> object:
        return {"n": inputs.parameters["n"]}

    def flush(returned: list[tuple[int, ExecutionOutcome]]) -> None:
        flushed.append([index for index, _ in returned])
        if sorted(i for group in flushed for i in group) == [1, 2, 3, 4]:
            flushed_before_release.set()
            release.set()

    jobs = [_job(block, 0)] + [_job(quick, n) for n in range(1, 5)]
    outcomes = ThreadExecutor().execute_many(jobs, clock=SystemClock(), flush=flush)
    assert flushed_before_release.is_set()  # flushed while the blocking one ran
    assert sorted(i for group in flushed for i in group) == [1, 2, 3, 4]  # each once
    assert [o.kind for o in outcomes] == [OutcomeKind.OK] * 5  # flushed ones included


def test_a_batch_that_returns_together_is_not_flushed() -> None:
    flushed: list[object] = []

    def quick(inputs: TaskInputs, ctx: TaskContext) -> object:
        return {"n": inputs.parameters["n"]}

    outcomes = ThreadExecutor().execute_many(
        [_job(quick, n) for n in range(8)], clock=SystemClock(), flush=flushed.append
    )
    # Trivial attempts end well within FLUSH_SECONDS of each other: one group.
    assert _batch_exec.FLUSH_SECONDS >= 0.005
    assert flushed == []
    assert [o.kind for o in outcomes] == [OutcomeKind.OK] * 8
