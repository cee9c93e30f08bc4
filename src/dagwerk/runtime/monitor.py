"""The worker's running attempts and the one watcher that follows them.

Both delivery paths register every attempt here before the run's final
status read (WK-15) and remove it once it is settled. One watcher thread,
started with the first attempt, reads every ``interval`` the durable status
of each run that has a running attempt (once per run), fires the abort
signal of every attempt of a run that is no longer RUNNING, and extends the
lease of every other attempt to its ownership bound once a tenth of the
lease has passed since it was granted or last extended.

:meth:`AttemptMonitor.abort_all` is the worker's stop: it fires every
registered attempt's signal, and the signal of any attempt registered
after it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dagwerk.constants import RunStatus
from dagwerk.runtime.attempts import Attempt
from dagwerk.runtime.clock import Clock
from dagwerk.runtime.faults import FaultGate, log_failure
from dagwerk.store import DagQueueStore

__all__ = ["AttemptMonitor"]

_LOG = logging.getLogger("dagwerk.runtime.worker")


class AttemptMonitor:
    """Watches the attempts registered with it until :meth:`stop`.

    ``status_of`` reads a run's status (``None`` when unreadable, which
    aborts as a run that is not RUNNING does); leases are extended in
    ``queue`` as ``worker_id``.
    """

    def __init__(
        self,
        status_of: Callable[[str], RunStatus | None],
        queue: DagQueueStore,
        *,
        worker_id: str,
        clock: Clock,
        interval: float,
        lease_seconds: float,
        faults: FaultGate | None = None,
    ) -> None:
        self._faults = faults
        self._status_of = status_of
        self._queue = queue
        self._worker_id = worker_id
        self._clock = clock
        self._interval = interval
        self._lease_seconds = lease_seconds
        self._lock = threading.Lock()
        self._attempts: dict[str, Attempt] = {}
        self._wake = threading.Event()
        self._aborting: str | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> int:
        """How many attempts are registered."""
        with self._lock:
            return len(self._attempts)

    def add(self, attempt: Attempt) -> None:
        """Register ``attempt``; after :meth:`abort_all` its signal fires at once."""
        with self._lock:
            self._attempts[attempt.delivery.delivery_id] = attempt
            aborting = self._aborting
            if self._thread is None and not self._stopped:
                # Started with the first attempt: an idle worker has no watcher.
                self._thread = threading.Thread(
                    target=self._loop, name="dagwerk-monitor", daemon=True
                )
                self._thread.start()
        if aborting is not None:
            attempt.entry.signal.fire(aborting)

    def remove(self, attempt: Attempt) -> None:
        """Forget ``attempt`` (its plugin is over and it is settled)."""
        with self._lock:
            self._attempts.pop(attempt.delivery.delivery_id, None)

    def abort_all(self, reason: str) -> None:
        """Fire the signal of every registered attempt, and of every attempt
        registered from now on, with ``reason``."""
        with self._lock:
            self._aborting = reason
            attempts = list(self._attempts.values())
        for attempt in attempts:
            attempt.entry.signal.fire(reason)

    def stop(self) -> None:
        """End the watcher thread (and wait for it, unless called from it)."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _loop(self) -> None:
        while True:
            self._clock.wait(self._wake, self._interval)
            with self._lock:
                if self._stopped:
                    return
                attempts = list(self._attempts.values())
            try:
                self._check(attempts)
            except Exception as exc:  # the watcher never dies of one bad read or write
                log_failure(self._faults, _LOG, exc, "the attempt monitor's pass")

    def _check(self, attempts: list[Attempt]) -> None:
        statuses: dict[str, RunStatus | None] = {}
        now = self._clock.monotonic()
        for attempt in attempts:
            delivery, entry = attempt.delivery, attempt.entry
            if entry.finished:
                continue
            run_id = delivery.run_id
            if run_id not in statuses:
                statuses[run_id] = self._status_of(run_id)
            status = statuses[run_id]
            if status is not RunStatus.RUNNING:
                entry.signal.fire(f"run is {status}")
                continue
            if now - entry.last_beat < self._lease_seconds / 10:
                # Granted or extended within the last tenth of the lease (as
                # heartbeats are folded): a write per attempt per pass would
                # only compete with the batches for the write lock.
                continue
            entry.last_beat = now
            self._queue.extend_lease(delivery.delivery_id, self._worker_id, attempt.bound)
