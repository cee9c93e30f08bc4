"""Ticks of cron expressions and intervals, pure: aliases, parsing limits and
the two daylight-saving rules in Europe/Berlin."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from dagwerk.scheduling.triggers import (
    CronTrigger,
    IntervalTrigger,
    ScheduleValueError,
    format_tick,
    parse_cron,
    parse_interval,
    parse_when,
    wall_to_tick,
)

BERLIN = ZoneInfo("Europe/Berlin")


def _local(tick: int) -> str:
    return format_tick(tick, BERLIN)


def test_aliases_and_fields() -> None:
    assert parse_cron("@hourly") == "0 * * * *"
    assert parse_cron("  @DAILY ") == "0 0 * * *"
    assert parse_cron("*/5  *  * * *") == "*/5 * * * *"
    with pytest.raises(ScheduleValueError, match="6 fields"):
        parse_cron("0 0 0 * * *")
    with pytest.raises(ScheduleValueError, match="not one of"):
        parse_cron("@reboot")


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("10m", 600), ("2h", 7_200), ("1d", 86_400),
                          ("1h30m", 5_400), ("45", 45), (90, 90)]
)  # fmt: skip
def test_intervals(text: str | int, seconds: int) -> None:
    assert parse_interval(text) == seconds


@pytest.mark.parametrize("text", ["0s", "1.5", "-3s", "2y", "", True, 400 * 86_400])
def test_bad_intervals(text: object) -> None:
    with pytest.raises(ScheduleValueError) as caught:
        parse_interval(text)
    assert caught.value.field == "every"


def test_a_skipped_wall_time_is_the_end_of_the_gap() -> None:
    tick = wall_to_tick(datetime(2026, 3, 29, 2, 30), BERLIN)
    assert _local(tick) == "2026-03-29T03:00:00+02:00"
    trigger = CronTrigger("30 2 * * *", BERLIN)
    start = datetime(2026, 3, 28, 12, tzinfo=BERLIN).timestamp()
    first = trigger.next_after(start)
    assert first is not None and _local(first) == "2026-03-29T03:00:00+02:00"
    second = trigger.next_after(first)
    assert second is not None and _local(second) == "2026-03-30T02:30:00+02:00"


def test_a_repeated_wall_time_fires_at_its_first_occurrence_only() -> None:
    trigger = CronTrigger("*/30 * * * *", BERLIN)
    start = datetime(2026, 10, 25, 1, 45, tzinfo=BERLIN).timestamp()
    ticks = trigger.newest(start, start + 4 * 3_600, 100)
    assert [_local(t)[11:] for t in ticks[:5]] == [
        "02:00:00+02:00", "02:30:00+02:00", "03:00:00+01:00", "03:30:00+01:00", "04:00:00+01:00",
    ]  # fmt: skip


def test_newest_ticks_after_a_long_gap_are_found_without_walking_it() -> None:
    trigger = CronTrigger("* * * * *", ZoneInfo("UTC"))
    ticks = trigger.newest(0, 1_767_225_600, 3)
    assert ticks == [1_767_225_480, 1_767_225_540, 1_767_225_600]
    assert IntervalTrigger(600, 0).newest(0, 1_800, 2) == [1_200, 1_800]
    assert IntervalTrigger(600, 30).next_after(630) == 1_230


def test_dates_and_times_in_a_zone() -> None:
    assert _local(parse_when("2026-01-31", BERLIN, "from")) == "2026-01-31T00:00:00+01:00"
    end = parse_when("2026-01-31", BERLIN, "to", end_of_day=True)
    assert _local(end) == "2026-01-31T23:59:59+01:00"
    assert parse_when("2026-01-31T06:00+00:00", BERLIN, "from") == 1_769_839_200
    with pytest.raises(ScheduleValueError) as caught:
        parse_when("soon", BERLIN, "from")
    assert caught.value.field == "from"
