"""What a store offers beyond the seed's protocols, looked up once.

A store implements the seed's ``DagStore`` and any of dagwerk's extension
protocols (:mod:`dagwerk.store`). :meth:`StoreCapabilities.of` asks once
which ones, and hands back the store typed by each protocol it implements
(``None`` for each it lacks); the orchestrator, the runtime and the
interfaces consult that object instead of asking the store by name.
The protocols a store implements are decided once per store object (and
once per class where the class decides it, see
:func:`dagwerk._protocols.implements`), so looking the capabilities up
again costs a few microseconds.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, fields
from typing import Any, cast, get_args, get_type_hints

from dagwerk._protocols import implements
from dagwerk.limits import Limits
from dagwerk.store import (
    BackstopStore,
    BatchQueueStore,
    ClaimAheadStore,
    ClosableStore,
    DagBudgetStore,
    DagChildStore,
    DagQueueStore,
    DagRunStore,
    DelayedRetryStore,
    DurableTaskStore,
    IdempotentSubmitStore,
    LimitedStore,
    LiveNodeStore,
    NodeRerunStore,
    QueueForecastStore,
    RecentOutputsStore,
    RunActivityStore,
    RunFrontierStore,
    RunningTasksStore,
    RunTopologyStore,
    RunViewStore,
    ScheduleStore,
    UnitOfWorkStore,
    WaitAgesStore,
    WaitRecordStore,
    WaitResponseStore,
    WorkerPresenceStore,
)
from dagwerk.store_changes import ChangeWaitStore
from dagwerk.store_completion_reads import CompletionReadsStore
from dagwerk.store_logs import RunTraceStore, TaskLogStore
from dagwerk.store_results import RunOutputsStore
from dagwerk.store_retention import RunRetentionStore
from dagwerk.store_run_units import RunUnitStore
from dagwerk.store_tracebacks import AttemptTracebackStore

__all__ = ["StoreCapabilities"]


@dataclass(slots=True, eq=False, repr=False)
class StoreCapabilities:
    """One store, typed by each optional protocol it implements; ``None``
    where it does not. Without a capability its caller does what the seed
    does (each protocol's docstring says what that is). Read-only by
    convention: it is built for each :meth:`of` (a frozen dataclass would
    cost several microseconds more per look-up)."""

    runs: DagRunStore | None
    topology: RunTopologyStore | None
    activity: RunActivityStore | None
    frontier: RunFrontierStore | None
    queue: DagQueueStore | None
    batch: BatchQueueStore | None
    units: UnitOfWorkStore | None
    claim_ahead: ClaimAheadStore | None
    recent_outputs: RecentOutputsStore | None
    backstop: BackstopStore | None
    live_nodes: LiveNodeStore | None
    wait_ages: WaitAgesStore | None
    running_tasks: RunningTasksStore | None
    presence: WorkerPresenceStore | None
    forecast: QueueForecastStore | None
    children: DagChildStore | None
    budgets: DagBudgetStore | None
    wait_responses: WaitResponseStore | None
    wait_records: WaitRecordStore | None
    durable: DurableTaskStore | None
    delayed_retry: DelayedRetryStore | None
    rerun: NodeRerunStore | None
    closable: ClosableStore | None
    retention: RunRetentionStore | None
    task_logs: TaskLogStore | None
    tracebacks: AttemptTracebackStore | None
    run_traces: RunTraceStore | None
    schedules: ScheduleStore | None
    idempotent_submits: IdempotentSubmitStore | None
    views: RunViewStore | None
    run_outputs: RunOutputsStore | None
    changes: ChangeWaitStore | None
    completion_reads: CompletionReadsStore | None
    run_units: RunUnitStore | None
    limits: Limits | None
    """The limits the store validates with (a :class:`LimitedStore`)."""

    @classmethod
    def of(cls, store: object) -> StoreCapabilities:
        """The capabilities of ``store``."""
        has = _implemented(store)
        limits = cast(LimitedStore, store).limits if has[-1] else None
        # One value per typed field, in field order (_PROTOCOLS is read from
        # the fields' annotations, so each value has its field's type).
        values: list[Any] = [store if found else None for found in has[:-1]]
        values.append(limits if isinstance(limits, Limits) else None)
        return cls(*values)


def _protocols() -> tuple[type, ...]:
    """The protocol of each typed field, in field order; :class:`LimitedStore`
    (for ``limits``) last."""
    hints = get_type_hints(StoreCapabilities)
    found: list[type] = []
    for item in fields(StoreCapabilities):
        if item.name != "limits":
            (protocol,) = (arg for arg in get_args(hints[item.name]) if arg is not type(None))
            found.append(protocol)
    return (*found, LimitedStore)


_PROTOCOLS = _protocols()

# Per live store object (by identity, dropped when the store is collected):
# whether it implements each of _PROTOCOLS. A protocol with data members, or
# a store that forwards its members through ``__getattr__``, is decided per
# object, so the answer is kept per object rather than per class.
_KNOWN: dict[int, tuple[weakref.ref[object], tuple[bool, ...]]] = {}


def _implemented(store: object) -> tuple[bool, ...]:
    key = id(store)
    entry = _KNOWN.get(key)
    if entry is not None and entry[0]() is store:
        return entry[1]
    has = tuple(implements(store, protocol) for protocol in _PROTOCOLS)
    try:
        ref = weakref.ref(store, lambda dead: _forget(key, dead))
    except TypeError:  # an object that cannot be weakly referenced: asked each time
        return has
    _KNOWN[key] = (ref, has)
    return has


def _forget(key: int, ref: weakref.ref[object]) -> None:
    entry = _KNOWN.get(key)
    if entry is not None and entry[0] is ref:
        del _KNOWN[key]
