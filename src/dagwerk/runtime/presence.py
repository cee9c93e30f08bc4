"""A worker's heartbeat record: what it serves, for the stall diagnosis.

Every worker over a :class:`~dagwerk.store.WorkerPresenceStore` records its
plugins and queues when it starts and then every ``interval`` seconds (wall
time, from a daemon thread, so a batch of long attempts does not silence
it); each record stays live for three intervals. A clean stop retires the
record; a killed worker's record expires, and the diagnosis then reports
"no live worker has plugin X" and "no worker seen for N s". A failed write
is logged and retried at the next beat: presence is observability, never a
reason to stop working.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence

from dagwerk.runtime.faults import FaultGate, log_failure
from dagwerk.store import WorkerPresenceStore

__all__ = ["PRESENCE_INTERVAL", "Presence"]

_LOG = logging.getLogger("dagwerk.runtime.presence")

PRESENCE_INTERVAL = 10.0
"""Seconds between a worker's heartbeats (its record is live for three)."""


class Presence:
    """Records ``worker_id`` in ``store`` while started; a store fault of a
    beat goes to ``faults``."""

    def __init__(
        self,
        store: WorkerPresenceStore,
        worker_id: str,
        *,
        plugins: Callable[[], Collection[str]],
        queues: Sequence[str] | None,
        interval: float = PRESENCE_INTERVAL,
        faults: FaultGate | None = None,
    ) -> None:
        self.store = store
        self._faults = faults
        self.worker_id = worker_id
        self.plugins = plugins
        self.queues = queues
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def beat(self) -> None:
        """Record the worker now (seen now, live for three intervals)."""
        try:
            self.store.record_worker(
                self.worker_id,
                plugins=self.plugins(),
                queues=self.queues,
                ttl_seconds=3 * self.interval,
            )
        except Exception as exc:
            log_failure(self._faults, _LOG, exc, f"recording worker {self.worker_id}")

    def start(self) -> None:
        """Beat now and then every interval from a daemon thread; idempotent."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self.beat()
            self._thread = threading.Thread(
                target=self._loop, name=f"dagwerk-presence-{self.worker_id}", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def stop(self) -> None:
        """Stop beating and retire the record (the worker stopped cleanly)."""
        with self._lock:
            self._stop.set()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        try:
            self.store.retire_worker(self.worker_id)
        except Exception as exc:
            log_failure(self._faults, _LOG, exc, f"retiring worker {self.worker_id}")
