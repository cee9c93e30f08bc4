"""Batched worker operations of the SQL store (:class:`~dagwerk.store.BatchQueueStore`).

On a backend whose writers are serialised by one database lock (SQLite) a
batch is one transaction: the leases and the claims commit together, and so
do all completions and acks of one call. On a backend with row locks
(PostgreSQL) every transition locks its run first, root run before run; a
transaction that took several runs' locks in arbitrary order could deadlock
with another, so there a batch is one transaction per run (the leases stay
their own transaction, which takes no run lock). Either way each request
runs the single operation's own code under the same locks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

from dagwerk.backends.errors import StoreUnavailableError
from dagwerk.constants import TaskStatus
from dagwerk.errors import DagwerkError
from dagwerk.store import (
    ClaimedDelivery,
    CompletionOutcome,
    CompletionRequest,
    InvalidStoreValueError,
    LeasedDelivery,
    TaskRecord,
    validate_worker_id,
)

from ._queue import QueueMixin
from ._tasks import TasksMixin, task_record
from .gateway import Tx

_T = TypeVar("_T")


class BatchMixin(TasksMixin, QueueMixin):
    def _one_writer(self) -> bool:
        return bool(getattr(self._gw, "serialises_writers", False))

    def claim_deliveries(
        self,
        worker_id: str,
        *,
        limit: int,
        lease_seconds: float,
        queues: Sequence[str] | None = None,
        wait_seconds: float = 0.0,
    ) -> list[ClaimedDelivery]:
        if self._one_writer():
            claims: list[TaskRecord | None] = []
            leased = self._dequeue(
                worker_id,
                limit=limit,
                lease_seconds=lease_seconds,
                queues=queues,
                wait_seconds=wait_seconds,
                claims=claims,
            )
            return [ClaimedDelivery(d, task) for d, task in zip(leased, claims, strict=True)]
        leased = self.dequeue(
            worker_id,
            limit=limit,
            lease_seconds=lease_seconds,
            queues=queues,
            wait_seconds=wait_seconds,
        )
        found: dict[str, TaskRecord | None] = {}
        for group in _by_run([(d.run_id, d) for d in leased]):
            try:
                with self._gw.write() as tx:
                    claimed = {d.delivery_id: self._claim_in(tx, d) for d in group}
            except StoreUnavailableError:
                # The leases are committed: the caller gets the rows unclaimed
                # and handles them one by one (or they come back after the lease).
                claimed = {d.delivery_id: None for d in group}
            found.update(claimed)
        return [ClaimedDelivery(d, found[d.delivery_id]) for d in leased]

    def _claim_in(self, tx: Tx, delivery: LeasedDelivery) -> TaskRecord | None:
        """``try_claim_task`` for the delivery's attempt, in the caller's transaction."""
        task = self._current(
            tx, delivery.task_id, delivery.attempt_id, TaskStatus.QUEUED, delivery.generation
        )
        if task is None:
            return None
        self._set_status(tx, task, TaskStatus.RUNNING)
        return replace(task_record(task), status=TaskStatus.RUNNING)

    def complete_and_ack(
        self, worker_id: str, requests: Sequence[CompletionRequest]
    ) -> list[CompletionOutcome]:
        validate_worker_id(worker_id)
        items = list(requests)
        for item in items:
            if not isinstance(item, CompletionRequest):
                raise InvalidStoreValueError(
                    "requests must be CompletionRequest values", field="requests"
                )
        if not items:
            return []
        outcomes: list[CompletionOutcome] = [None] * len(items)
        if self._one_writer():
            groups = [list(range(len(items)))]
        else:
            ids = json.dumps([item.task_id for item in items])
            with self._gw.read() as tx:
                runs = {row["task_id"]: row["run_id"] for row in tx.all("tasks_runs", {"ids": ids})}
            groups = _by_run([(runs.get(item.task_id, ""), i) for i, item in enumerate(items)])
        for group in groups:
            with self._gw.write() as tx:
                for i in group:
                    outcomes[i] = self._complete_and_ack_in(tx, worker_id, items[i])
        return outcomes

    def _complete_and_ack_in(
        self, tx: Tx, worker_id: str, item: CompletionRequest
    ) -> CompletionOutcome:
        try:
            result = self._complete(tx, item.task_id, tuple(item.outputs), item.expected_attempt_id)
        except StoreUnavailableError:
            raise  # the transaction itself failed: nothing of the call commits
        except DagwerkError as exc:
            # Refused before anything of this request was written.
            return exc
        tx.run("queue_ack", {"delivery_id": item.delivery_id, "worker_id": worker_id})
        return result


def _by_run(keyed: list[tuple[str, _T]]) -> list[list[_T]]:
    """Group values by run ID, groups in the order their run first appears."""
    groups: dict[str, list[_T]] = {}
    for run_id, value in keyed:
        groups.setdefault(run_id, []).append(value)
    return list(groups.values())
