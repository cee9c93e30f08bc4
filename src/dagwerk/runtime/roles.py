"""The small protocols the worker's collaborators depend on.

- :class:`WorkerStore`: what the worker calls on its store itself (the
  seed's ``DagWaitStore`` and ``OutputResolver``, and ``DagRunStore``). The
  durable queue (``DagQueueStore``), which a worker cannot do without, and
  the optional capabilities it uses are looked up once
  (:class:`~dagwerk.capabilities.StoreCapabilities`).
- :class:`DeliverySettler`: what a guard (lineage, budget, child wait)
  needs to settle the delivery it refuses; the worker's
  :class:`~dagwerk.runtime.settlement.Settler` is one.
"""

from __future__ import annotations

from typing import Protocol

from dagwerk.store import DagRunStore, DagWaitStore, LeasedDelivery, OutputResolver

__all__ = ["DeliverySettler", "WorkerStore"]


class WorkerStore(DagWaitStore, DagRunStore, OutputResolver, Protocol):
    """The store a worker serves: runs, tasks, waits and outputs."""


class DeliverySettler(Protocol):
    """Settles one delivery for a guard that refused it."""

    def ack(self, delivery: LeasedDelivery, action: str, detail: str = "") -> None:
        """Acknowledge the delivery and report ``action``."""
        ...

    def fail(self, delivery: LeasedDelivery, error: BaseException) -> None:
        """Fail the task with ``error`` (its run's failure policy follows), then ack."""
        ...
