"""The pipeline registry and schedules of an :class:`~dagwerk.engine.Engine`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dagwerk.models import DagNode
from dagwerk.pipelines.loader import Pipeline, load_pipeline
from dagwerk.scheduling.definitions import DEFAULT_CATCHUP_LIMIT, CatchupPolicy, OverlapPolicy
from dagwerk.scheduling.scheduler import (
    DEFAULT_SCHEDULE_INTERVAL,
    SchedulerThread,
    start_scheduler,
)
from dagwerk.store_schedules import ScheduleFire, ScheduleRecord

from ._schedules import (
    BackfillProgress,
    BackfillReport,
    PipelineRegistry,
    SyncReport,
)

if TYPE_CHECKING:
    pass
from ._reads import EngineReads


class ScheduleMethods(EngineReads):
    """Registered pipelines, schedules, backfills and the scheduler thread."""

    pipelines: PipelineRegistry
    poll_interval: float
    schedule_interval: float | None
    _schedulers: list[SchedulerThread]

    # --- pipelines and schedules -------------------------------------------------

    def register_pipeline(
        self, pipeline: Pipeline | Sequence[DagNode], name: str | None = None
    ) -> Pipeline:
        """Register a pipeline under ``name`` (default: its own name), so
        schedules (and other callers of :meth:`resolve_pipeline`) can name it."""
        return self.pipelines.register(pipeline, name)

    def resolve_pipeline(self, reference: str) -> Pipeline:
        """The pipeline registered as ``reference``, else the pipeline file at
        that path. Raises :class:`~dagwerk.engine.UnknownPipelineError`."""
        return self.pipelines.resolve(reference)[1]

    def schedule(
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
        replace: bool = False,
    ) -> ScheduleRecord:
        """Store a schedule that starts a run of ``pipeline`` (a registered
        name, a pipeline file path or a :class:`Pipeline`) at each tick of
        ``cron`` (5 fields or ``@hourly``-style) or ``every`` (``30s``, ``2h``).

        Each run's input is the pipeline's defaults under ``input``, with
        ``scheduled_for`` set to the tick (ISO 8601 with the zone's offset).
        ``timezone`` is an IANA zone for the cron expression; ``start`` and
        ``end`` bound the ticks (dates or times, wall time in that zone).
        ``catchup`` says which ticks missed while nothing was scheduling still
        fire (``skip``, ``latest``, ``all`` up to ``catchup_limit``);
        ``overlap`` what a tick does while an earlier run of the schedule is
        unfinished (``allow``, ``skip``, ``cancel_previous``). The pipeline is
        kept as it is now; add again with ``replace=True`` (or sync the file)
        to change it. An existing name raises
        :class:`~dagwerk.engine.ScheduleExistsError` unless ``replace``.
        """
        schedules = self._require_schedules()
        definition = schedules.definition(
            name,
            pipeline,
            cron=cron,
            every=every,
            input=input,
            timezone=timezone,
            start=start,
            end=end,
            catchup=catchup,
            catchup_limit=catchup_limit,
            overlap=overlap,
        )
        return schedules.put(definition, replace=replace)

    def get_schedule(self, name: str) -> ScheduleRecord:
        """The schedule ``name``; :class:`~dagwerk.engine.ScheduleNotFoundError` if none."""
        return self._require_schedules().get(name)

    def list_schedules(self) -> list[ScheduleRecord]:
        """Every schedule, by name."""
        return self._require_schedules().store.list_schedules()

    def pause_schedule(self, name: str) -> ScheduleRecord:
        """Stop the schedule's ticks (idempotent)."""
        return self._require_schedules().set_paused(name, True)

    def resume_schedule(self, name: str) -> ScheduleRecord:
        """Start the schedule's ticks again from now; ticks of the pause do not fire."""
        return self._require_schedules().set_paused(name, False)

    def delete_schedule(self, name: str) -> None:
        """Delete the schedule and its tick records; its runs stay."""
        self._require_schedules().delete(name)

    def next_ticks(self, name: str, count: int = 5, *, after: float | None = None) -> list[int]:
        """The schedule's next ``count`` ticks after ``after`` (default: now),
        as epoch seconds."""
        return self._require_schedules().next_ticks(name, count, after)

    def schedule_fires(self, name: str, limit: int = 20) -> list[ScheduleFire]:
        """The schedule's newest tick records (with their run IDs), newest first."""
        return self._require_schedules().fires(name, limit)

    def run_schedule(self, run_id: str) -> ScheduleFire | None:
        """The tick record of a scheduled or backfilled run, else ``None``."""
        schedules = self._capabilities.schedules
        return None if schedules is None else schedules.get_run_fire(run_id)

    def sync_schedules(self, pipeline: str | Pipeline) -> SyncReport:
        """Apply a pipeline file's ``schedules:``: add new ones, replace
        changed ones (keeping their tick records); others are left alone."""
        schedules = self._require_schedules()
        found = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)
        return schedules.sync(found)

    def backfill(
        self,
        name: str,
        start: object,
        end: object,
        *,
        max_active: int = 4,
        timeout: float | None = None,
        on_progress: Callable[[BackfillProgress], None] | None = None,
    ) -> BackfillReport:
        """Create one run per tick of the schedule in ``[start, end]`` that
        has none yet (a date alone as ``end`` covers that whole day), keeping
        at most ``max_active`` of them unfinished, and return when all are
        finished; workers elsewhere do the work. Running it again creates no
        tick's run twice."""
        return self._require_schedules().backfill(
            name,
            start,
            end,
            max_active=max_active,
            poll_interval=max(self.poll_interval, 0.05),
            timeout=timeout,
            on_progress=on_progress,
        )

    def start_scheduler(self, *, interval: float | None = None, **options: Any) -> SchedulerThread:
        """Take part in scheduling from this engine's process (``dagwerk
        serve`` does); workers built by :meth:`worker` already do. ``close``
        stops it. ``options`` go to :class:`~dagwerk.scheduling.Scheduler`."""
        self._require_schedules()
        thread = start_scheduler(
            self._store,
            interval=interval or self.schedule_interval or DEFAULT_SCHEDULE_INTERVAL,
            **options,
        )
        self._schedulers.append(thread)
        return thread
