"""Batched worker operations of the in-memory store: the reference for
:class:`~dagwerk.store.BatchQueueStore`. Under the store's one lock each call
is one transaction, so composing the single operations is the whole job."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from dagwerk.errors import DagwerkError
from dagwerk.store import ClaimedDelivery, CompletionOutcome, CompletionRequest, validate_worker_id

from ._queue import QueueMixin
from ._tasks import TasksMixin


class BatchMixin(TasksMixin, QueueMixin):
    def claim_deliveries(
        self,
        worker_id: str,
        *,
        limit: int,
        lease_seconds: float,
        queues: Sequence[str] | None = None,
        wait_seconds: float = 0.0,
        plugins: Collection[str] | None = None,
        prefer_run: str | None = None,
    ) -> list[ClaimedDelivery]:
        leased = self.dequeue(
            worker_id,
            limit=limit,
            lease_seconds=lease_seconds,
            queues=queues,
            wait_seconds=wait_seconds,
            plugins=plugins,
            prefer_run=prefer_run,
        )
        claimed: list[ClaimedDelivery] = []
        with self._lock:
            for delivery in leased:
                result = self.try_claim_task(
                    delivery.task_id,
                    expected_attempt_id=delivery.attempt_id,
                    expected_generation=delivery.generation,
                )
                task = None if result is None else self.get_task(delivery.task_id)
                claimed.append(ClaimedDelivery(delivery, task))
        return claimed

    def complete_and_ack(
        self, worker_id: str, requests: Sequence[CompletionRequest]
    ) -> list[CompletionOutcome]:
        validate_worker_id(worker_id)
        outcomes: list[CompletionOutcome] = []
        with self._lock:
            for request in requests:
                try:
                    result = self.try_complete_task(
                        request.task_id,
                        tuple(request.outputs),
                        expected_attempt_id=request.expected_attempt_id,
                    )
                except DagwerkError as exc:
                    outcomes.append(exc)
                    continue
                self.ack(request.delivery_id, worker_id)
                outcomes.append(result)
        return outcomes
