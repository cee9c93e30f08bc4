"""The fault gate (runtime/faults.py): classification by code, the capped
backoff, one log line per fault with throttled repeats, held settlements,
and the actor's loop pausing on a fault and ending on a fatal one."""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable

import pytest

from dagwerk.backends.errors import (
    SchemaTooNewError,
    StoreBusyError,
    StoreCannotOpenError,
    StoreCorruptError,
    StoreFullError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from dagwerk.constants import RunStatus
from dagwerk.runtime.actor import AdvancementActor
from dagwerk.runtime.clock import FakeClock
from dagwerk.runtime.faults import (
    BACKOFF_MAX,
    BACKOFF_MIN,
    FaultGate,
    FaultKind,
    FaultLastedError,
    classify,
    describe_fault,
)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (StoreFullError("full"), FaultKind.TRANSIENT),
        (StoreBusyError("busy"), FaultKind.TRANSIENT),
        (StoreReadOnlyError("ro"), FaultKind.TRANSIENT),
        (StoreUnavailableError("server gone"), FaultKind.TRANSIENT),
        (StoreCannotOpenError("denied"), FaultKind.FATAL),
        (SchemaTooNewError("newer"), FaultKind.FATAL),
        (StoreCorruptError("damaged"), FaultKind.FATAL),
        (RuntimeError("a bug"), None),
    ],
)
def test_store_errors_are_classified_by_code(error: Exception, kind: FaultKind | None) -> None:
    assert classify(error) is kind


def test_the_line_names_the_target_the_free_space_and_what_to_do(tmp_path: object) -> None:
    line = describe_fault(StoreFullError("commit failed: database or disk is full", target="/"))
    assert line.startswith("commit failed: database or disk is full: / (")
    assert "bytes free on /)" in line
    assert line.endswith("; free space and the run continues")
    assert "upgrade dagwerk" in describe_fault(SchemaTooNewError("version 99"))


def test_the_backoff_doubles_to_its_cap_and_a_clean_step_clears_the_fault() -> None:
    gate = FaultGate(clock=FakeClock())
    pauses = []
    for _ in range(10):
        assert gate.note(StoreFullError("full"), "a step")
        pauses.append(gate.pause())
    assert pauses[0] == BACKOFF_MIN
    assert pauses[1] == 2 * BACKOFF_MIN
    assert max(pauses) == BACKOFF_MAX == pauses[-1]
    fault = gate.current
    assert fault is not None and fault.failures == 10 and fault.code == "store_full"
    assert gate.pause() == 0.0  # a step that noted nothing
    assert gate.current is None
    gate.note(StoreFullError("full"), "a step")
    assert gate.pause() == BACKOFF_MIN  # the backoff starts over


def test_repeats_are_logged_once_per_interval_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    gate = FaultGate(clock=clock, log_interval=30.0)
    with caplog.at_level(logging.WARNING, logger="dagwerk.runtime.faults"):
        for _ in range(50):
            gate.note(StoreFullError("full", target="/data/db"), "committing")
            gate.pause()
            clock.advance(1.0)
        gate.pause()
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3, lines  # the first, one after 30 s, the clearing
    assert "29 more failures" in lines[1]
    assert "answers again" in lines[2]
    assert all(record.exc_info is None for record in caplog.records)


def test_the_traceback_is_logged_only_with_debug(caplog: pytest.LogCaptureFixture) -> None:
    gate = FaultGate(clock=FakeClock())
    logger = logging.getLogger("dagwerk.runtime.faults")
    with caplog.at_level(logging.DEBUG, logger="dagwerk.runtime.faults"):
        assert logger.isEnabledFor(logging.DEBUG)
        gate.note(StoreFullError("full"), "committing")
    assert caplog.records[0].exc_info is not None


def test_held_settlements_are_retried_in_order_until_the_store_answers() -> None:
    gate = FaultGate(clock=FakeClock())
    store_full = [True]
    done: list[str] = []

    def settle(name: str) -> None:
        if store_full[0]:
            raise StoreFullError("full")
        done.append(name)

    for name in ("a", "b"):
        retry = functools.partial(settle, name)
        assert gate.hold(StoreFullError("full"), "settling", retry, print)
    assert not gate.hold(RuntimeError("bug"), "settling", lambda: None, print)
    assert gate.parked == 2
    assert not gate.retry_parked()
    assert gate.parked == 2 and done == []
    store_full[0] = False
    assert gate.retry_parked()
    assert done == ["a", "b"] and gate.parked == 0


def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_the_actor_pauses_on_a_fault_and_ends_on_a_fatal_one() -> None:
    clock = FakeClock()
    gate = FaultGate(clock=clock)
    steps: list[int] = []
    fatal = threading.Event()

    def step() -> bool:
        steps.append(1)
        if len(steps) >= 3:
            fatal.set()
            raise SchemaTooNewError("schema version 99")
        raise StoreFullError("full")

    actor = AdvancementActor(
        step, lambda run_id: RunStatus.RUNNING, clock=clock, background=True, faults=gate
    )
    actor.start()
    try:
        assert clock.wait_for_waiters(1)
        assert len(steps) == 1  # paused after the failure, not spinning
        clock.advance(BACKOFF_MIN / 2)
        assert len(steps) == 1  # still within the pause
        clock.advance(BACKOFF_MIN / 2)
        _until(lambda: len(steps) == 2)
        # The pause doubled: the third step waits 2 x BACKOFF_MIN.
        _until(lambda: clock.waiters == 1)
        clock.advance(BACKOFF_MIN)
        time.sleep(0.05)  # a step would run now if the pause had not doubled
        assert len(steps) == 2
        clock.advance(BACKOFF_MIN)
        assert fatal.wait(10)
    finally:
        actor.stop(timeout=10)
    assert isinstance(gate.fatal, SchemaTooNewError)
    assert len(steps) == 3


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def test_wait_out_retries_a_transient_fault_with_the_backoff_until_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    gate = FaultGate(clock=clock)
    calls: list[float] = []

    def open_store() -> str:
        calls.append(clock.monotonic())
        if len(calls) < 4:
            raise StoreReadOnlyError("cannot open", target="/data/db")
        return "store"

    with caplog.at_level(logging.WARNING, logger="dagwerk.runtime.faults"):
        thread, outcome = _in_thread(lambda: gate.wait_out(open_store, "opening the database"))
        for done, pause in enumerate((BACKOFF_MIN, 2 * BACKOFF_MIN, 4 * BACKOFF_MIN), 1):
            _until(functools.partial(lambda n: len(calls) == n and clock.waiters == 1, done))
            clock.advance(pause)
        thread.join(10)
    assert outcome == ["store"]
    assert [round(b - a, 6) for a, b in itertools.pairwise(calls)] == [
        BACKOFF_MIN,
        2 * BACKOFF_MIN,
        4 * BACKOFF_MIN,
    ]
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines  # the fault once, its clearing once
    assert lines[0].startswith("opening the database failed: cannot open: /data/db")
    assert "answers again" in lines[1]
    assert gate.current is None


def test_wait_out_raises_a_fatal_fault_or_another_error_at_once() -> None:
    gate = FaultGate(clock=FakeClock())
    for error in (StoreCannotOpenError("denied"), SchemaTooNewError("newer"), KeyError("bug")):

        def fail(error: Exception = error) -> None:
            raise error

        with pytest.raises(type(error)):
            gate.wait_out(fail, "opening the database")
    assert gate.current is None


def test_wait_out_gives_up_once_the_fault_lasted_its_limit() -> None:
    clock = FakeClock()
    gate = FaultGate(clock=clock)

    def unavailable() -> None:
        raise StoreUnavailableError("connection refused", target="db.example:5432")

    thread, outcome = _in_thread(lambda: gate.wait_out(unavailable, "opening", limit=1.0))
    while thread.is_alive():
        if clock.wait_for_waiters(1, timeout=0.05):
            clock.advance(BACKOFF_MAX)  # each pause is cut to what the limit leaves
    (error,) = outcome
    assert isinstance(error, FaultLastedError), error
    assert error.field == "fail_on_fault"
    assert "connection refused" in str(error) and "at most 1s" in str(error)
