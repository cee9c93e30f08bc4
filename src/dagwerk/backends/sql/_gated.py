"""The backstop operations of the SQL store (:class:`~dagwerk.store.BackstopStore`)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from dagwerk.backends.requests import check_name, check_stall
from dagwerk.constants import RunStatus
from dagwerk.store import QueueStats, StallRecord, validate_seconds

from ._base import SqlStoreBase


class GatedMixin(SqlStoreBase):
    # Wait ages count from dagwerk_waits.waited_at.
    def try_acquire_lease(self, name: str, holder: str, seconds: float) -> bool:
        check_name(name, "name")
        check_name(holder, "holder")
        span = validate_seconds(seconds, "seconds", positive=True)
        with self._gw.write() as tx:
            now = self._now()
            changed = tx.run(
                "gated_lease_acquire",
                {"name": name, "holder": holder, "expires": now + span, "now": now},
            )
            return changed == 1

    def release_lease(self, name: str, holder: str) -> bool:
        if not isinstance(name, str) or not isinstance(holder, str):
            return False
        with self._gw.write() as tx:
            return tx.run("gated_lease_release", {"name": name, "holder": holder}) == 1

    def repair_missing_deliveries(self, run_id: str) -> list[str]:
        if not isinstance(run_id, str):
            return []
        with self._gw.write() as tx:
            # The run lock first: no launch, claim or ack of this run interleaves.
            run = tx.one("gated_run_lock", {"run_id": run_id})
            if run is None or run["status"] != "running":
                return []
            repaired: list[str] = []
            for task in tx.all("gated_queued_without_delivery", {"run_id": run_id}):
                self._enqueue(tx, task, task["attempt_id"], delivery_count=task["lost_deliveries"])
                repaired.append(task["task_id"])
            return repaired

    def wait_ages(self, run_id: str) -> Mapping[str, float]:
        if not isinstance(run_id, str):
            return {}
        with self._gw.read() as tx:
            now = self._now()
            rows = tx.all("gated_wait_ages", {"run_id": run_id})
            return {row["task_id"]: max(0.0, now - float(row["waited_at"])) for row in rows}

    def running_without_delivery(self, run_id: str) -> list[tuple[str, str]]:
        if not isinstance(run_id, str):
            return []
        with self._gw.read() as tx:
            rows = tx.all("tasks_running_without_delivery", {"run_id": run_id})
            return [(row["task_id"], row["attempt_id"]) for row in rows]

    def has_live_node(self, run_id: str) -> bool:
        if not isinstance(run_id, str):
            return False
        with self._gw.read() as tx:
            return tx.one("gated_live_node", {"run_id": run_id}) is not None

    def try_record_stall(self, run_id: str, reason: str, held_nodes: tuple[int, ...]) -> bool:
        held = check_stall(run_id, reason, held_nodes)
        params = {
            "run_id": run_id,
            "reason": reason,
            "held_nodes": json.dumps(held),
            "now": self._now(),
        }
        with self._gw.write() as tx:
            if tx.run("gated_stall_insert", params) == 1:
                return True
            tx.run("gated_stall_update", params)
            return False

    def clear_stall(self, run_id: str) -> bool:
        if not isinstance(run_id, str):
            return False
        with self._gw.write() as tx:
            return tx.run("gated_stall_delete", {"run_id": run_id}) == 1

    def list_stalls(self) -> list[StallRecord]:
        with self._gw.read() as tx:
            return [
                StallRecord(
                    run_id=row["run_id"],
                    reason=row["reason"],
                    held_nodes=tuple(json.loads(row["held_nodes"])),
                    detected_at=float(row["detected_at"]),
                )
                for row in tx.all("gated_stalls_list")
            ]

    def queue_stats(self) -> list[QueueStats]:
        with self._gw.read() as tx:
            rows = tx.all("gated_queue_stats", {"now": self._now()})
            return [
                QueueStats(
                    queue=row["queue"],
                    depth=int(row["depth"]),
                    oldest_available_at=(None if row["oldest"] is None else float(row["oldest"])),
                )
                for row in rows
            ]

    def run_status_counts(self) -> Mapping[RunStatus, int]:
        with self._gw.read() as tx:
            rows = tx.all("gated_run_status_counts")
            return {RunStatus(row["status"]): int(row["n"]) for row in rows}
