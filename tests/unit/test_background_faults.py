"""The scheduler's and retention's passes say a store fault through the
worker's fault gate (one line, repeats throttled, no traceback), as the
worker's other loops do; an error that is not a store fault keeps its
traceback."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from dagwerk.backends.errors import StoreFullError
from dagwerk.backends.memory import MemoryStore
from dagwerk.runtime.clock import FakeClock
from dagwerk.runtime.faults import FaultGate
from dagwerk.runtime.retention import PeriodicRetention, RetentionPolicy
from dagwerk.runtime.worker import Worker
from dagwerk.scheduling.scheduler import Scheduler


def _full(*args: object, **kwargs: object) -> None:
    raise StoreFullError("commit failed: database or disk is full", target="/data/dagwerk.db")


def _passes(
    clock: FakeClock, gate: FaultGate, one_pass: Callable[[], object], count: int = 50
) -> None:
    """``count`` passes a second apart, as a loop would run them."""
    for _ in range(count):
        one_pass()
        gate.pause()  # what the actor's loop asks after each step
        clock.advance(1.0)


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.levelno >= logging.WARNING]


def _assert_one_throttled_fault(caplog: pytest.LogCaptureFixture, what: str) -> None:
    records = _lines(caplog)
    assert [record.name for record in records] == ["dagwerk.runtime.faults"] * 2, [
        record.getMessage() for record in records
    ]
    first, repeat = (record.getMessage() for record in records)
    assert first.startswith(f"{what} failed: commit failed: database or disk is full")
    assert "/data/dagwerk.db" in first and "free space" in first
    assert "more failures since the last report" in repeat
    assert all(record.exc_info is None for record in records)


def test_a_store_fault_of_a_scheduler_pass_is_one_throttled_line(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore()
    clock = FakeClock()
    gate = FaultGate(clock=clock)
    scheduler = Scheduler(store, clock=clock, holder="w1", faults=gate)
    monkeypatch.setattr(store, "list_schedules", _full)
    with caplog.at_level(logging.WARNING):
        _passes(clock, gate, scheduler.run_pass)
    _assert_one_throttled_fault(caplog, "the scheduler pass")
    report = scheduler.last_report
    assert report is not None and not report.ran and "StoreFullError" in report.errors[0]


def test_a_scheduler_error_that_is_no_store_fault_keeps_its_traceback(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore()
    gate = FaultGate(clock=FakeClock())
    scheduler = Scheduler(store, holder="w1", faults=gate)

    def bug() -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(store, "list_schedules", bug)
    with caplog.at_level(logging.WARNING):
        scheduler.run_pass()
    (record,) = _lines(caplog)
    assert record.name == "dagwerk.scheduling" and record.exc_info is not None
    assert gate.current is None


@pytest.mark.parametrize("method", ["delete_finished_runs", "try_acquire_lease"])
def test_a_store_fault_of_a_retention_pass_is_one_throttled_line(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    store = MemoryStore()
    clock = FakeClock()
    gate = FaultGate(clock=clock)
    retention = PeriodicRetention(
        store,
        RetentionPolicy("1d", interval=1.0),
        leases=store,
        clock=clock,
        holder="w1",
        faults=gate,
    )
    monkeypatch.setattr(store, method, _full)
    with caplog.at_level(logging.WARNING):
        _passes(clock, gate, retention.maybe_run)
    what = (
        "the retention pass" if method == "delete_finished_runs" else "taking the retention lease"
    )
    _assert_one_throttled_fault(caplog, what)


def test_the_worker_hands_its_gate_to_the_scheduler_and_retention(tmp_path: Path) -> None:
    worker = Worker(
        MemoryStore(), {}, execution_root=tmp_path, retention="30d", schedule_interval=1.0
    )
    scheduler = worker.background.scheduler
    assert scheduler is not None and scheduler.scheduler.faults is worker.faults
    assert worker.retention is not None and worker.retention.faults is worker.faults
