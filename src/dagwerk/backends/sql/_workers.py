"""Worker presence of the SQL store (see :class:`~dagwerk.store.WorkerPresenceStore`)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence

from dagwerk.store import (
    WORKER_RECORDS_KEPT_SECONDS,
    ExpiredLease,
    WorkerRecord,
    check_worker_presence,
)

from ._base import SqlStoreBase


class WorkersMixin(SqlStoreBase):
    def record_worker(
        self,
        worker_id: str,
        *,
        plugins: Collection[str],
        queues: Sequence[str] | None,
        ttl_seconds: float,
    ) -> None:
        request = check_worker_presence(worker_id, plugins, queues, ttl_seconds)
        queue_names = request.queues
        with self._gw.write() as tx:
            now = self._now()
            tx.run("workers_prune", {"horizon": now - WORKER_RECORDS_KEPT_SECONDS})
            tx.run(
                "worker_upsert",
                {
                    "worker_id": worker_id,
                    "plugins": json.dumps(request.plugins),
                    "queues": None if queue_names is None else json.dumps(queue_names),
                    "now": now,
                    "expires": now + request.ttl_seconds,
                },
            )

    def retire_worker(self, worker_id: str) -> bool:
        with self._gw.write() as tx:
            now = self._now()
            return tx.run("worker_retire", {"worker_id": worker_id, "now": now}) == 1

    def list_workers(self) -> list[WorkerRecord]:
        with self._gw.read() as tx:
            now = self._now()
            rows = tx.all("workers_list", {})
        return [
            WorkerRecord(
                worker_id=row["worker_id"],
                plugins=tuple(json.loads(row["plugins"])),
                queues=None if row["queues"] is None else tuple(json.loads(row["queues"])),
                seen_seconds_ago=max(0.0, now - row["seen_at"]),
                live=row["expires_at"] > now,
            )
            for row in rows
        ]

    def list_expired_leases(self, run_id: str | None = None) -> list[ExpiredLease]:
        with self._gw.read() as tx:
            now = self._now()
            rows = tx.all("leases_expired", {"now": now, "run_id": run_id})
        return [
            ExpiredLease(
                delivery_id=row["delivery_id"],
                task_id=row["task_id"],
                attempt_id=row["attempt_id"],
                run_id=row["run_id"],
                node_index=row["node_index"],
                worker_id=row["lease_owner"],
                expired_seconds_ago=now - row["lease_expires_at"],
            )
            for row in rows
        ]
