"""One watcher thread per worker for every attempt of the batched path.

Every ``cancel_check_interval`` it reads the durable status of each run that
has a running attempt (once per run), fires the abort signal of every
attempt of a run that is no longer RUNNING, and extends the lease of every
other attempt to its ownership bound once a tenth of the lease has passed
since it was granted or last extended: what a watcher thread per attempt
did, without a thread start and join per attempt.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from dagwerk.constants import RunStatus

if TYPE_CHECKING:
    from dagwerk.runtime.attempts import Attempt
    from dagwerk.runtime.worker import Worker

__all__ = ["AttemptMonitor"]

_LOG = logging.getLogger("dagwerk.runtime.worker")


class AttemptMonitor:
    """Watches the attempts registered with it until :meth:`stop`."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self._lock = threading.Lock()
        self._attempts: dict[str, Attempt] = {}
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def add(self, attempt: Attempt) -> None:
        with self._lock:
            self._attempts[attempt.delivery.delivery_id] = attempt
            if self._thread is None and not self._stopped:
                # Started with the first attempt: an idle worker has no watcher.
                self._thread = threading.Thread(
                    target=self._loop, name="dagwerk-monitor", daemon=True
                )
                self._thread.start()

    def remove(self, attempt: Attempt) -> None:
        with self._lock:
            self._attempts.pop(attempt.delivery.delivery_id, None)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _loop(self) -> None:
        worker = self._worker
        while True:
            worker.clock.wait(self._wake, worker.cancel_check_interval)
            with self._lock:
                if self._stopped:
                    return
                attempts = list(self._attempts.values())
            try:
                self._check(attempts)
            except Exception:  # the watcher never dies of one bad read or write
                _LOG.exception("the attempt monitor failed a pass")

    def _check(self, attempts: list[Attempt]) -> None:
        worker = self._worker
        statuses: dict[str, RunStatus | None] = {}
        now = worker.clock.monotonic()
        for attempt in attempts:
            delivery, entry = attempt.delivery, attempt.entry
            if entry.finished:
                continue
            run_id = delivery.run_id
            if run_id not in statuses:
                statuses[run_id] = worker._safe_status(run_id)
            status = statuses[run_id]
            if status is not RunStatus.RUNNING:
                entry.signal.fire(f"run is {status}")
                continue
            if now - entry.last_beat < worker.lease_seconds / 10:
                # Granted or extended within the last tenth of the lease (as
                # heartbeats are folded): a write per attempt per pass would
                # only compete with the batches for the write lock.
                continue
            entry.last_beat = now
            worker.queue.extend_lease(delivery.delivery_id, worker.worker_id, attempt.bound)
