"""Schedules through the Engine and the scheduler on memory, SQLite and
PostgreSQL, with a clock the test controls: exactly-once firing, catch-up,
overlap, daylight-saving time, pause, windows and backfills."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from dagwerk.constants import RUN_TERMINAL_STATUSES, RunStatus
from dagwerk.engine import Engine, IdempotencyConflictError, ScheduleNotFoundError
from dagwerk.runtime.clock import FakeClock
from dagwerk.scheduling import ScheduleValueError
from dagwerk.scheduling.scheduler import Scheduler
from dagwerk.testing.helpers import root

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def clock_engine(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Engine, FakeClock]]:
    clock = FakeClock(START)
    if request.param == "memory":
        engine = Engine("memory://", clock=clock.time)
    elif request.param == "sqlite":
        engine = Engine(f"sqlite:///{tmp_path / 'schedules.db'}", clock=clock.time)
    else:
        url = request.getfixturevalue("postgres_url")
        schema = request.getfixturevalue("pg_schema")
        engine = Engine(url, schema=schema, clock=clock.time, pool_size=4)
    engine.register_pipeline([root("a")], "p")
    yield engine, clock
    engine.close()


def _scheduled_for(engine: Engine, run_id: str) -> str:
    snapshot = engine.store.get_planning_snapshot(
        run_id, 0, {}, max_outputs_per_edge=1, max_outputs_total=1, max_routing_bytes=1 << 20
    )
    value = snapshot.runtime_inputs["scheduled_for"]
    assert isinstance(value, str)
    return value


def _ticks(engine: Engine, name: str) -> list[tuple[int, str | None]]:
    return sorted((f.tick, f.run_id) for f in engine.schedule_fires(name, limit=1_000))


def test_each_tick_becomes_one_run_whichever_scheduler_holds_the_lease(
    clock_engine: tuple[Engine, FakeClock],
) -> None:
    engine, clock = clock_engine
    engine.schedule("s", "p", every="10s", catchup="all")
    first = Scheduler(engine.store, clock=clock, holder="a", lease_seconds=30.0)
    second = Scheduler(engine.store, clock=clock, holder="b", lease_seconds=30.0)
    clock.advance(25)
    report = first.run_pass()
    assert report.ran and [f.tick - START for f in report.fired] == [10, 20]
    assert second.run_pass().ran is False  # a holds the lease
    assert first.run_pass().fired == ()  # an exact repeat fires nothing
    # a stops (dies): b takes over once the lease has expired.
    clock.advance(31)
    taken = second.run_pass()
    assert taken.ran and [f.tick - START for f in taken.fired] == [30, 40, 50]
    ticks = _ticks(engine, "s")
    assert [tick - START for tick, _ in ticks] == [10, 20, 30, 40, 50]
    run_ids = [run_id for _, run_id in ticks if run_id is not None]
    assert len(set(run_ids)) == 5
    runs = engine.list_runs(schedule="s")
    assert {r.run_id for r in runs} == set(run_ids)
    assert all(r.status is RunStatus.RUNNING and r.pipeline == "p" for r in runs)
    assert _scheduled_for(engine, run_ids[0]) == "2026-01-01T00:00:10+00:00"
    assert engine.run_schedule(run_ids[0]).schedule_name == "s"  # type: ignore[union-attr]


def test_a_scheduler_that_dies_after_the_commit_leaves_a_run_the_next_one_starts(
    clock_engine: tuple[Engine, FakeClock],
) -> None:
    engine, clock = clock_engine
    engine.schedule("s", "p", every="60s")

    def die(fire: object) -> None:
        raise SystemExit("killed between the tick's commit and the run's start")

    dying = Scheduler(engine.store, clock=clock, holder="a", lease_seconds=10.0, on_fire=die)
    clock.advance(61)
    with pytest.raises(SystemExit):
        dying.run_pass()
    ((tick, run_id),) = _ticks(engine, "s")
    assert run_id is not None and engine.get_run(run_id).status is RunStatus.PENDING  # type: ignore[union-attr]
    clock.advance(11)
    report = Scheduler(engine.store, clock=clock, holder="b").run_pass()
    assert report.started == (run_id,) and report.fired == ()
    assert engine.get_run(run_id).status is RunStatus.RUNNING  # type: ignore[union-attr]
    assert _ticks(engine, "s") == [(tick, run_id)]


@pytest.mark.parametrize(
    ("catchup", "expected"),
    [("skip", []), ("latest", [3600]), ("all", [1800, 2400, 3000, 3600])],
)
def test_catchup_after_downtime(
    clock_engine: tuple[Engine, FakeClock], catchup: str, expected: list[int]
) -> None:
    engine, clock = clock_engine
    engine.schedule("s", "p", every="10m", catchup=catchup, catchup_limit=4)
    scheduler = Scheduler(engine.store, clock=clock, holder="a")
    clock.advance(3_600 + 90)  # an hour and a half minute with nothing scheduling
    scheduler.run_pass()
    assert [tick - START for tick, _ in _ticks(engine, "s")] == expected
    # The missed ticks are dealt with: the next pass fires only the next tick.
    clock.advance(4_205 - 3_690)
    scheduler.run_pass()
    assert [tick - START for tick, _ in _ticks(engine, "s")][-1] == 4_200


def test_skip_fires_a_tick_that_is_due_now(clock_engine: tuple[Engine, FakeClock]) -> None:
    engine, clock = clock_engine
    engine.schedule("s", "p", every="10m")
    scheduler = Scheduler(engine.store, clock=clock, holder="a")
    clock.advance(605)
    scheduler.run_pass()
    assert [tick - START for tick, _ in _ticks(engine, "s")] == [600]


def test_overlap_skip_records_the_tick_without_a_run(
    clock_engine: tuple[Engine, FakeClock],
) -> None:
    engine, clock = clock_engine
    engine.schedule("s", "p", every="60s", overlap="skip")
    scheduler = Scheduler(engine.store, clock=clock, holder="a")
    clock.advance(61)
    scheduler.run_pass()
    clock.advance(60)
    scheduler.run_pass()
    (first, skipped) = _ticks(engine, "s")
    assert first[1] is not None and skipped[1] is None
    engine.cancel(first[1])
    clock.advance(60)
    scheduler.run_pass()
    assert _ticks(engine, "s")[-1][1] is not None  # the previous run finished: it runs


def test_overlap_allow_and_cancel_previous(clock_engine: tuple[Engine, FakeClock]) -> None:
    engine, clock = clock_engine
    engine.schedule("allow", "p", every="60s")
    engine.schedule("cancel", "p", every="60s", overlap="cancel_previous")
    scheduler = Scheduler(engine.store, clock=clock, holder="a")
    for _ in range(3):
        clock.advance(60)
        scheduler.run_pass()
    allowed = [engine.get_run(r).status for _, r in _ticks(engine, "allow")]  # type: ignore[arg-type,union-attr]
    assert allowed == [RunStatus.RUNNING] * 3
    cancelled = [engine.get_run(r).status for _, r in _ticks(engine, "cancel")]  # type: ignore[arg-type,union-attr]
    assert cancelled == [RunStatus.CANCELLED, RunStatus.CANCELLED, RunStatus.RUNNING]


def _walk(scheduler: Scheduler, clock: FakeClock, until: float, step: float) -> None:
    while clock.time() < until:
        clock.advance(step)
        scheduler.run_pass()


def _berlin(year: int, month: int, day: int, hour: int, minute: int) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=BERLIN).timestamp()


def test_dst_a_skipped_hour_fires_once_at_the_next_valid_time(
    clock_engine: tuple[Engine, FakeClock],
) -> None:
    engine, clock = clock_engine
    clock.advance(_berlin(2026, 3, 28, 23, 0) - clock.time())
    engine.schedule("nightly", "p", cron="30 2 * * *", timezone="Europe/Berlin")
    engine.schedule("quarter", "p", cron="*/15 * * * *", timezone="Europe/Berlin")
    scheduler = Scheduler(engine.store, clock=clock, holder="a")
    _walk(scheduler, clock, _berlin(2026, 3, 29, 4, 0), 300)
    nightly = [_scheduled_for(engine, r) for _, r in _ticks(engine, "nightly")]  # type: ignore[arg-type]
    assert nightly == ["2026-03-29T03:00:00+02:00"]
    quarter = [_scheduled_for(engine, r)[11:] for _, r in _ticks(engine, "quarter")]  # type: ignore[arg-type]
    # 02:00-02:45 do not exist that night: they fire once, at 03:00.
    assert quarter[quarter.index("01:45:00+01:00") :] == [
        "01:45:00+01:00",
        "03:00:00+02:00",
        "03:15:00+02:00",
        "03:30:00+02:00",
        "03:45:00+02:00",
        "04:00:00+02:00",
    ]


def test_dst_a_repeated_hour_fires_once(clock_engine: tuple[Engine, FakeClock]) -> None:
    engine, clock = clock_engine
    clock.advance(_berlin(2026, 10, 24, 23, 0) - clock.time())
    engine.schedule("nightly", "p", cron="30 2 * * *", timezone="Europe/Berlin")
    engine.schedule("hourly", "p", cron="@hourly", timezone="Europe/Berlin")
    scheduler = Scheduler(engine.store, clock=clock, holder="a")
    _walk(scheduler, clock, _berlin(2026, 10, 25, 4, 0) + 3_600, 300)
    nightly = [_scheduled_for(engine, r) for _, r in _ticks(engine, "nightly")]  # type: ignore[arg-type]
    assert nightly == ["2026-10-25T02:30:00+02:00"]
    hourly = [_scheduled_for(engine, r)[11:] for _, r in _ticks(engine, "hourly")]  # type: ignore[arg-type]
    assert hourly == [
        "00:00:00+02:00",
        "01:00:00+02:00",
        "02:00:00+02:00",
        "03:00:00+01:00",
        "04:00:00+01:00",
        "05:00:00+01:00",
    ]


def test_pause_resume_and_the_window(clock_engine: tuple[Engine, FakeClock]) -> None:
    engine, clock = clock_engine
    engine.schedule("s", "p", every="60s", catchup="all", start=START + 120, end=START + 600)
    scheduler = Scheduler(engine.store, clock=clock, holder="a")
    _walk(scheduler, clock, START + 240, 60)
    assert [t - START for t, _ in _ticks(engine, "s")] == [120, 180, 240]
    engine.pause_schedule("s")
    _walk(scheduler, clock, START + 420, 60)
    engine.resume_schedule("s")  # the pause's ticks never fire, even with catch-up all
    _walk(scheduler, clock, START + 900, 60)
    assert [t - START for t, _ in _ticks(engine, "s")] == [120, 180, 240, 480, 540, 600]
    assert engine.next_ticks("s", 3, after=START + 500) == [START + 540, START + 600]
    engine.delete_schedule("s")
    with pytest.raises(ScheduleNotFoundError):
        engine.get_schedule("s")


def test_bad_settings_are_refused_naming_the_field(clock_engine: tuple[Engine, FakeClock]) -> None:
    engine, _ = clock_engine
    cases = [
        ({"cron": "* * *"}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"every": "10 parsecs"}, "every"),
        ({"every": "10s", "timezone": "Mars/Olympus"}, "timezone"),
        ({"every": "10s", "catchup": "sometimes"}, "catchup"),
        ({"every": "10s", "overlap": "never"}, "overlap"),
        ({"every": "10s", "cron": "@daily"}, "cron"),
        ({"every": "10s", "start": "yesterday"}, "start"),
    ]
    for options, field in cases:
        with pytest.raises(ScheduleValueError) as caught:
            engine.schedule("bad", "p", **options)  # type: ignore[arg-type]
        assert caught.value.field == field, options
    assert engine.list_schedules() == []


def test_backfill_creates_each_tick_once_and_keeps_max_active(
    clock_engine: tuple[Engine, FakeClock],
) -> None:
    engine, _ = clock_engine
    engine.schedule("daily", "p", cron="0 6 * * *", timezone="Europe/Berlin")
    reports: list[object] = []
    seen_active: list[int] = []
    failures: list[BaseException] = []

    def run_backfill() -> None:
        try:
            reports.append(
                engine.backfill("daily", "2026-01-01", "2026-01-06", max_active=2, timeout=60)
            )
        except BaseException as exc:  # reported below
            failures.append(exc)

    thread = threading.Thread(target=run_backfill)
    thread.start()
    deadline = time.monotonic() + 60
    # Finish the runs as a worker would, watching that at most two are unfinished.
    while thread.is_alive() and time.monotonic() < deadline:
        unfinished = [
            r.run_id
            for r in engine.list_runs(schedule="daily", limit=100)
            if r.status not in RUN_TERMINAL_STATUSES
        ]
        seen_active.append(len(unfinished))
        if unfinished:
            engine.cancel(unfinished[0])
        time.sleep(0.01)  # a worker's pace; the loop above polls with a deadline
    thread.join(timeout=5)
    assert not failures
    assert max(seen_active) <= 2
    ticks = _ticks(engine, "daily")
    assert len(ticks) == 6 and len({r for _, r in ticks}) == 6
    assert _scheduled_for(engine, ticks[0][1]) == "2026-01-01T06:00:00+01:00"  # type: ignore[arg-type]
    # Running it again creates nothing twice.
    again = engine.backfill("daily", "2026-01-01", "2026-01-06", max_active=2, timeout=30)
    assert again.created == () and _ticks(engine, "daily") == ticks


def test_idempotent_submit(clock_engine: tuple[Engine, FakeClock]) -> None:
    engine, clock = clock_engine
    nodes = [root("a")]
    first = engine.submit(nodes, {"order": 1}, idempotency_key="order-1")
    assert engine.submit(nodes, {"order": 1}, idempotency_key="order-1") == first
    repeat = engine.submit_once(nodes, {"order": 1}, idempotency_key="order-1")
    assert (repeat.run_id, repeat.created) == (first, False)
    fresh = engine.submit_once(nodes, {"order": 9}, idempotency_key="order-9")
    assert fresh.created and fresh.run_id != first
    assert engine.get_run(first).status is RunStatus.RUNNING  # type: ignore[union-attr]
    with pytest.raises(IdempotencyConflictError) as caught:
        engine.submit(nodes, {"order": 2}, idempotency_key="order-1")
    assert caught.value.run_id == first and caught.value.field == "idempotency_key"
    assert len(engine.list_runs()) == 2
    clock.advance(86_400)  # the retention (24 h) is over: the key is free
    later = engine.submit(nodes, {"order": 2}, idempotency_key="order-1")
    assert later != first
