"""What a schedule is: its pipeline, input, trigger, zone, window and policies.

A :class:`ScheduleDefinition` is validated when it is made (every bad value
raises :class:`~dagwerk.scheduling.triggers.ScheduleValueError` naming its
field), stored as one JSON document, and read back with
:meth:`ScheduleDefinition.from_json`. The pipeline is kept as it was when
the schedule was added or synced (its nodes, defaults and failure policy),
so whichever process holds the scheduling lease can start a run from the
database alone. Pure: no I/O, no threads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeVar
from zoneinfo import ZoneInfo

from dagwerk.constants import FailurePolicy
from dagwerk.json import FrozenDict, freeze_object, thaw_json
from dagwerk.models import DagNode

from .triggers import (
    CronTrigger,
    IntervalTrigger,
    ScheduleValueError,
    Trigger,
    load_zone,
    parse_cron,
    parse_interval,
    parse_when,
)

__all__ = [
    "DEFAULT_CATCHUP_LIMIT",
    "MAX_CATCHUP_LIMIT",
    "MAX_SCHEDULE_NAME_LENGTH",
    "SCHEDULED_FOR",
    "CatchupPolicy",
    "FireSource",
    "OverlapPolicy",
    "ScheduleDefinition",
    "validate_schedule_name",
]

SCHEDULED_FOR: Final = "scheduled_for"
"""The run-input field that carries a scheduled run's tick (ISO 8601 with offset)."""

MAX_SCHEDULE_NAME_LENGTH: Final = 128
DEFAULT_CATCHUP_LIMIT: Final = 100
MAX_CATCHUP_LIMIT: Final = 10_000
MAX_PIPELINE_REF_LENGTH: Final = 4_096
_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
_E = TypeVar("_E", bound=StrEnum)


class CatchupPolicy(StrEnum):
    """Which ticks missed while no process was scheduling still fire."""

    SKIP = "skip"
    """None: only a tick that is due now fires."""
    LATEST = "latest"
    """The newest missed tick."""
    ALL = "all"
    """Every missed tick, oldest first, at most the schedule's catch-up limit (the newest)."""


class OverlapPolicy(StrEnum):
    """What a tick does while the schedule's previous run has not finished."""

    ALLOW = "allow"
    SKIP = "skip"
    """The tick is recorded as skipped; no run."""
    CANCEL_PREVIOUS = "cancel_previous"
    """The unfinished runs are cancelled and the tick's run starts."""


class FireSource(StrEnum):
    """Who turned a tick into a run."""

    SCHEDULE = "schedule"
    BACKFILL = "backfill"


def validate_schedule_name(name: object) -> str:
    """A schedule name: 1 to 128 letters, digits and ``_ . : -``, starting
    with a letter or digit."""
    if not isinstance(name, str) or not name:
        raise ScheduleValueError("schedule name must be a non-empty string", field="name")
    if len(name) > MAX_SCHEDULE_NAME_LENGTH:
        raise ScheduleValueError(
            f"schedule name is {len(name)} characters; maximum is {MAX_SCHEDULE_NAME_LENGTH}",
            field="name",
            limit=MAX_SCHEDULE_NAME_LENGTH,
        )
    if not _NAME.match(name):
        raise ScheduleValueError(
            f"schedule name {name!r} may hold only letters, digits and _ . : - "
            "and must start with a letter or digit",
            field="name",
        )
    return name


def _enum(kind: type[_E], value: object, field: str) -> _E:
    try:
        return kind(value if isinstance(value, str) else "")
    except ValueError:
        choices = ", ".join(member.value for member in kind)
        raise ScheduleValueError(
            f"{field} must be one of {choices}, got {value!r}", field=field
        ) from None


@dataclass(frozen=True, slots=True)
class ScheduleDefinition:
    """A schedule as stored. Build one with :meth:`build`, which validates."""

    name: str
    pipeline: str
    """Where the pipeline came from: a file path or a registered pipeline name."""
    nodes: tuple[DagNode, ...]
    pipeline_name: str | None
    """The pipeline's own name, recorded on each run (``RunRecord.pipeline``)."""
    defaults: FrozenDict
    failure_policy: FailurePolicy
    run_input: FrozenDict
    cron: str | None
    every: int | None
    """Seconds between ticks of a fixed interval."""
    timezone: str
    start_at: int | None
    end_at: int | None
    catchup: CatchupPolicy
    catchup_limit: int
    overlap: OverlapPolicy

    @classmethod
    def build(
        cls,
        name: str,
        pipeline: str,
        nodes: Sequence[DagNode],
        *,
        pipeline_name: str | None = None,
        defaults: Mapping[str, object] | None = None,
        failure_policy: FailurePolicy | str = FailurePolicy.FAIL_FAST,
        run_input: Mapping[str, object] | None = None,
        cron: str | None = None,
        every: str | int | float | None = None,
        timezone: str = "UTC",
        start: object = None,
        end: object = None,
        catchup: CatchupPolicy | str = CatchupPolicy.SKIP,
        catchup_limit: int = DEFAULT_CATCHUP_LIMIT,
        overlap: OverlapPolicy | str = OverlapPolicy.ALLOW,
    ) -> ScheduleDefinition:
        """Validate every field; ``start``/``end`` are dates or times (see
        :func:`~dagwerk.scheduling.triggers.parse_when`), wall time in ``timezone``
        unless they carry an offset. Exactly one of ``cron`` and ``every``."""
        validate_schedule_name(name)
        if not isinstance(pipeline, str) or not pipeline or len(pipeline) > MAX_PIPELINE_REF_LENGTH:
            raise ScheduleValueError(
                f"pipeline must be a file path or pipeline name of 1 to "
                f"{MAX_PIPELINE_REF_LENGTH} characters",
                field="pipeline",
                limit=MAX_PIPELINE_REF_LENGTH,
            )
        if (cron is None) == (every is None):
            raise ScheduleValueError(
                "a schedule needs exactly one of cron (such as '*/5 * * * *') or every "
                "(such as 30s)",
                field="cron",
            )
        zone = load_zone(timezone)
        start_at = None if start is None else parse_when(start, zone, "start")
        end_at = None if end is None else parse_when(end, zone, "end", end_of_day=True)
        if start_at is not None and end_at is not None and end_at < start_at:
            raise ScheduleValueError("end must not be before start", field="end")
        if type(catchup_limit) is not int or not 1 <= catchup_limit <= MAX_CATCHUP_LIMIT:
            raise ScheduleValueError(
                f"catchup_limit must be an int from 1 to {MAX_CATCHUP_LIMIT}, "
                f"got {catchup_limit!r}",
                field="catchup_limit",
                limit=MAX_CATCHUP_LIMIT,
            )
        if run_input is not None and not isinstance(run_input, Mapping):
            raise ScheduleValueError("input must be a JSON object", field="input")
        return cls(
            name=name,
            pipeline=pipeline,
            nodes=tuple(nodes),
            pipeline_name=pipeline_name or None,
            defaults=freeze_object(defaults),
            failure_policy=FailurePolicy(failure_policy),
            run_input=freeze_object(run_input),
            cron=None if cron is None else parse_cron(cron),
            every=None if every is None else parse_interval(every),
            timezone=timezone,
            start_at=start_at,
            end_at=end_at,
            catchup=_enum(CatchupPolicy, catchup, "catchup"),
            catchup_limit=catchup_limit,
            overlap=_enum(OverlapPolicy, overlap, "overlap"),
        )

    @property
    def zone(self) -> ZoneInfo:
        return load_zone(self.timezone)

    def trigger(self) -> Trigger:
        """The schedule's ticks (an interval is anchored at ``start_at``, else
        at the epoch, so ``every 1h`` fires on the hour)."""
        if self.cron is not None:
            return CronTrigger(self.cron, self.zone)
        assert self.every is not None
        return IntervalTrigger(self.every, self.start_at or 0)

    def describe(self) -> str:
        """The trigger in words a user typed: ``cron */5 * * * *`` or ``every 30s``."""
        if self.cron is not None:
            return f"cron {self.cron}"
        return f"every {self.every}s"

    def to_json(self) -> str:
        """The definition as one JSON document (what the stores keep)."""
        return json.dumps(
            {
                "name": self.name,
                "pipeline": self.pipeline,
                "nodes": [node.model_dump(mode="json") for node in self.nodes],
                "pipeline_name": self.pipeline_name,
                "defaults": thaw_json(self.defaults),
                "failure_policy": self.failure_policy.value,
                "run_input": thaw_json(self.run_input),
                "cron": self.cron,
                "every": self.every,
                "timezone": self.timezone,
                "start_at": self.start_at,
                "end_at": self.end_at,
                "catchup": self.catchup.value,
                "catchup_limit": self.catchup_limit,
                "overlap": self.overlap.value,
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> ScheduleDefinition:
        """A definition :meth:`to_json` wrote."""
        data: dict[str, Any] = json.loads(text)
        return cls(
            name=data["name"],
            pipeline=data["pipeline"],
            nodes=tuple(DagNode.model_validate(node) for node in data["nodes"]),
            pipeline_name=data["pipeline_name"],
            defaults=freeze_object(data["defaults"]),
            failure_policy=FailurePolicy(data["failure_policy"]),
            run_input=freeze_object(data["run_input"]),
            cron=data["cron"],
            every=data["every"],
            timezone=data["timezone"],
            start_at=data["start_at"],
            end_at=data["end_at"],
            catchup=CatchupPolicy(data["catchup"]),
            catchup_limit=data["catchup_limit"],
            overlap=OverlapPolicy(data["overlap"]),
        )

    def same_as(self, other: ScheduleDefinition) -> bool:
        """Whether both define the same schedule (what a sync compares)."""
        return self.to_json() == other.to_json()
