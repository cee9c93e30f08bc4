"""Store protocols of schedules and idempotent submits (dagwerk extensions).

:class:`ScheduleStore` keeps schedules and the record of each tick that
became a run (or was skipped): a tick is recorded once per schedule, in the
same transaction that creates its run, so a tick becomes a run exactly once
however many processes try. :class:`IdempotentSubmitStore` does the same for
a submit's idempotency key. Times are the store clock's epoch seconds; every
method is one transaction. Requests are checked here, once, for every
backend (:func:`check_scheduled_run`, :func:`check_idempotency_key`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from dagwerk._store_types import InvalidStoreValueError, validate_pipeline_name
from dagwerk.constants import FailurePolicy
from dagwerk.models import DagNode
from dagwerk.scheduling.definitions import FireSource, ScheduleDefinition

__all__ = [
    "MAX_FIRES_LISTED",
    "MAX_IDEMPOTENCY_KEY_LENGTH",
    "IdempotentRun",
    "IdempotentSubmitStore",
    "NamedLease",
    "NewRun",
    "ScheduleFire",
    "ScheduleFireResult",
    "ScheduleRecord",
    "ScheduleStore",
    "check_fire_request",
    "check_idempotency_key",
    "check_new_run",
]

MAX_IDEMPOTENCY_KEY_LENGTH: Final = 255
MAX_FIRES_LISTED: Final = 10_000
"""The most fire records one ``list_schedule_fires`` returns."""


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run to create with a tick or an idempotency key (``create_run``'s arguments)."""

    run_id: str
    nodes: tuple[DagNode, ...]
    run_input: Mapping[str, object]
    failure_policy: FailurePolicy
    pipeline: str | None


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A stored schedule. ``cursor`` is the newest tick the scheduler has
    dealt with (fired, skipped or passed over); ticks after it are due once
    the clock reaches them. A new or resumed schedule's cursor is the store
    time it was added or resumed, so no tick before that fires by itself."""

    schedule_id: str
    definition: ScheduleDefinition
    paused: bool
    cursor: float
    created_at: float
    updated_at: float

    @property
    def name(self) -> str:
        return self.definition.name


@dataclass(frozen=True, slots=True)
class ScheduleFire:
    """One tick of a schedule that was dealt with: ``run_id`` is its run, or
    ``None`` when the tick was skipped (its overlap policy)."""

    schedule_id: str
    schedule_name: str
    tick: int
    run_id: str | None
    source: FireSource
    fired_at: float


@dataclass(frozen=True, slots=True)
class ScheduleFireResult:
    """What ``fire_schedule_tick`` did. ``created``: this call recorded the
    tick (and created its run, if it has one); otherwise ``fire`` is the
    record an earlier call made, or ``None`` when the schedule is gone."""

    created: bool
    fire: ScheduleFire | None


@dataclass(frozen=True, slots=True)
class NamedLease:
    """The current holder of a named lease and when it expires (store time)."""

    name: str
    holder: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class IdempotentRun:
    """What ``create_run_once`` found or did: the run that holds the key, whether
    this call created it, and the fingerprint stored with the key."""

    run_id: str
    created: bool
    fingerprint: str


def check_new_run(run: object) -> NewRun:
    """``run`` as a :class:`NewRun`; the stores' ``create_run`` checks the rest."""
    if not isinstance(run, NewRun):
        raise InvalidStoreValueError("run must be a NewRun", field="run")
    if not isinstance(run.run_id, str) or not run.run_id:
        raise InvalidStoreValueError("run ID must be a non-empty string", field="run_id")
    validate_pipeline_name(run.pipeline)
    return run


def check_fire_request(schedule_id: object, tick: object, source: object) -> FireSource:
    """The checks of ``fire_schedule_tick``'s arguments; the source as an enum."""
    if not isinstance(schedule_id, str) or not schedule_id:
        raise InvalidStoreValueError("schedule ID must be a non-empty string", field="schedule_id")
    if type(tick) is not int:
        raise InvalidStoreValueError("tick must be an int (epoch seconds)", field="tick")
    try:
        return FireSource(source if isinstance(source, str) else "")
    except ValueError:
        raise InvalidStoreValueError(
            f"source must be one of {', '.join(s.value for s in FireSource)}", field="source"
        ) from None


def check_idempotency_key(key: object, fingerprint: object, retention: object) -> float:
    """The checks of ``create_run_once``'s key arguments; the retention in seconds."""
    if not isinstance(key, str) or not key:
        raise InvalidStoreValueError("idempotency key must be a non-empty string", field="key")
    if len(key) > MAX_IDEMPOTENCY_KEY_LENGTH:
        raise InvalidStoreValueError(
            f"idempotency key is {len(key)} characters; maximum is {MAX_IDEMPOTENCY_KEY_LENGTH}",
            field="key",
            limit=MAX_IDEMPOTENCY_KEY_LENGTH,
        )
    if "\x00" in key:
        raise InvalidStoreValueError("idempotency key must not contain NUL", field="key")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise InvalidStoreValueError("fingerprint must be a non-empty string", field="fingerprint")
    if isinstance(retention, bool) or not isinstance(retention, int | float):
        raise InvalidStoreValueError("retention must be a number of seconds", field="retention")
    seconds = float(retention)
    if not seconds > 0 or seconds == float("inf"):
        raise InvalidStoreValueError("retention must be finite and > 0", field="retention")
    return seconds


@runtime_checkable
class ScheduleStore(Protocol):
    """Schedules, their tick records and a read of named leases (dagwerk extension)."""

    def put_schedule(
        self, definition: ScheduleDefinition, *, replace: bool
    ) -> ScheduleRecord | None:
        """Store a schedule under ``definition.name``. A new one gets a fresh
        ID, is active and its cursor is the store time now. An existing one is
        replaced (same ID, cursor, pause state and tick records) when
        ``replace``; otherwise nothing changes and the answer is ``None``."""
        ...

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        """The schedule called ``name``, or ``None``. Read-only."""
        ...

    def list_schedules(self) -> list[ScheduleRecord]:
        """Every schedule, by name. Read-only."""
        ...

    def set_schedule_paused(self, name: str, paused: bool) -> ScheduleRecord | None:
        """Pause or resume; resuming a paused schedule moves its cursor to the
        store time now (ticks of the pause never fire by themselves). An exact
        repeat changes nothing. ``None`` for a missing schedule."""
        ...

    def delete_schedule(self, name: str) -> bool:
        """Delete the schedule and its tick records (its runs stay). True iff
        it existed."""
        ...

    def fire_schedule_tick(
        self,
        schedule_id: str,
        tick: int,
        *,
        source: FireSource | str,
        run: NewRun | None,
        advance_cursor: bool,
    ) -> ScheduleFireResult:
        """In one transaction: record ``tick`` of the schedule, create ``run``
        PENDING (``None``: the tick is recorded as skipped) and, with
        ``advance_cursor``, move the cursor to ``tick`` if it is behind. An
        exact repeat, or any call for a tick already recorded, writes nothing
        and returns the first record (``created=False``). A missing schedule:
        nothing written, ``fire=None``. The run is refused like ``create_run``
        refuses it (``InvalidStoreValueError``, ``JsonLimitError``); a run ID
        that exists raises ``InvalidStoreValueError``; nothing is written."""
        ...

    def advance_schedule_cursor(self, schedule_id: str, tick: float) -> bool:
        """Move the cursor forward to ``tick`` (never back); True iff it moved."""
        ...

    def list_schedule_fires(
        self,
        schedule_id: str,
        *,
        limit: int = 50,
        source: FireSource | str | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> list[ScheduleFire]:
        """The schedule's tick records, newest tick first, at most ``limit``
        (at most :data:`MAX_FIRES_LISTED`), optionally of one ``source`` and
        with ``since <= tick <= until``. Read-only."""
        ...

    def get_run_fire(self, run_id: str) -> ScheduleFire | None:
        """The tick record whose run is ``run_id``, or ``None``. Read-only."""
        ...

    def get_lease(self, name: str) -> NamedLease | None:
        """The named lease (:meth:`~dagwerk.store.BackstopStore.try_acquire_lease`)
        while it is live, else ``None``. Read-only."""
        ...


@runtime_checkable
class IdempotentSubmitStore(Protocol):
    """Runs created at most once per idempotency key (dagwerk extension)."""

    def create_run_once(
        self, key: str, fingerprint: str, run: NewRun, *, retention: float
    ) -> IdempotentRun:
        """In one transaction: if ``key`` is held (stored less than its
        retention ago), write nothing and return its run and fingerprint
        (``created=False``), whatever ``fingerprint`` and ``run`` are;
        otherwise store ``run`` PENDING and the key for ``retention`` seconds
        (replacing an expired key) and return ``created=True``. Of concurrent
        calls with one key, from any number of processes, exactly one creates.
        ``run`` is refused like ``create_run`` refuses it; a run ID that exists
        raises ``InvalidStoreValueError``; nothing is written then."""
        ...

    def purge_idempotency_keys(self, limit: int = 1_000) -> int:
        """Delete up to ``limit`` expired keys; how many were deleted."""
        ...
