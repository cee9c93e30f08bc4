"""The advancement actor (AA-01..07)."""

from __future__ import annotations

import logging
import threading

import pytest

from dagwerk.constants import RunStatus
from dagwerk.runtime.actor import ActorState, AdvancementActor, LoopHandedOver
from dagwerk.runtime.clock import FakeClock
from dagwerk.runtime.errors import AdvancementWaitError, RunAdvancementStoppedError
from dagwerk.testing.waits import wait_until


class FakeRuns:
    """Run statuses plus a step that finishes one run per call when asked."""

    def __init__(self) -> None:
        self.status: dict[str, RunStatus] = {}
        self.steps = 0
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()
        self.to_finish: list[str] = []

    def read(self, run_id: str) -> RunStatus | None:
        return self.status.get(run_id)

    def step(self) -> bool:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.steps += 1
        try:
            if self.to_finish:
                self.status[self.to_finish.pop(0)] = RunStatus.COMPLETED
                return True
            return False
        finally:
            with self.lock:
                self.active -= 1


def _state(actor: AdvancementActor) -> ActorState:
    """The actor's state, read afresh (not narrowed by an earlier assert)."""
    return actor.state


def _waiter(
    actor: AdvancementActor, run_id: str, results: list[object], **kw: object
) -> threading.Thread:
    def body() -> None:
        try:
            results.append(actor.wait_for_run(run_id, **kw))  # type: ignore[arg-type]
        except AdvancementWaitError as exc:
            results.append(exc.code)

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def test_aa_01_many_observers_share_one_step_in_flight() -> None:
    runs = FakeRuns()
    ids = [f"r{i}" for i in range(8)]
    for run_id in ids:
        runs.status[run_id] = RunStatus.RUNNING
    runs.to_finish = list(ids)
    actor = AdvancementActor(runs.step, runs.read, background=True)
    results: list[object] = []
    threads = [_waiter(actor, run_id, results, timeout=30) for run_id in ids for _ in range(3)]
    actor.start()
    for thread in threads:
        thread.join(30)
    actor.stop()
    assert results == [RunStatus.COMPLETED] * 24
    assert runs.max_active == 1 and actor.max_steps_in_flight == 1


def test_aa_02_terminal_run_is_returned_without_a_step() -> None:
    runs = FakeRuns()
    runs.status["done"] = RunStatus.FAILED
    actor = AdvancementActor(runs.step, runs.read)
    actor.start()
    assert actor.wait_for_run("done", timeout=30) is RunStatus.FAILED
    actor.stop()
    assert runs.steps == 0


def test_aa_02_an_observer_arriving_while_others_settle_gets_no_step() -> None:
    # The loop settles a snapshot of observers; one that arrives meanwhile,
    # for a run that is already terminal, must be settled before any step,
    # not counted as demand for one.
    runs = FakeRuns()
    runs.status.update({"slow": RunStatus.COMPLETED, "done": RunStatus.FAILED})
    reading, release = threading.Event(), threading.Event()
    plain_read = runs.read

    def read(run_id: str) -> RunStatus | None:
        if run_id == "slow" and not release.is_set():
            reading.set()
            release.wait(30)
        return plain_read(run_id)

    actor = AdvancementActor(runs.step, read)
    results: list[object] = []
    slow = _waiter(actor, "slow", results, timeout=30)
    actor.start()
    assert reading.wait(30)  # the loop is settling a snapshot holding only "slow"
    done = _waiter(actor, "done", results, timeout=30)
    wait_until(lambda: len(actor._observers) == 2, "both observers waiting", timeout=30)
    release.set()
    slow.join(30)
    done.join(30)
    actor.stop()
    assert sorted(map(str, results)) == ["completed", "failed"]
    assert runs.steps == 0


def test_aa_03_abort_and_deadline_settle_only_that_observer() -> None:
    runs = FakeRuns()
    runs.status["r"] = RunStatus.RUNNING
    clock = FakeClock()
    actor = AdvancementActor(runs.step, runs.read, clock=clock, idle_backoff_max=1000)
    actor.start()
    abort = threading.Event()
    aborted: list[object] = []
    deadlined: list[object] = []
    patient: list[object] = []
    t1 = _waiter(actor, "r", aborted, abort=abort)
    t2 = _waiter(actor, "r", deadlined, timeout=5.0)
    t3 = _waiter(actor, "r", patient)
    abort.set()
    t1.join(30)
    assert aborted == ["runtime_advancement_wait_aborted"]
    assert clock.wait_for_waiters(3)  # the actor's backoff and two observers
    clock.advance(5.0)
    t2.join(30)
    assert deadlined == ["runtime_advancement_wait_deadline"]
    assert runs.status["r"] is RunStatus.RUNNING  # no observer cancelled the run
    runs.status["r"] = RunStatus.COMPLETED
    actor.notify()
    clock.advance(1000)
    t3.join(30)
    assert patient == [RunStatus.COMPLETED]
    actor.stop()
    # Already aborted or already past the deadline settles at once.
    fresh = AdvancementActor(runs.step, runs.read, clock=clock)
    pre = threading.Event()
    pre.set()
    with pytest.raises(AdvancementWaitError) as info:
        fresh.wait_for_run("r", abort=pre)
    assert info.value.code == "runtime_advancement_wait_aborted"
    with pytest.raises(AdvancementWaitError) as info:
        fresh.wait_for_run("r", timeout=0)
    assert info.value.code == "runtime_advancement_wait_deadline"


def test_aa_04_a_throwing_query_settles_only_that_runs_observers() -> None:
    runs = FakeRuns()
    runs.status["ok"] = RunStatus.RUNNING

    def read(run_id: str) -> RunStatus | None:
        if run_id == "broken":
            raise OSError("disk gone")
        return runs.read(run_id)

    actor = AdvancementActor(runs.step, read, background=True)
    broken: list[object] = []
    fine: list[object] = []
    t1 = _waiter(actor, "broken", broken, timeout=30)
    t2 = _waiter(actor, "ok", fine, timeout=30)
    actor.start()
    t1.join(30)
    assert broken == ["runtime_advancement_query_throw"]
    runs.to_finish.append("ok")
    t2.join(30)
    actor.stop()
    assert fine == [RunStatus.COMPLETED]


def test_aa_05_a_throwing_step_is_logged_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    runs = FakeRuns()
    runs.status["r"] = RunStatus.RUNNING
    calls: list[int] = []

    def step() -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("queue down")
        if runs.to_finish:
            return runs.step()
        runs.to_finish.append("r")
        return True

    actor = AdvancementActor(step, runs.read, error_backoff=0.001)
    with caplog.at_level(logging.ERROR, logger="dagwerk.runtime.actor"):
        actor.start()
        assert actor.wait_for_run("r", timeout=30) is RunStatus.COMPLETED
        actor.stop()
    assert len(calls) >= 3
    assert "Worker step threw during run advancement." in caplog.text


def test_aa_07_lifecycle_is_terminal_and_stop_waits_only_for_the_step_in_flight() -> None:
    runs = FakeRuns()
    runs.status["r"] = RunStatus.RUNNING
    in_step = threading.Event()
    release = threading.Event()

    def step() -> bool:
        in_step.set()
        release.wait(30)
        return False

    actor = AdvancementActor(step, runs.read, background=True)
    actor.start()
    actor.start()
    assert actor.state is ActorState.RUNNING
    waiting: list[object] = []
    waiter = _waiter(actor, "r", waiting)
    assert in_step.wait(30)
    stopper = threading.Thread(target=actor.stop)
    stopper.start()
    waiter.join(30)
    # Observers are settled at once, while the step is still in flight.
    assert waiting == ["runtime_advancement_stopped"]
    assert stopper.is_alive()
    with pytest.raises(AdvancementWaitError):
        actor.wait_for_run("r")
    release.set()
    stopper.join(30)
    assert _state(actor) is ActorState.STOPPED
    actor.stop()  # idempotent
    with pytest.raises(RunAdvancementStoppedError):
        actor.start()
    assert runs.status["r"] is RunStatus.RUNNING  # stop persisted nothing


def test_a_step_that_waited_for_work_is_its_own_backoff() -> None:
    """An idle worker's step is a long poll; the actor looks again at once
    instead of sleeping on top of it (no delay for work arriving then)."""
    clock = FakeClock()
    runs = FakeRuns()
    runs.status["r"] = RunStatus.RUNNING
    calls: list[int] = []
    pause = threading.Event()

    def long_poll() -> bool:
        calls.append(1)
        pause.wait(0.02)  # the queue's wait for work, in real time
        return False

    actor = AdvancementActor(
        long_poll, runs.read, clock=clock, idle_backoff_min=60, step_waits=0.01
    )
    actor.start()
    results: list[object] = []
    waiter = _waiter(actor, "r", results)
    try:
        # The fake clock never moves: only steps without a backoff sleep repeat.
        wait_until(lambda: len(calls) >= 3, "repeated steps")
    finally:
        actor.stop()
        waiter.join(30)


def test_a_step_that_returned_at_once_still_backs_off() -> None:
    clock = FakeClock()
    runs = FakeRuns()
    runs.status["r"] = RunStatus.RUNNING
    calls: list[int] = []

    def quick() -> bool:
        calls.append(1)
        return False

    actor = AdvancementActor(quick, runs.read, clock=clock, idle_backoff_min=60, step_waits=5.0)
    results: list[object] = []
    # The observer is parked before the loop starts, so its wake is set before
    # the loop's first look and cannot cut the backoff sleep after the step.
    waiter = _waiter(actor, "r", results)
    try:
        assert clock.wait_for_waiters(1), "the observer never parked"
        actor.start()
        # The observer and, after one step, the actor's backoff sleep wait
        # on the fake clock, which never moves.
        wait_until(lambda: bool(calls) and clock.waiters >= 2, "the backoff sleep")
        assert len(calls) == 1
    finally:
        actor.stop()
        waiter.join(30)


def test_a_stuck_step_handed_over_goes_on_in_a_new_thread_and_the_old_one_leaves() -> None:
    """hand_over: the rest of the step in flight runs on a new loop thread,
    the loop goes on there, and the stuck thread, once free, leaves the loop
    (LoopHandedOver) without touching its state; still one step in flight."""
    stuck, release = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    rests: list[threading.Thread] = []
    escaped: list[BaseException] = []

    def step() -> bool:
        threads.append(threading.current_thread())
        if len(threads) == 1:
            stuck.set()
            release.wait(30)
            raise LoopHandedOver
        return False

    def rest() -> bool:
        rests.append(threading.current_thread())
        return True

    previous_hook = threading.excepthook
    threading.excepthook = lambda args: escaped.append(args.exc_value)  # type: ignore[arg-type]
    actor = AdvancementActor(
        step, FakeRuns().read, background=True, idle_backoff_min=0.001, idle_backoff_max=0.005
    )
    try:
        actor.start()
        assert stuck.wait(30)
        first = threads[0]
        assert actor.in_loop_thread() is False
        actor.hand_over(rest)
        wait_until(lambda: len(threads) >= 3, "steps on the new loop thread")
        assert rests and rests[0] is not first
        assert all(t is rests[0] for t in threads[1:])
        assert actor.max_steps_in_flight == 1
        release.set()
        first.join(30)
        assert not first.is_alive()
        assert actor.state is ActorState.RUNNING  # the old thread left quietly
        assert escaped == []
        wait_until(lambda: len(threads) >= 5, "the loop still goes on")
    finally:
        release.set()
        actor.stop(30)
        threading.excepthook = previous_hook
    assert _state(actor) is ActorState.STOPPED
    wait_until(lambda: not rests[0].is_alive(), "the loop thread's end")
    assert actor.steps_in_flight == 0


def test_stop_waits_for_the_loop_wherever_it_was_handed() -> None:
    stuck, release, in_rest, finish_rest = (threading.Event() for _ in range(4))

    def step() -> bool:
        stuck.set()
        release.wait(30)
        raise LoopHandedOver

    def rest() -> bool:
        in_rest.set()
        finish_rest.wait(30)
        return True

    actor = AdvancementActor(step, FakeRuns().read, background=True)
    actor.start()
    try:
        assert stuck.wait(30)
        actor.hand_over(rest)
        assert in_rest.wait(30)
        stopper = threading.Thread(target=actor.stop)
        stopper.start()
        stopper.join(0.05)
        assert stopper.is_alive()  # the handed-over step is still in flight
        finish_rest.set()
        stopper.join(30)
        assert not stopper.is_alive()
        assert actor.state is ActorState.STOPPED
    finally:
        release.set()
        finish_rest.set()
