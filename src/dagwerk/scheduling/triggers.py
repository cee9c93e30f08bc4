"""When a schedule fires: cron expressions and fixed intervals, as epoch ticks.

A tick is a whole second since the epoch. Cron expressions are parsed and
iterated by :mod:`cronsim` over the schedule's *wall clock* (naive local
times), and each wall time becomes an instant here, with one rule for the
two daylight-saving cases:

* a wall time that does not exist (the hour skipped when clocks go forward)
  fires at the first instant after the gap, and ticks that land on the same
  instant fire once;
* a wall time that exists twice (the hour repeated when clocks go back)
  fires at its first occurrence only.

So every wall time a cron expression names fires exactly once. A fixed
interval counts elapsed seconds from its anchor and ignores the zone.
Pure: no I/O beyond reading the zone database, no threads.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Final, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from dagwerk.errors import DagwerkError

__all__ = [
    "CRON_ALIASES",
    "MAX_INTERVAL_SECONDS",
    "CronTrigger",
    "IntervalTrigger",
    "ScheduleValueError",
    "Trigger",
    "format_tick",
    "load_zone",
    "parse_cron",
    "parse_interval",
    "parse_when",
]

CRON_ALIASES: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""The ``@name`` shorthands a cron expression may be, and what each means."""

MAX_INTERVAL_SECONDS: Final = 366 * 86_400
"""The longest fixed interval (a year); a longer one is a cron expression's job."""

MAX_CRON_LENGTH: Final = 256

_UNITS: Final = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}
_INTERVAL: Final = re.compile(r"^(?:\d+[smhd])+$")
_INTERVAL_PART: Final = re.compile(r"(\d+)([smhd])")
# DST and other offset changes shift wall time by at most a few hours; a
# search for the next tick starts this far before the instant's wall time.
_SHIFT: Final = timedelta(hours=3)
_FIRST_WINDOW: Final = 2 * 86_400


class ScheduleValueError(DagwerkError, ValueError):
    """A schedule setting that is not valid; ``field`` names it."""

    code = "schedule_invalid"


class Trigger(Protocol):
    """The ticks of a schedule."""

    def next_after(self, after: float) -> int | None:
        """The first tick strictly after ``after``; ``None`` if there is none."""
        ...

    def newest(self, after: float, until: float, limit: int) -> list[int]:
        """The newest ``limit`` ticks in ``(after, until]``, oldest first."""
        ...


def load_zone(name: object) -> ZoneInfo:
    """The IANA time zone ``name`` (``Europe/Berlin``, ``UTC``)."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise ScheduleValueError(
            f"timezone must be an IANA zone name such as 'Europe/Berlin', got {name!r}",
            field="timezone",
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleValueError(
            f"timezone {name!r} is not a known IANA time zone (such as 'Europe/Berlin' or 'UTC')",
            field="timezone",
        ) from None


def parse_cron(expression: object) -> str:
    """A 5-field cron expression or an alias (``@hourly``), normalised to 5 fields."""
    if not isinstance(expression, str) or not expression.strip():
        raise ScheduleValueError("cron must be a non-empty string", field="cron")
    if len(expression) > MAX_CRON_LENGTH:
        raise ScheduleValueError(
            f"cron is {len(expression)} characters; maximum is {MAX_CRON_LENGTH}",
            field="cron",
            limit=MAX_CRON_LENGTH,
        )
    text = " ".join(expression.split())
    if text.startswith("@"):
        alias = CRON_ALIASES.get(text.lower())
        if alias is None:
            raise ScheduleValueError(
                f"cron alias {text!r} is not one of {', '.join(sorted(CRON_ALIASES))}",
                field="cron",
            )
        return alias
    fields = text.split(" ")
    if len(fields) != 5:
        raise ScheduleValueError(
            f"cron {text!r} has {len(fields)} fields; it needs 5 "
            "(minute hour day-of-month month day-of-week)",
            field="cron",
        )
    try:
        CronSim(text, datetime(2000, 1, 1))
    except CronSimError as error:
        raise ScheduleValueError(f"cron {text!r} is not valid: {error}", field="cron") from None
    return text


def parse_interval(value: object) -> int:
    """A fixed interval in whole seconds: ``30s``, ``10m``, ``2h``, ``1d``, ``1h30m``,
    or a number of seconds."""
    if isinstance(value, bool):
        raise ScheduleValueError(f"every must be a duration, got {value!r}", field="every")
    seconds: float
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip().isdigit():
        seconds = float(value.strip())
    elif isinstance(value, str) and _INTERVAL.match(value.strip().lower()):
        seconds = float(
            sum(int(n) * _UNITS[unit] for n, unit in _INTERVAL_PART.findall(value.strip().lower()))
        )
    else:
        raise ScheduleValueError(
            f"every must be a duration such as 30s, 10m, 2h or 1d, got {value!r}", field="every"
        )
    if not math.isfinite(seconds) or seconds != int(seconds) or seconds < 1:
        raise ScheduleValueError(
            f"every must be a whole number of seconds >= 1, got {value!r}", field="every"
        )
    if seconds > MAX_INTERVAL_SECONDS:
        raise ScheduleValueError(
            f"every is {int(seconds)}s; maximum is {MAX_INTERVAL_SECONDS}s (a year)",
            field="every",
            limit=MAX_INTERVAL_SECONDS,
        )
    return int(seconds)


def parse_when(value: object, zone: tzinfo, field: str, *, end_of_day: bool = False) -> int:
    """An instant as a whole epoch second: an epoch number, a ``datetime`` or ISO
    8601 text (``2026-01-31``, ``2026-01-31T06:00``, ``...+01:00``). Text or a
    ``datetime`` without an offset is wall time in ``zone``. A date alone is
    its midnight, or with ``end_of_day`` the last second of that day."""
    if isinstance(value, bool):
        raise ScheduleValueError(f"{field} must be a date or time, got {value!r}", field=field)
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ScheduleValueError(f"{field} must be finite, got {value!r}", field=field)
        return math.floor(value)
    moment: datetime
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ScheduleValueError(
                f"{field} must be an ISO 8601 date or time such as 2026-01-31 or "
                f"2026-01-31T06:00, got {value!r}",
                field=field,
            ) from None
        if end_of_day and len(text) == 10:
            moment = moment + timedelta(days=1)
            return wall_to_tick(moment.replace(tzinfo=None), zone) - 1
    else:
        raise ScheduleValueError(f"{field} must be a date or time, got {value!r}", field=field)
    if moment.tzinfo is None:
        return wall_to_tick(moment, zone)
    return math.floor(moment.timestamp())


def format_tick(tick: int, zone: tzinfo) -> str:
    """The tick as ISO 8601 wall time in ``zone`` with its offset."""
    return datetime.fromtimestamp(tick, zone).isoformat()


def wall_to_tick(wall: datetime, zone: tzinfo) -> int:
    """The instant of naive wall time ``wall`` in ``zone``: its first occurrence
    if it is repeated, the first instant after the gap if it is skipped."""
    if zone is UTC:
        return math.floor(wall.replace(tzinfo=UTC).timestamp())
    first = wall.replace(tzinfo=zone, fold=0)
    instant = math.floor(first.timestamp())
    if datetime.fromtimestamp(instant, zone).replace(tzinfo=None) == wall.replace(microsecond=0):
        return instant
    # In a gap: fold=1 reads the wall time with the offset after the change,
    # fold=0 with the one before; the change lies between the two readings.
    low = math.floor(wall.replace(tzinfo=zone, fold=1).timestamp())
    high = instant
    if low > high:
        low, high = high, low
    # The first instant whose wall time is past ``wall`` is the end of the gap.
    while low < high:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, zone).replace(tzinfo=None) > wall:
            high = middle
        else:
            low = middle + 1
    return low


@dataclass(frozen=True, slots=True)
class IntervalTrigger:
    """Every ``every`` seconds from ``anchor`` (an epoch second)."""

    every: int
    anchor: int = 0

    def next_after(self, after: float) -> int | None:
        steps = math.floor((after - self.anchor) / self.every) + 1
        return self.anchor + steps * self.every

    def newest(self, after: float, until: float, limit: int) -> list[int]:
        if until <= after or limit < 1:
            return []
        last = self.anchor + math.floor((until - self.anchor) / self.every) * self.every
        found: list[int] = []
        tick = last
        while tick > after and len(found) < limit:
            found.append(tick)
            tick -= self.every
        return found[::-1]


@dataclass(frozen=True, slots=True)
class CronTrigger:
    """The wall times a 5-field cron expression names, in ``zone``."""

    expression: str
    zone: tzinfo

    def _from(self, after: float) -> Iterator[int]:
        """Ticks strictly after ``after``, ascending, each instant once."""
        start = datetime.fromtimestamp(math.floor(after), self.zone).replace(tzinfo=None)
        walls = CronSim(self.expression, start - _SHIFT)
        previous: int | None = None
        while True:
            try:
                wall = next(walls)
            except StopIteration:
                return
            tick = wall_to_tick(wall, self.zone)
            if tick <= after or tick == previous:
                continue
            previous = tick
            yield tick

    def next_after(self, after: float) -> int | None:
        return next(self._from(after), None)

    def newest(self, after: float, until: float, limit: int) -> list[int]:
        if until <= after or limit < 1:
            return []
        window = float(_FIRST_WINDOW)
        while True:
            start = max(after, until - window)
            kept: deque[int] = deque(maxlen=limit)
            for tick in self._from(start):
                if tick > until:
                    break
                kept.append(tick)
            if len(kept) >= limit or start <= after:
                return list(kept)
            window *= 4
