"""Worker presence of the in-memory store (the reference for
:class:`~dagwerk.store.WorkerPresenceStore`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dagwerk.store import (
    WORKER_RECORDS_KEPT_SECONDS,
    ExpiredLease,
    WorkerRecord,
    check_worker_presence,
    validate_plugin_names,
    validate_queue_names,
    validate_worker_id,
)

from ._base import MemoryStoreBase


@dataclass(frozen=True, slots=True)
class _Presence:
    plugins: tuple[str, ...]
    queues: tuple[str, ...] | None
    seen_at: float
    expires_at: float


class WorkersMixin(MemoryStoreBase):
    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self._workers: dict[str, _Presence] = {}

    def record_worker(
        self,
        worker_id: str,
        *,
        plugins: Collection[str],
        queues: Sequence[str] | None,
        ttl_seconds: float,
    ) -> None:
        request = check_worker_presence(worker_id, plugins, queues, ttl_seconds)
        with self._lock:
            now = float(self._clock())
            horizon = now - WORKER_RECORDS_KEPT_SECONDS
            for stale in [w for w, p in self._workers.items() if p.expires_at < horizon]:
                del self._workers[stale]
            self._workers[worker_id] = _Presence(
                request.plugins, request.queues, now, now + request.ttl_seconds
            )

    def retire_worker(self, worker_id: str) -> bool:
        with self._lock:
            now = float(self._clock())
            found = self._workers.get(worker_id)
            if found is None or found.expires_at <= now:
                return False
            self._workers[worker_id] = replace(found, expires_at=now)
            return True

    def list_workers(self) -> list[WorkerRecord]:
        with self._lock:
            now = float(self._clock())
            found = [
                WorkerRecord(
                    worker_id,
                    presence.plugins,
                    presence.queues,
                    max(0.0, now - presence.seen_at),
                    presence.expires_at > now,
                )
                for worker_id, presence in self._workers.items()
            ]
        return sorted(found, key=lambda w: (w.seen_seconds_ago, w.worker_id))

    def list_expired_leases(self, run_id: str | None = None) -> list[ExpiredLease]:
        with self._lock:
            now = float(self._clock())
            found: list[tuple[float, int, ExpiredLease]] = []
            for delivery_id, row in self._queue.items():
                expires = row.lease_expires_at
                if row.lease_owner is None or expires is None or expires > now:
                    continue
                if run_id is not None and row.run_id != run_id:
                    continue
                delivery = self._deliveries[delivery_id]
                lease = ExpiredLease(
                    delivery_id,
                    delivery.task_id,
                    delivery.attempt_id,
                    delivery.run_id,
                    delivery.node_index,
                    row.lease_owner,
                    now - expires,
                )
                found.append((expires, row.seq, lease))
        return [lease for *_, lease in sorted(found, key=lambda item: (item[0], item[1]))]

    def next_delivery_in(
        self,
        *,
        queues: Sequence[str] | None = None,
        plugins: Collection[str] | None = None,
        worker_id: str | None = None,
    ) -> float | None:
        names = validate_queue_names(queues)
        served = validate_plugin_names(plugins)
        if worker_id is not None:
            validate_worker_id(worker_id)
        with self._lock:
            now = float(self._clock())
            # A claim sets available_at to the lease's end: a row under the
            # asking worker's own lease is due when that lease ends.
            times = [
                row.available_at
                for row in self._queue.values()
                if (
                    row.lease_owner is None
                    or (row.lease_expires_at or 0.0) <= now
                    or (worker_id is not None and row.lease_owner == worker_id)
                )
                and (names is None or row.queue in names)
                and (served is None or row.plugin in served)
            ]
        return None if not times else max(0.0, min(times) - now)
