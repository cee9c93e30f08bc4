"""Worker presence (dagwerk extension): which workers are alive, what they
serve, and the leases they left behind.

Re-exported by :mod:`dagwerk.store`; import the names from there.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A worker as its latest heartbeat recorded it: the plugins it serves,
    its queues (``None``: every queue), and, measured by the store's clock
    when read, how long ago it was seen and whether its record is still live."""

    worker_id: str
    plugins: tuple[str, ...]
    queues: tuple[str, ...] | None
    seen_seconds_ago: float
    live: bool

    def serves(self, plugin: str, queue: str) -> bool:
        """Whether this worker dequeues rows of ``plugin`` in ``queue``."""
        return plugin in self.plugins and (self.queues is None or queue in self.queues)


@dataclass(frozen=True, slots=True)
class ExpiredLease:
    """A queue row whose lease ran out without an ack: the worker holding it
    stopped extending it (it died or hung) and no worker has leased it since."""

    delivery_id: str
    task_id: str
    attempt_id: str
    run_id: str
    node_index: int
    worker_id: str
    expired_seconds_ago: float


WORKER_RECORDS_KEPT_SECONDS = 86_400.0
"""How long after its last heartbeat a worker's record is kept (then pruned)."""


@runtime_checkable
class WorkerPresenceStore(Protocol):
    """Which workers are alive and what they serve (dagwerk extension).

    Every worker records itself when it starts and at a fixed interval, and
    retires its record when it stops; the stall diagnosis and ``/healthz``
    read the records to tell "no live worker has plugin X" and "no worker
    seen for N s". Records are bounded: one row
    per worker, pruned :data:`WORKER_RECORDS_KEPT_SECONDS` after its last
    heartbeat. Time comes from the store's clock; each method is one
    transaction.
    """

    def record_worker(
        self,
        worker_id: str,
        *,
        plugins: Collection[str],
        queues: Sequence[str] | None,
        ttl_seconds: float,
    ) -> None:
        """Insert or replace the worker's record: seen now, live for
        ``ttl_seconds``; prunes records past the retention."""
        ...

    def retire_worker(self, worker_id: str) -> bool:
        """The worker stopped cleanly: its record stops being live now and is
        kept (with when it was last seen) until pruned. True iff a live
        record was retired."""
        ...

    def list_workers(self) -> list[WorkerRecord]:
        """Every kept record, most recently seen first. Read-only."""
        ...

    def list_expired_leases(self, run_id: str | None = None) -> list[ExpiredLease]:
        """Queue rows (of ``run_id``, or of every run) still held under a lease
        that has expired, longest expired first. Read-only."""
        ...
