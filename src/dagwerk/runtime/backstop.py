"""The periodic backstop of gated dispatch (seed 004, GD-09/GD-12).

Every event-driven path of the engine (a task settles, then the worker
reconciles its run) can be lost: a process dies between the commit and the
reconcile, a delivery row disappears. The backstop closes those holes by
re-deriving every RUNNING run from durable state, independently of any
event. One pass, per run:

1. re-creates the queue row of a QUEUED task whose row is missing
   (``repair_missing_deliveries``) and logs it as a repaired invariant
   violation;
2. reconciles the run (``reconcile_run``): ready nodes are launched, the
   failure policy is applied (``stop_on_first_failure`` launches nothing new
   after a failure) and a run whose work is all settled is finalised;
3. diagnoses the run (:func:`dagwerk.stall.diagnose_run`) and reports a
   stall (a run with a node plainly live, as the store's ``has_live_node``
   answers from one indexed probe, is not stalled and is not read in full):
   a WARN log line naming the run, the held nodes and the reason,
   once per stall (the stall is persisted with ``try_record_stall``; a run
   that stops being stalled is cleared, so a later stall is a new one).

Passes never overlap, even across processes: each pass holds the store's
named lease ``dagwerk.backstop`` and renews it between runs; a worker that
cannot take it skips the pass. The backstop never raises into its caller:
a failing run or read is reported and the pass goes on.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import RunStatus
from dagwerk.errors import DagwerkError
from dagwerk.orchestrator import OrchestratorCallbacks, reconcile_run
from dagwerk.runtime.clock import Clock, SystemClock
from dagwerk.runtime.faults import FaultGate, log_failure
from dagwerk.stall import RunDiagnosis, diagnose_run
from dagwerk.store import ExpiredLease, WorkerRecord

__all__ = [
    "BACKSTOP_LEASE",
    "DEFAULT_BACKSTOP_INTERVAL",
    "Backstop",
    "BackstopConfigError",
    "BackstopReport",
    "StallReport",
    "check_backstop_interval",
    "diagnose_stored_run",
]

_LOG = logging.getLogger("dagwerk.runtime.backstop")

BACKSTOP_LEASE = "dagwerk.backstop"
DEFAULT_BACKSTOP_INTERVAL = 30.0
# Runs examined per pass; like the sweep, a backstop is not a scan of history.
BACKSTOP_RUN_LIMIT = 10_000


def _noop(run_id: str) -> None:
    return None


class BackstopConfigError(DagwerkError, ValueError):
    """A backstop setting that is not a duration (GD-17)."""

    code = "invalid_backstop_interval"


def check_backstop_interval(value: object) -> float | None:
    """``value`` as a backstop interval in seconds: ``None`` or ``0`` disable the
    periodic passes (``None`` is returned), a positive finite number is kept;
    anything else (negative, NaN, infinite, a bool, text) raises
    :class:`BackstopConfigError` naming the field ``backstop_interval``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BackstopConfigError(
            f"backstop_interval must be a number of seconds or None, got {value!r}",
            field="backstop_interval",
        )
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise BackstopConfigError(
            f"backstop_interval must be finite and >= 0 (0 disables it), got {value!r}",
            field="backstop_interval",
        )
    return seconds or None


@dataclass(frozen=True, slots=True)
class StallReport:
    """A run found stalled by a pass; ``new`` when this pass recorded the stall."""

    run_id: str
    held_nodes: tuple[str, ...]
    reason: str
    new: bool


@dataclass(frozen=True, slots=True)
class BackstopReport:
    """What one pass did. ``ran`` is False when another holder had the lease."""

    ran: bool
    runs: int = 0
    repaired: tuple[tuple[str, str], ...] = ()
    """``(run_id, task_id)`` of every delivery the pass re-created."""
    finalised: tuple[tuple[str, RunStatus], ...] = ()
    """Runs this pass moved to a terminal status."""
    stalls: tuple[StallReport, ...] = ()
    errors: tuple[str, ...] = ()
    duration: float = 0.0
    started_at: float = 0.0


def diagnose_stored_run(store: Any, run_id: str) -> RunDiagnosis | None:
    """Read a run's durable facts and diagnose it; ``None`` for a missing run.

    WAITING tasks are aged from the start their wait record holds (a
    ``BackstopStore``); with a store without ``wait_ages`` they count as fresh.
    Read-only: explaining a run (``show --why``) changes nothing.
    """
    record = store.get_run(run_id)
    nodes = store.get_run_nodes(run_id)
    if record is None or nodes is None:
        return None
    # Deliveries before tasks: a row acked in between is seen with its task
    # already settled, never as a QUEUED task without a row.
    delivered = {(d.task_id, d.attempt_id) for d in store.list_deliveries(run_id)}
    ages: Mapping[str, float] = {}
    capabilities = StoreCapabilities.of(store)
    if record.status is RunStatus.RUNNING and capabilities.wait_ages is not None:
        ages = capabilities.wait_ages.wait_ages(run_id)
    workers: list[WorkerRecord] | None = None
    expired: list[ExpiredLease] = []
    if record.status is RunStatus.RUNNING and capabilities.presence is not None:
        workers = capabilities.presence.list_workers()
        expired = capabilities.presence.list_expired_leases(run_id)
    launches = store.list_node_launches(run_id)
    tasks = store.list_tasks(run_id)
    return diagnose_run(
        run_id,
        record.status,
        nodes,
        launches,
        tasks,
        failure_policy=record.failure_policy,
        delivered=delivered,
        wait_ages=ages,
        workers=workers,
        expired_leases=expired,
    )


@dataclass(slots=True)
class _Pass:
    live_workers: list[WorkerRecord] | None = None
    """The live workers, read once per pass (``None``: not known)."""
    repaired: list[tuple[str, str]] = field(default_factory=list)
    finalised: list[tuple[str, RunStatus]] = field(default_factory=list)
    stalls: list[StallReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Backstop:
    """The backstop of one worker (or engine) over ``store``.

    ``interval`` seconds between passes (``None`` or ``0`` disables
    :meth:`maybe_run`; :meth:`run_pass` always works). ``on_pass`` is called
    with ``"start"`` and ``"end"`` while the lease is held (tests use it to
    observe that passes never overlap). ``on_report`` receives every report.
    """

    def __init__(
        self,
        store: Any,
        *,
        interval: float | None = DEFAULT_BACKSTOP_INTERVAL,
        clock: Clock | None = None,
        holder: str | None = None,
        callbacks: OrchestratorCallbacks | None = None,
        lease_seconds: float | None = None,
        on_pass: Callable[[str], None] | None = None,
        on_report: Callable[[BackstopReport], None] | None = None,
        faults: FaultGate | None = None,
    ) -> None:
        self.store = store
        self._faults = faults
        self._capabilities = StoreCapabilities.of(store)
        self.interval = check_backstop_interval(interval)
        self.clock = clock or SystemClock()
        self.holder = holder or f"backstop-{uuid.uuid4().hex[:12]}"
        self.callbacks = callbacks or OrchestratorCallbacks(_noop, _noop, _noop, _noop)
        base = self.interval if self.interval is not None else DEFAULT_BACKSTOP_INTERVAL
        self.lease_seconds = lease_seconds or max(60.0, 2 * base)
        self.on_pass = on_pass
        self.on_report = on_report
        self.last_pass_at: float | None = None
        """Clock time (``clock.time()``) at which the last pass that ran ended."""
        self.last_report: BackstopReport | None = None
        self._lock = threading.Lock()
        self._running = False
        self._last_monotonic: float | None = None

    @property
    def enabled(self) -> bool:
        return self.interval is not None and self.interval > 0

    def maybe_run(self) -> BackstopReport | None:
        """Run a pass if enabled, none ran in this process within ``interval``
        and none is running here; the report, or ``None`` when throttled. The
        first call after construction runs (the pass at worker start)."""
        if not self.enabled:
            return None
        assert self.interval is not None
        with self._lock:
            now = self.clock.monotonic()
            if self._running or (
                self._last_monotonic is not None and now - self._last_monotonic < self.interval
            ):
                return None
            self._running = True
        try:
            return self.run_pass()
        finally:
            with self._lock:
                self._last_monotonic = self.clock.monotonic()
                self._running = False

    def run_pass(self) -> BackstopReport:
        """One pass over every RUNNING run, under the store's named lease."""
        started = self.clock.monotonic()
        started_at = self.clock.time()
        try:
            acquired = self.store.try_acquire_lease(BACKSTOP_LEASE, self.holder, self.lease_seconds)
        except Exception as exc:
            log_failure(self._faults, _LOG, exc, "taking the backstop's lease")
            return self._finish(
                BackstopReport(ran=False, errors=(_describe(exc),), started_at=started_at)
            )
        if not acquired:
            return self._finish(BackstopReport(ran=False, started_at=started_at))
        state = _Pass()
        runs = 0
        try:
            if self.on_pass is not None:
                self.on_pass("start")
            runs = self._pass(state)
            if self.on_pass is not None:
                self.on_pass("end")
        except Exception as exc:  # the backstop never raises into its caller
            log_failure(self._faults, _LOG, exc, "the backstop pass")
            state.errors.append(_describe(exc))
        finally:
            try:
                self.store.release_lease(BACKSTOP_LEASE, self.holder)
            except Exception as exc:
                log_failure(self._faults, _LOG, exc, "releasing the backstop's lease")
        report = BackstopReport(
            ran=True,
            runs=runs,
            repaired=tuple(state.repaired),
            finalised=tuple(state.finalised),
            stalls=tuple(state.stalls),
            errors=tuple(state.errors),
            duration=max(0.0, self.clock.monotonic() - started),
            started_at=started_at,
        )
        if not state.errors:
            self.last_pass_at = self.clock.time()
        return self._finish(report)

    def _finish(self, report: BackstopReport) -> BackstopReport:
        self.last_report = report
        if self.on_report is not None:
            try:
                self.on_report(report)
            except Exception:
                _LOG.exception("backstop report hook failed")
        return report

    # --- one pass ------------------------------------------------------------------

    def _pass(self, state: _Pass) -> int:
        store = self.store
        presence = self._capabilities.presence
        if presence is not None:
            recorded = presence.list_workers()
            # No worker ever recorded itself: nothing is known of them.
            state.live_workers = [w for w in recorded if w.live] if recorded else None
        runs = store.list_runs(status=RunStatus.RUNNING, limit=BACKSTOP_RUN_LIMIT)
        running = {run.run_id for run in runs}
        if len(runs) >= BACKSTOP_RUN_LIMIT:
            # GD-13: a capped read says so. list_runs returns the newest runs
            # first, so the oldest RUNNING runs beyond the cap go unexamined.
            _LOG.warning(
                "backstop pass truncated: examining only %d RUNNING runs (the cap)",
                BACKSTOP_RUN_LIMIT,
            )
        for run in runs:
            # Renewing between runs keeps a long pass exclusive; a lost lease
            # (another holder took it after expiry) ends this pass.
            if not store.try_acquire_lease(BACKSTOP_LEASE, self.holder, self.lease_seconds):
                state.errors.append("backstop lease lost during the pass")
                _LOG.warning("backstop lease lost; ending the pass early")
                break
            try:
                self._run(run.run_id, state)
            except Exception as exc:  # one run never stops the pass
                _LOG.exception("backstop failed on run %s", run.run_id)
                state.errors.append(f"{run.run_id}: {_describe(exc)}")
        if len(runs) < BACKSTOP_RUN_LIMIT:
            # Stalls of runs that are no longer RUNNING are over.
            for stall in store.list_stalls():
                if stall.run_id not in running:
                    store.clear_stall(stall.run_id)
        return len(runs)

    def _run(self, run_id: str, state: _Pass) -> None:
        store = self.store
        for task_id in store.repair_missing_deliveries(run_id):
            state.repaired.append((run_id, task_id))
            _LOG.warning(
                "repaired invariant violation: run %s task %s was QUEUED without a delivery; "
                "its delivery was re-created",
                run_id,
                task_id,
            )
        finalised: list[RunStatus] = []

        def record(status: RunStatus) -> Callable[[str], None]:
            def fire(fired_run: str) -> None:
                finalised.append(status)
                self.callbacks.fire(status, fired_run)

            return fire

        callbacks = OrchestratorCallbacks(
            record(RunStatus.COMPLETED),
            record(RunStatus.FAILED),
            record(RunStatus.CRASHED),
            record(RunStatus.CANCELLED),
        )
        reconcile_run(store, run_id, callbacks=callbacks)
        for status in finalised:
            state.finalised.append((run_id, status))
            _LOG.info("backstop finalised run %s as %s", run_id, status.value)
        if finalised:
            store.clear_stall(run_id)
            return
        self._check_stall(run_id, state)

    def _all_served(self, run_id: str, live: list[WorkerRecord] | None) -> bool:
        """Whether a live worker serves every node's plugin and queue (or the
        workers are not known): only then does a live node prove progress."""
        if live is None:
            return True
        nodes = self.store.get_run_nodes(run_id)
        if nodes is None:
            return True
        return all(any(w.serves(n.plugin, n.queue) for w in live) for n in nodes)

    def _check_stall(self, run_id: str, state: _Pass) -> None:
        store = self.store
        live = self._capabilities.live_nodes
        if (
            live is not None
            and self._all_served(run_id, state.live_workers)
            and live.has_live_node(run_id)
        ):
            # A node can progress, so the run is not stalled: known without
            # the diagnosis, which reads every task (a pass over a run of
            # 100,000 tasks held the worker's loop for seconds).
            store.clear_stall(run_id)
            return
        first = diagnose_stored_run(store, run_id)
        if first is None or first.stall is None:
            store.clear_stall(run_id)
            return
        # Reads of one diagnosis are not one snapshot: a stall counts only if a
        # second, later read agrees on the held nodes.
        second = diagnose_stored_run(store, run_id)
        if (
            second is None
            or second.stall is None
            or second.stall.held_nodes != first.stall.held_nodes
        ):
            return
        stall = second.stall
        slugs = tuple(second.nodes[index].slug for index in stall.held_nodes)
        new = store.try_record_stall(run_id, stall.reason, stall.held_nodes)
        state.stalls.append(StallReport(run_id, slugs, stall.reason, new))
        if new:
            _LOG.warning(
                "run %s stalled: held nodes %s: %s", run_id, ", ".join(slugs), stall.reason
            )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
