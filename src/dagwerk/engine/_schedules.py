"""The engine's schedules: add, list, pause, sync and backfill, over the store.

:class:`EngineSchedules` is the named collaborator behind ``Engine.schedule``
and its friends; it resolves pipelines (a registered name or a file path),
validates a schedule before it is stored and drives backfills.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dagwerk.constants import RUN_TERMINAL_STATUSES, FailurePolicy, RunStatus
from dagwerk.errors import DagwerkError
from dagwerk.json import FrozenDict
from dagwerk.models import DagNode
from dagwerk.pipelines.loader import Pipeline, load_pipeline
from dagwerk.scheduling.definitions import (
    DEFAULT_CATCHUP_LIMIT,
    CatchupPolicy,
    FireSource,
    OverlapPolicy,
    ScheduleDefinition,
    validate_schedule_name,
)
from dagwerk.scheduling.firing import SchedulingStore, fire_tick, scheduled_input, start_pending
from dagwerk.scheduling.triggers import ScheduleValueError, parse_when
from dagwerk.store_schedules import MAX_FIRES_LISTED, ScheduleFire, ScheduleRecord

__all__ = [
    "MAX_BACKFILL_TICKS",
    "BackfillProgress",
    "BackfillReport",
    "EngineSchedules",
    "PipelineRegistry",
    "ScheduleExistsError",
    "ScheduleNotFoundError",
    "SyncReport",
    "UnknownPipelineError",
]

MAX_BACKFILL_TICKS = MAX_FIRES_LISTED
"""The most ticks one backfill covers."""


class ScheduleNotFoundError(DagwerkError, LookupError):
    code = "schedule_not_found"


class ScheduleExistsError(DagwerkError, ValueError):
    code = "schedule_exists"


class UnknownPipelineError(DagwerkError, ValueError):
    """A pipeline reference that is neither a registered name nor a readable file."""

    code = "pipeline_unknown"


class PipelineRegistry:
    """Pipelines registered by name with an engine (``Engine.register_pipeline``)."""

    def __init__(self) -> None:
        self._pipelines: dict[str, Pipeline] = {}
        self._lock = threading.Lock()

    def register(self, pipeline: Pipeline | Sequence[DagNode], name: str | None = None) -> Pipeline:
        if isinstance(pipeline, Pipeline):
            key = name or pipeline.name
            found = pipeline
        else:
            if not name:
                raise UnknownPipelineError("a pipeline given as nodes needs a name", field="name")
            key = name
            found = Pipeline(
                name=name,
                description="",
                defaults=FrozenDict(),
                plugins=(),
                failure_policy=FailurePolicy.FAIL_FAST,
                nodes=tuple(pipeline),
                source=f"<registered {name}>",
            )
        if not key:
            raise UnknownPipelineError("a registered pipeline needs a name", field="name")
        with self._lock:
            self._pipelines[key] = found
        return found

    def get(self, name: str) -> Pipeline | None:
        with self._lock:
            return self._pipelines.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._pipelines)

    def resolve(self, reference: str | Pipeline) -> tuple[str, Pipeline]:
        """``(reference as stored, pipeline)``: a registered name first, then a
        pipeline file (stored as its absolute path)."""
        if isinstance(reference, Pipeline):
            source = Path(reference.source)
            return (str(source.resolve()) if source.is_file() else reference.name), reference
        if not isinstance(reference, str) or not reference:
            raise UnknownPipelineError(
                "pipeline must be a registered pipeline name or a pipeline file path",
                field="pipeline",
            )
        registered = self.get(reference)
        if registered is not None:
            return reference, registered
        path = Path(reference)
        if path.is_file():
            absolute = str(path.resolve())
            return absolute, load_pipeline(absolute)
        known = ", ".join(self.names()) or "none"
        raise UnknownPipelineError(
            f"pipeline {reference!r} is neither a registered pipeline (registered: {known}) "
            "nor a pipeline file",
            field="pipeline",
        )


@dataclass(frozen=True, slots=True)
class SyncReport:
    """What ``sync_schedules`` did, by schedule name."""

    added: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BackfillProgress:
    """A backfill's state: ticks in the range, runs created by this call,
    ticks that had a record already, and runs of the range still unfinished."""

    schedule: str
    ticks: int
    created: int
    existing: int
    active: int
    remaining: int


@dataclass(frozen=True, slots=True)
class BackfillReport:
    """A finished backfill: every tick of the range and its run (``None``:
    the tick was skipped by the scheduler), and which this call created."""

    schedule: str
    ticks: tuple[int, ...]
    runs: Mapping[int, str | None]
    created: tuple[int, ...] = ()
    statuses: Mapping[str, RunStatus] = field(default_factory=dict)


class EngineSchedules:
    """Schedules over ``store`` with pipelines from ``pipelines``."""

    def __init__(self, store: SchedulingStore, pipelines: PipelineRegistry) -> None:
        self.store = store
        self.pipelines = pipelines

    def definition(
        self,
        name: str,
        pipeline: str | Pipeline,
        *,
        cron: str | None = None,
        every: str | int | float | None = None,
        input: Mapping[str, object] | None = None,
        timezone: str = "UTC",
        start: object = None,
        end: object = None,
        catchup: CatchupPolicy | str = CatchupPolicy.SKIP,
        catchup_limit: int = DEFAULT_CATCHUP_LIMIT,
        overlap: OverlapPolicy | str = OverlapPolicy.ALLOW,
    ) -> ScheduleDefinition:
        """A validated definition; its input is checked against the pipeline
        (a required field missing raises here, not at the first tick)."""
        validate_schedule_name(name)
        reference, found = self.pipelines.resolve(pipeline)
        definition = ScheduleDefinition.build(
            name,
            reference,
            found.nodes,
            pipeline_name=found.name or None,
            defaults=found.defaults,
            failure_policy=found.failure_policy,
            run_input=input,
            cron=cron,
            every=every,
            timezone=timezone,
            start=start,
            end=end,
            catchup=catchup,
            catchup_limit=catchup_limit,
            overlap=overlap,
        )
        scheduled_input(definition, definition.start_at or 0)
        return definition

    def put(self, definition: ScheduleDefinition, *, replace: bool) -> ScheduleRecord:
        record = self.store.put_schedule(definition, replace=replace)
        if record is None:
            raise ScheduleExistsError(
                f"schedule {definition.name!r} exists (replace it with --replace / "
                "replace=True, or delete it first)",
                field="name",
            )
        return record

    def get(self, name: str) -> ScheduleRecord:
        record = self.store.get_schedule(name)
        if record is None:
            raise ScheduleNotFoundError(f"schedule {name!r} does not exist", field="name")
        return record

    def set_paused(self, name: str, paused: bool) -> ScheduleRecord:
        record = self.store.set_schedule_paused(name, paused)
        if record is None:
            raise ScheduleNotFoundError(f"schedule {name!r} does not exist", field="name")
        return record

    def delete(self, name: str) -> None:
        if not self.store.delete_schedule(name):
            raise ScheduleNotFoundError(f"schedule {name!r} does not exist", field="name")

    def next_ticks(self, name: str, count: int, after: float | None) -> list[int]:
        record = self.get(name)
        definition = record.definition
        trigger = definition.trigger()
        moment = time.time() if after is None else after
        if definition.start_at is not None:
            moment = max(moment, definition.start_at - 1)
        ticks: list[int] = []
        while len(ticks) < count:
            tick = trigger.next_after(moment)
            if tick is None or (definition.end_at is not None and tick > definition.end_at):
                break
            ticks.append(tick)
            moment = tick
        return ticks

    def fires(self, name: str, limit: int) -> list[ScheduleFire]:
        return self.store.list_schedule_fires(self.get(name).schedule_id, limit=limit)

    def sync(self, pipeline: Pipeline) -> SyncReport:
        """Apply the ``schedules:`` of a pipeline file: add the new ones,
        replace the changed ones; schedules not in the file are left alone."""
        added: list[str] = []
        updated: list[str] = []
        unchanged: list[str] = []
        definitions = [
            self.definition(entry.name, pipeline, **entry.options()) for entry in pipeline.schedules
        ]
        for definition in definitions:
            found = self.store.get_schedule(definition.name)
            if found is not None and found.definition.same_as(definition):
                unchanged.append(definition.name)
                continue
            self.put(definition, replace=True)
            (added if found is None else updated).append(definition.name)
        return SyncReport(tuple(added), tuple(updated), tuple(unchanged))

    def backfill(
        self,
        name: str,
        start: object,
        end: object,
        *,
        max_active: int = 4,
        poll_interval: float = 0.5,
        timeout: float | None = None,
        on_progress: Callable[[BackfillProgress], None] | None = None,
    ) -> BackfillReport:
        """One run per tick of ``[start, end]`` that has none, at most
        ``max_active`` of the range's runs unfinished at a time; returns once
        every run of the range is finished (workers do the work)."""
        if type(max_active) is not int or max_active < 1:
            raise ScheduleValueError("max_active must be an int >= 1", field="max_active")
        record = self.get(name)
        definition = record.definition
        zone = definition.zone
        first = parse_when(start, zone, "from")
        last = parse_when(end, zone, "to", end_of_day=True)
        if last < first:
            raise ScheduleValueError("to must not be before from", field="to")
        ticks = definition.trigger().newest(first - 1, last, MAX_BACKFILL_TICKS + 1)
        if len(ticks) > MAX_BACKFILL_TICKS:
            raise ScheduleValueError(
                f"the range holds more than {MAX_BACKFILL_TICKS} ticks; backfill a shorter one",
                field="to",
                limit=MAX_BACKFILL_TICKS,
            )
        runs: dict[int, str | None] = {
            fire.tick: fire.run_id
            for fire in self.store.list_schedule_fires(
                record.schedule_id, limit=MAX_FIRES_LISTED, since=first, until=last
            )
        }
        existing = sum(1 for tick in ticks if tick in runs)
        todo = [tick for tick in ticks if tick not in runs]
        created: list[int] = []
        finished: dict[str, RunStatus] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = threading.Event()
        while True:
            active = self._active(runs, finished)
            while todo and len(active) < max_active:
                tick = todo.pop(0)
                outcome = fire_tick(
                    self.store, record, tick, source=FireSource.BACKFILL, advance_cursor=False
                )
                if outcome.fire is None:
                    raise ScheduleNotFoundError(
                        f"schedule {name!r} was deleted during the backfill", field="name"
                    )
                runs[tick] = outcome.fire.run_id
                if outcome.created:
                    created.append(tick)
                if outcome.fire.run_id is not None:
                    active.append(outcome.fire.run_id)
            if on_progress is not None:
                on_progress(
                    BackfillProgress(
                        name, len(ticks), len(created), existing, len(active), len(todo)
                    )
                )
            if not todo and not active:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"backfill of {name!r} did not finish in {timeout}s")
            pause.wait(poll_interval)
        return BackfillReport(
            name,
            tuple(ticks),
            {tick: runs.get(tick) for tick in ticks},
            tuple(created),
            dict(finished),
        )

    def _active(self, runs: Mapping[int, str | None], finished: dict[str, RunStatus]) -> list[str]:
        """The unfinished runs among ``runs`` (PENDING ones are started);
        finished ones are remembered in ``finished`` and not read again."""
        active: list[str] = []
        pending: list[ScheduleFire] = []
        for tick, run_id in runs.items():
            if run_id is None or run_id in finished:
                continue
            status = self.store.get_run_status(run_id)
            if status is None:
                continue
            if status in RUN_TERMINAL_STATUSES:
                finished[run_id] = status
                continue
            if status is RunStatus.PENDING:
                pending.append(ScheduleFire("", "", tick, run_id, FireSource.BACKFILL, 0.0))
            active.append(run_id)
        start_pending(self.store, pending)
        return active
