"""Deleting old runs: a whole pass over a store, and the periodic one a
worker runs.

:func:`delete_runs` repeats
:meth:`~dagwerk.store_retention.RunRetentionStore.delete_finished_runs`
batch by batch (each one short transaction) until no root is left to
examine, and adds up what the batches deleted. :class:`PeriodicRetention`
runs a bounded slice of such a pass from a worker's background loop every
``interval`` seconds, under the store's named lease ``dagwerk.retention``
so that the workers of one database take turns rather than all scanning at
once (deleting from several processes at once is safe either way).
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Final

from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import RunStatus
from dagwerk.errors import DagwerkError
from dagwerk.runtime.clock import Clock, SystemClock
from dagwerk.runtime.faults import FaultGate, log_failure
from dagwerk.store import BackstopStore
from dagwerk.store_retention import (
    DEFAULT_RETENTION_BATCH,
    RetentionCursor,
    RunRetentionStore,
    check_retention_request,
)

__all__ = [
    "DEFAULT_RETENTION_INTERVAL",
    "RETENTION_LEASE",
    "PeriodicRetention",
    "RetentionConfigError",
    "RetentionPolicy",
    "RetentionSummary",
    "delete_runs",
    "parse_age",
]

_LOG = logging.getLogger("dagwerk.runtime.retention")

RETENTION_LEASE: Final = "dagwerk.retention"
DEFAULT_RETENTION_INTERVAL: Final = 300.0
"""Seconds between a worker's retention passes."""
DEFAULT_BATCHES_PER_PASS: Final = 10
"""Batches one periodic pass deletes at most before the worker's loop goes on."""
_BUSY_RETRIES: Final = 3
_BUSY: Final = "store_busy"

_UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_AGE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


class RetentionConfigError(DagwerkError, ValueError):
    """A retention setting that is not a valid age or interval."""

    code = "invalid_retention"


def parse_age(value: object, *, field: str = "older_than") -> float:
    """``value`` as seconds: a number, a :class:`~datetime.timedelta`, or text
    such as ``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, ``"2w"`` (a bare
    number is seconds). Negative, infinite or malformed values raise
    :class:`RetentionConfigError` naming ``field``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        match = _AGE.match(value)
        if match is None:
            raise RetentionConfigError(
                f"{field} must be an age such as 30d, 12h, 90m or 45s, got {value!r}",
                field=field,
            )
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise RetentionConfigError(
            f"{field} must be seconds, a timedelta or an age such as 30d, got {value!r}",
            field=field,
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise RetentionConfigError(f"{field} must be finite and >= 0, got {value!r}", field=field)
    return seconds


@dataclass(frozen=True, slots=True)
class RetentionSummary:
    """What a retention pass deleted (for a dry run: would delete)."""

    runs: int = 0
    """Runs deleted, children included."""
    rows: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Records deleted per kind (see :attr:`~dagwerk.store.RetentionBatch.rows`)."""
    passed: int = 0
    """Old roots kept because a run of their lineage is not terminal (or was
    busy in another transaction)."""
    batches: int = 0
    dry_run: bool = False
    complete: bool = True
    """False when the pass stopped at its batch bound with roots left."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", MappingProxyType(dict(self.rows)))


@dataclass(slots=True)
class _Tally:
    runs: int = 0
    rows: Counter[str] = field(default_factory=Counter)
    passed: int = 0
    batches: int = 0


def delete_runs(
    store: RunRetentionStore,
    *,
    older_than: object,
    statuses: Collection[RunStatus | str] | None = None,
    dry_run: bool = False,
    batch_size: int = DEFAULT_RETENTION_BATCH,
    max_batches: int | None = None,
    after: RetentionCursor | None = None,
    on_cursor: Callable[[RetentionCursor | None], None] | None = None,
) -> RetentionSummary:
    """Delete, a batch at a time, every terminal lineage whose root finished
    more than ``older_than`` (seconds, a timedelta or an age like ``"30d"``)
    ago with one of ``statuses`` (default: every terminal status); see
    :class:`~dagwerk.store_retention.RunRetentionStore` for the rules.

    Stops after ``max_batches`` batches when given (``complete`` is then
    False if roots are left; ``on_cursor`` receives where to go on, ``None``
    once the end was reached). A batch refused as busy is tried again a few
    times before the error propagates; what earlier batches deleted stays
    deleted.
    """
    age = parse_age(older_than)
    # Everything is checked before the first batch (the store checks again).
    check_retention_request(older_than=age, statuses=statuses, limit=batch_size, dry_run=dry_run)
    if max_batches is not None and (type(max_batches) is not int or max_batches < 1):
        raise RetentionConfigError("max_batches must be an int >= 1 or None", field="max_batches")
    tally = _Tally()
    cursor = after
    while max_batches is None or tally.batches < max_batches:
        for attempt in range(_BUSY_RETRIES + 1):
            try:
                batch = store.delete_finished_runs(
                    older_than=age,
                    statuses=statuses,
                    limit=batch_size,
                    after=cursor,
                    dry_run=dry_run,
                )
                break
            except DagwerkError as exc:
                # A database that stayed locked (code of the backends'
                # StoreBusyError): the batch changed nothing, so it is repeated.
                if exc.code != _BUSY or attempt == _BUSY_RETRIES:
                    raise
        tally.batches += 1
        tally.runs += len(batch.run_ids)
        tally.rows.update(batch.rows)
        tally.passed += len(batch.passed)
        cursor = batch.after
        if cursor is None:
            break
    if on_cursor is not None:
        on_cursor(cursor)
    return RetentionSummary(
        runs=tally.runs,
        rows=dict(tally.rows),
        passed=tally.passed,
        batches=tally.batches,
        dry_run=dry_run,
        complete=cursor is None,
    )


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """A worker's retention: delete runs finished ``older_than`` ago (seconds,
    a timedelta or an age like ``"30d"``) every ``interval`` seconds, at most
    ``batches_per_pass`` batches of ``batch_size`` runs per pass (a pass that
    stops with runs left goes on at the worker's next step)."""

    older_than: float | timedelta | str
    statuses: tuple[RunStatus, ...] | None = None
    interval: float = DEFAULT_RETENTION_INTERVAL
    batch_size: int = DEFAULT_RETENTION_BATCH
    batches_per_pass: int = DEFAULT_BATCHES_PER_PASS

    @property
    def seconds(self) -> float:
        return parse_age(self.older_than)


class PeriodicRetention:
    """The retention passes of one worker over ``store``; never raises into
    its caller (a failed pass is logged and tried again next interval; a
    store fault is ``faults``'s to say)."""

    def __init__(
        self,
        store: RunRetentionStore,
        policy: RetentionPolicy,
        *,
        leases: BackstopStore | None = None,
        clock: Clock | None = None,
        holder: str = "retention",
        faults: FaultGate | None = None,
    ) -> None:
        self.store = store
        self.faults = faults
        self.policy = policy
        self.older_than = policy.seconds
        interval = parse_age(policy.interval, field="interval")
        if interval <= 0:
            raise RetentionConfigError("interval must be > 0 seconds", field="interval")
        check_retention_request(
            older_than=self.older_than, statuses=policy.statuses, limit=policy.batch_size
        )
        if type(policy.batches_per_pass) is not int or policy.batches_per_pass < 1:
            raise RetentionConfigError(
                "batches_per_pass must be an int >= 1", field="batches_per_pass"
            )
        self.interval = interval
        self.leases = leases
        self.clock = clock or SystemClock()
        self.holder = holder
        self.last_summary: RetentionSummary | None = None
        self._cursor: RetentionCursor | None = None
        self._resume = False  # the last pass stopped with roots left
        self._last_monotonic: float | None = None
        self._lock = threading.Lock()
        self._running = False

    @classmethod
    def for_worker(
        cls,
        capabilities: StoreCapabilities,
        setting: float | timedelta | str | RetentionPolicy | None,
        *,
        clock: Clock,
        holder: str,
        faults: FaultGate | None = None,
    ) -> PeriodicRetention | None:
        """The worker's retention for its ``retention`` setting (``None``: none);
        a store without :class:`~dagwerk.store.RunRetentionStore` raises."""
        if setting is None:
            return None
        policy = setting if isinstance(setting, RetentionPolicy) else RetentionPolicy(setting)
        if capabilities.retention is None:
            raise RetentionConfigError(
                "retention needs a store that implements RunRetentionStore", field="retention"
            )
        return cls(
            capabilities.retention,
            policy,
            leases=capabilities.backstop,
            clock=clock,
            holder=holder,
            faults=faults,
        )

    def maybe_run(self) -> RetentionSummary | None:
        """Run a pass when one is due (the first call, ``interval`` after the
        last, or at once after a pass that stopped with runs left); its
        summary, or ``None`` when not due or another worker holds the lease."""
        with self._lock:
            now = self.clock.monotonic()
            due = (
                self._resume
                or self._last_monotonic is None
                or now - self._last_monotonic >= self.interval
            )
            if self._running or not due:
                return None
            self._running = True
        try:
            return self._pass()
        finally:
            with self._lock:
                self._last_monotonic = self.clock.monotonic()
                self._running = False

    def _pass(self) -> RetentionSummary | None:
        leases = self.leases
        try:
            lease_seconds = max(60.0, 2 * self.interval)
            if leases is not None and not leases.try_acquire_lease(
                RETENTION_LEASE, self.holder, lease_seconds
            ):
                self._resume = False
                return None
        except Exception as exc:
            log_failure(self.faults, _LOG, exc, "taking the retention lease")
            return None
        try:
            summary = delete_runs(
                self.store,
                older_than=self.older_than,
                statuses=self.policy.statuses,
                batch_size=self.policy.batch_size,
                max_batches=self.policy.batches_per_pass,
                after=self._cursor if self._resume else None,
                on_cursor=self._remember,
            )
        except Exception as exc:
            log_failure(self.faults, _LOG, exc, "the retention pass")
            self._resume = False
            return None
        finally:
            if leases is not None:
                try:
                    leases.release_lease(RETENTION_LEASE, self.holder)
                except Exception as exc:
                    log_failure(self.faults, _LOG, exc, "releasing the retention lease")
        self.last_summary = summary
        if summary.runs:
            _LOG.info("retention deleted %d runs in %d batches", summary.runs, summary.batches)
        return summary

    def _remember(self, cursor: RetentionCursor | None) -> None:
        self._cursor = cursor
        self._resume = cursor is not None
