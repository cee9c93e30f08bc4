"""Turning one tick of a schedule into a run, exactly once.

:func:`fire_tick` records the tick and creates its run PENDING in one store
transaction (``ScheduleStore.fire_schedule_tick``), then starts the run. A
process that dies in between leaves a PENDING run that the next pass starts
(:func:`start_pending`), so no tick is lost and none runs twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from dagwerk.constants import RunStatus
from dagwerk.errors import DagwerkError
from dagwerk.graph import validate_graph
from dagwerk.json import FrozenDict
from dagwerk.orchestrator import OrchestratorCallbacks, RunStartRejectedError, start_run
from dagwerk.plugins import PluginMeta
from dagwerk.runtime.faults import classify
from dagwerk.schema import get_pipeline_input_schema, merge_run_input
from dagwerk.store import DagRunStore, DagStore
from dagwerk.store_schedules import NewRun, ScheduleFire, ScheduleRecord, ScheduleStore

from .definitions import SCHEDULED_FOR, FireSource, ScheduleDefinition
from .triggers import format_tick

__all__ = [
    "FireHook",
    "SchedulingStore",
    "TickOutcome",
    "fire_tick",
    "scheduled_input",
    "start_pending",
]

_LOG = logging.getLogger("dagwerk.scheduling")

FireHook = Callable[[ScheduleFire], None]
"""Called after a tick's record and run have committed, before the run starts."""


class SchedulingStore(ScheduleStore, DagStore, DagRunStore, Protocol):
    """A store the scheduler creates, starts and cancels runs in."""


def _ignore(run_id: str) -> None:
    return None


_CALLBACKS = OrchestratorCallbacks(_ignore, _ignore, _ignore, _ignore)


def _no_metadata(name: str) -> PluginMeta | None:
    return None


def new_scheduled_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:16]}"


def scheduled_input(definition: ScheduleDefinition, tick: int) -> FrozenDict:
    """The run input of ``tick``: the pipeline's defaults under the schedule's
    input, with ``scheduled_for`` set to the tick (ISO 8601 with offset).
    Raises the run-input errors of ``submit`` (a required field missing)."""
    validate_graph(list(definition.nodes))
    fields = get_pipeline_input_schema(list(definition.nodes), _no_metadata)
    supplied = dict(definition.run_input)
    supplied[SCHEDULED_FOR] = format_tick(tick, definition.zone)
    return merge_run_input(fields, definition.defaults, supplied)


@dataclass(frozen=True, slots=True)
class TickOutcome:
    """What :func:`fire_tick` did with a tick: ``created`` when this call
    recorded it; ``fire`` is the record (``None``: the schedule is gone)."""

    tick: int
    created: bool
    fire: ScheduleFire | None


def fire_tick(
    store: SchedulingStore,
    record: ScheduleRecord,
    tick: int,
    *,
    source: FireSource,
    skip: bool = False,
    advance_cursor: bool,
    on_fire: FireHook | None = None,
) -> TickOutcome:
    """Record ``tick`` with a new run (or as skipped, with ``skip``) and start
    the run. A tick recorded before is left as it is (its PENDING run started)."""
    definition = record.definition
    run: NewRun | None = None
    if not skip:
        run = NewRun(
            run_id=new_scheduled_run_id(),
            nodes=definition.nodes,
            run_input=scheduled_input(definition, tick),
            failure_policy=definition.failure_policy,
            pipeline=definition.pipeline_name,
        )
    result = store.fire_schedule_tick(
        record.schedule_id, tick, source=source, run=run, advance_cursor=advance_cursor
    )
    fire = result.fire
    if result.created and fire is not None and on_fire is not None:
        on_fire(fire)
    if fire is not None and fire.run_id is not None:
        start_pending(store, [fire])
    return TickOutcome(tick, result.created, fire)


def start_pending(store: SchedulingStore, fires: Iterable[ScheduleFire]) -> list[str]:
    """Start each fire's run that is still PENDING; the run IDs started. A
    store fault is raised (as by the status read before it): the runs stay
    PENDING for the next pass."""
    started: list[str] = []
    for fire in fires:
        if fire.run_id is None:
            continue
        if store.get_run_status(fire.run_id) is not RunStatus.PENDING:
            continue
        try:
            start_run(store, fire.run_id, callbacks=_CALLBACKS)
        except RunStartRejectedError:
            continue  # cancelled meanwhile
        except DagwerkError as exc:
            if classify(exc) is not None:
                raise
            _LOG.exception("schedule %s: run %s did not start", fire.schedule_name, fire.run_id)
            continue
        started.append(fire.run_id)
    return started
