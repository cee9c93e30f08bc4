"""The scheduler: one pass turns every due tick into a run, under a lease.

Every worker (and ``dagwerk serve``) runs a :class:`SchedulerThread`; each
pass first reads who holds the store's named lease ``dagwerk.scheduler``
and, unless another live holder has it, takes or renews it (the lease the
backstop uses, under another name) and deals with each active schedule:

1. the ticks due since the schedule's cursor, chosen by its catch-up policy
   (``skip``: only a tick at most ``misfire_grace`` seconds late; ``latest``:
   the newest; ``all``: every one, at most ``catchup_limit`` of the newest);
2. per tick its overlap policy against the schedule's unfinished runs
   (``allow``; ``skip``: the tick is recorded as skipped; ``cancel_previous``:
   they are cancelled once the tick's run is created);
3. each tick becomes a run in one store transaction with its unique tick
   record (:func:`~dagwerk.scheduling.firing.fire_tick`), so whatever dies
   when, no tick becomes two runs; a run left PENDING by a process that died
   after the commit is started by the next pass;
4. the cursor moves to now: every tick up to now has been dealt with.

The holder keeps the lease between passes and gives it up when it stops; a
holder that dies loses it when it expires, and the next process to look
takes over. Time comes from an injected :class:`~dagwerk.runtime.clock.Clock`.
A pass never raises into its caller: errors are logged and reported.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import RUN_TERMINAL_STATUSES
from dagwerk.errors import DagwerkError
from dagwerk.orchestrator import cancel_run
from dagwerk.runtime.clock import Clock, SystemClock
from dagwerk.runtime.faults import FaultGate, log_failure
from dagwerk.store_schedules import ScheduleFire, ScheduleRecord

from .definitions import CatchupPolicy, FireSource, OverlapPolicy
from .firing import FireHook, SchedulingStore, fire_tick, start_pending

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_MISFIRE_GRACE",
    "DEFAULT_SCHEDULE_INTERVAL",
    "SCHEDULER_LEASE",
    "Scheduler",
    "SchedulerConfigError",
    "SchedulerReport",
    "SchedulerThread",
    "check_schedule_interval",
    "start_scheduler",
    "worker_scheduler",
]

_LOG = logging.getLogger("dagwerk.scheduling")

SCHEDULER_LEASE = "dagwerk.scheduler"
DEFAULT_SCHEDULE_INTERVAL = 1.0
"""Seconds between scheduler passes: how late a tick fires at most, normally."""
DEFAULT_LEASE_SECONDS = 30.0
"""How long a dead holder keeps the scheduling lease before another takes over."""
DEFAULT_MISFIRE_GRACE = 60.0
"""How late a tick may fire under catch-up ``skip``."""
RECENT_RUNS = 50
"""Runs of a schedule the overlap policies look at (its newest ticks)."""
PENDING_CHECKED = 3
"""Newest runs of a schedule each pass starts if they are still PENDING."""
PURGE_EVERY = 3_600.0
"""Seconds between purges of expired idempotency keys by one process."""


class SchedulerConfigError(DagwerkError, ValueError):
    """A scheduler setting that is not a duration."""

    code = "invalid_schedule_interval"


def check_schedule_interval(value: object, field: str = "schedule_interval") -> float | None:
    """``value`` as seconds between passes: ``None`` or ``0`` disable the
    scheduler (``None`` is returned); a positive finite number is kept."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SchedulerConfigError(
            f"{field} must be a number of seconds or None, got {value!r}", field=field
        )
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise SchedulerConfigError(
            f"{field} must be finite and >= 0 (0 disables it), got {value!r}", field=field
        )
    return seconds or None


@dataclass(frozen=True, slots=True)
class SchedulerReport:
    """What one pass did. ``ran`` is False when another process held the lease
    (or there was no active schedule)."""

    ran: bool
    fired: tuple[ScheduleFire, ...] = ()
    """Ticks this pass recorded (runs created, or skipped by overlap)."""
    cancelled: tuple[str, ...] = ()
    started: tuple[str, ...] = ()
    """PENDING runs of earlier passes this pass started."""
    errors: tuple[str, ...] = ()


@dataclass(slots=True)
class _Pass:
    fired: list[ScheduleFire] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Scheduler:
    """The scheduler of one process over ``store`` (a store with
    :class:`~dagwerk.store.ScheduleStore` and the backstop's named leases).

    ``holder`` names this process in the lease. ``on_fire`` is called after
    each tick's record and run commit and before the run starts (tests use it
    to kill a process at exactly that point). A store fault (a full disk, a
    server gone) is ``faults``'s to say, as for the worker's other loops
    (one line, repeats throttled); other errors are logged with their
    traceback.
    """

    def __init__(
        self,
        store: Any,
        *,
        clock: Clock | None = None,
        holder: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        misfire_grace: float = DEFAULT_MISFIRE_GRACE,
        on_fire: FireHook | None = None,
        faults: FaultGate | None = None,
    ) -> None:
        capabilities = StoreCapabilities.of(store)
        if capabilities.schedules is None or capabilities.backstop is None:
            raise SchedulerConfigError(
                "the scheduler needs a store that implements ScheduleStore and BackstopStore",
                field="store",
            )
        self.store: SchedulingStore = store
        self._leases = capabilities.backstop
        self._keys = capabilities.idempotent_submits
        self.clock = clock or SystemClock()
        self.holder = holder or f"scheduler-{uuid.uuid4().hex[:12]}"
        self.lease_seconds = lease_seconds
        self.misfire_grace = misfire_grace
        self.on_fire = on_fire
        self.faults = faults
        self.last_report: SchedulerReport | None = None
        self._last_purge: float | None = None
        self._holding = False

    # --- the lease ---------------------------------------------------------------

    def _take_lease(self) -> bool:
        lease = self.store.get_lease(SCHEDULER_LEASE)
        if lease is not None and lease.holder != self.holder:
            self._holding = False
            return False
        self._holding = self._leases.try_acquire_lease(
            SCHEDULER_LEASE, self.holder, self.lease_seconds
        )
        return self._holding

    def release(self) -> None:
        """Give up the lease if this scheduler holds it (at stop)."""
        if self._holding:
            self._holding = False
            try:
                self._leases.release_lease(SCHEDULER_LEASE, self.holder)
            except Exception as exc:
                log_failure(self.faults, _LOG, exc, "releasing the scheduling lease")

    # --- one pass ----------------------------------------------------------------

    def run_pass(self) -> SchedulerReport:
        """One pass over every active schedule, under the lease."""
        try:
            report = self._run_pass()
        except Exception as exc:  # a pass never raises into its caller
            log_failure(self.faults, _LOG, exc, "the scheduler pass")
            report = SchedulerReport(ran=False, errors=(_describe(exc),))
        self.last_report = report
        return report

    def _run_pass(self) -> SchedulerReport:
        active = [record for record in self.store.list_schedules() if not record.paused]
        if not active:
            self.release()
            return SchedulerReport(ran=False)
        if not self._take_lease():
            return SchedulerReport(ran=False)
        self._purge_keys()
        state = _Pass()
        for index, record in enumerate(active):
            if index and not self._take_lease():
                state.errors.append("scheduling lease lost during the pass")
                _LOG.warning("scheduling lease lost; ending the pass early")
                break
            try:
                self._schedule(record, state)
            except Exception as exc:  # one schedule never stops the pass
                log_failure(self.faults, _LOG, exc, f"scheduling {record.name}")
                state.errors.append(f"{record.name}: {_describe(exc)}")
        return SchedulerReport(
            ran=True,
            fired=tuple(state.fired),
            cancelled=tuple(state.cancelled),
            started=tuple(state.started),
            errors=tuple(state.errors),
        )

    def _purge_keys(self) -> None:
        if self._keys is None:
            return
        now = self.clock.monotonic()
        if self._last_purge is not None and now - self._last_purge < PURGE_EVERY:
            return
        self._last_purge = now
        try:
            self._keys.purge_idempotency_keys()
        except Exception as exc:
            log_failure(self.faults, _LOG, exc, "purging expired idempotency keys")

    def due_ticks(self, record: ScheduleRecord, now: float) -> list[int] | None:
        """The ticks of ``record`` this pass fires at ``now``, oldest first;
        ``None`` when no tick is due at all (an empty list: ticks are due
        but the catch-up policy fires none of them)."""
        definition = record.definition
        after = record.cursor
        if definition.start_at is not None:
            after = max(after, definition.start_at - 1)
        until = now if definition.end_at is None else min(now, float(definition.end_at))
        if until <= after:
            return None
        trigger = definition.trigger()
        newest = trigger.newest(after, until, 1)
        if not newest:
            return None
        if definition.catchup is CatchupPolicy.ALL:
            return trigger.newest(after, until, definition.catchup_limit)
        if definition.catchup is CatchupPolicy.SKIP and now - newest[0] > self.misfire_grace:
            return []
        return newest

    def _schedule(self, record: ScheduleRecord, state: _Pass) -> None:
        store = self.store
        now = self.clock.time()
        recent = store.list_schedule_fires(
            record.schedule_id, limit=RECENT_RUNS, source=FireSource.SCHEDULE
        )
        # A process that died between a tick's commit and its start left the
        # run PENDING; it is one of the newest.
        state.started.extend(start_pending(store, recent[:PENDING_CHECKED]))
        ticks = self.due_ticks(record, now)
        if ticks is None:
            return  # nothing due: the cursor needs no write
        overlap = record.definition.overlap
        for tick in ticks:
            unfinished = [] if overlap is OverlapPolicy.ALLOW else self._unfinished(recent)
            outcome = fire_tick(
                store,
                record,
                tick,
                source=FireSource.SCHEDULE,
                skip=overlap is OverlapPolicy.SKIP and bool(unfinished),
                advance_cursor=True,
                on_fire=self.on_fire,
            )
            fire = outcome.fire
            if fire is None:
                return  # deleted meanwhile
            if outcome.created:
                state.fired.append(fire)
                if fire.run_id is None:
                    _LOG.info("schedule %s: tick %s skipped (overlap)", record.name, tick)
                else:
                    _LOG.info("schedule %s: tick %s started run %s", record.name, tick, fire.run_id)
            if overlap is OverlapPolicy.CANCEL_PREVIOUS and fire.run_id is not None:
                # Every unfinished run but the newest tick's, also those a
                # process that died before its cancels left going.
                reason = f"schedule {record.name}: a newer tick started"
                for run_id in unfinished:
                    if run_id != fire.run_id and cancel_run(store, run_id, reason=reason):
                        state.cancelled.append(run_id)
            recent = [fire, *recent][:RECENT_RUNS]
        store.advance_schedule_cursor(record.schedule_id, now)

    def _unfinished(self, fires: list[ScheduleFire]) -> list[str]:
        found: list[str] = []
        for fire in fires:
            if fire.run_id is None:
                continue
            status = self.store.get_run_status(fire.run_id)
            if status is not None and status not in RUN_TERMINAL_STATUSES:
                found.append(fire.run_id)
        return found


class SchedulerThread:
    """A :class:`Scheduler` run every ``interval`` seconds in a daemon thread.

    It waits in real time between passes (``Event.wait``) and reads the time
    of each pass from the scheduler's clock, so a test's fake clock decides
    which ticks are due without the thread parking on it.
    """

    def __init__(self, scheduler: Scheduler, interval: float = DEFAULT_SCHEDULE_INTERVAL) -> None:
        seconds = check_schedule_interval(interval, "interval")
        if seconds is None:
            raise SchedulerConfigError("interval must be > 0", field="interval")
        self.scheduler = scheduler
        self.interval = seconds
        self.on_report: Callable[[SchedulerReport], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start passing; idempotent."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._loop, name="dagwerk-scheduler", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop after the pass in flight and give up the lease; idempotent."""
        with self._lock:
            thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join(timeout)
        self.scheduler.release()

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.is_set():
            report = self.scheduler.run_pass()
            if self.on_report is not None:
                try:
                    self.on_report(report)
                except Exception:
                    _LOG.exception("scheduler report hook failed")
            self._stop.wait(self.interval)


def start_scheduler(
    store: Any,
    *,
    interval: float = DEFAULT_SCHEDULE_INTERVAL,
    clock: Clock | None = None,
    holder: str | None = None,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
) -> SchedulerThread:
    """Take part in scheduling from this process: a started
    :class:`SchedulerThread` over ``store`` (``engine.store``); ``stop()`` it
    when the process shuts down. ``dagwerk serve`` calls this."""
    thread = SchedulerThread(
        Scheduler(store, clock=clock, holder=holder, lease_seconds=lease_seconds), interval
    )
    thread.start()
    return thread


def worker_scheduler(
    store: Any,
    *,
    interval: float | None,
    clock: Clock | None,
    holder: str,
    faults: FaultGate | None = None,
) -> SchedulerThread | None:
    """The scheduler thread of a worker (not started), or ``None`` when
    ``interval`` is ``None``/0 or the store keeps no schedules; its store
    faults go to the worker's ``faults``."""
    seconds = check_schedule_interval(interval)
    capabilities = StoreCapabilities.of(store)
    if seconds is None or capabilities.schedules is None or capabilities.backstop is None:
        return None
    return SchedulerThread(Scheduler(store, clock=clock, holder=holder, faults=faults), seconds)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
