"""The durable queue over the outbox rows (dagwerk extension): leases,
dead letters, and when the next delivery becomes due.

Re-exported by :mod:`dagwerk.store`; import the names from there.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dagwerk._store_types import (
    Delivery,
    TaskAttemptRef,
)


@dataclass(frozen=True, slots=True)
class LeasedDelivery:
    """A delivery leased to one worker until ``lease_expires_at`` (clock seconds).

    ``delivery_count`` counts this lease too (the first lease has count 1).
    The claim, not the lease, decides whether the attempt may run: a lease
    only hides the row from other workers for a while. ``offered_at`` is the
    store time the row became available before this lease: when it was
    enqueued, when a retry's or a release's delay ended, or when an earlier
    lease expired (``None``: unknown to the store).
    """

    delivery_id: str
    task_id: str
    attempt_id: str
    generation: int
    run_id: str
    node_index: int
    launch_id: str
    queue: str
    priority: int
    delivery_count: int
    worker_id: str
    lease_expires_at: float
    offered_at: float | None = None

    @property
    def delivery(self) -> Delivery:
        """The plain outbox view of this row."""
        return Delivery(
            delivery_id=self.delivery_id,
            task_id=self.task_id,
            attempt_id=self.attempt_id,
            generation=self.generation,
            run_id=self.run_id,
            node_index=self.node_index,
            launch_id=self.launch_id,
        )


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A delivery parked out of the queue, with the reason it was parked.

    ``reinjected_attempt_id`` is the attempt a re-injection created, ``None``
    while the dead letter has not been re-injected.
    """

    dead_letter_id: str
    delivery_id: str
    task_id: str
    attempt_id: str
    generation: int
    run_id: str
    node_index: int
    launch_id: str
    queue: str
    priority: int
    delivery_count: int
    reason: str
    dead_at: float
    reinjected_attempt_id: str | None


@runtime_checkable
class DagQueueStore(Protocol):
    """The durable queue over the outbox rows (dagwerk extension).

    Every outbox row written by a launch, recovery, resume or retry is a queue
    row with a queue name, an integer priority (higher first) and an
    ``available_at`` time. Time comes from the store's injected clock.
    A lease is a visibility timeout: while it runs the row is hidden from
    other workers; once it expires the row is deliverable again. Each method
    is one transaction.
    """

    max_deliveries: int
    """How many leases a row may receive; the next dequeue dead-letters it."""

    def dequeue(
        self,
        worker_id: str,
        *,
        limit: int,
        lease_seconds: float,
        queues: Sequence[str] | None = None,
        wait_seconds: float = 0.0,
        plugins: Collection[str] | None = None,
        prefer_run: str | None = None,
    ) -> list[LeasedDelivery]:
        """Lease up to ``limit`` rows to ``worker_id`` in one transaction.

        Candidates are available now (``available_at`` reached, no live lease),
        in one of ``queues`` (any queue when ``None``) and of a node whose
        plugin is one of ``plugins`` (any plugin when ``None``): a worker
        never sees a row it has no plugin for, so such a row keeps its
        delivery count and waits for a worker that has the plugin. Rows of
        the run ``prefer_run`` come first; then, as within those, by priority
        (highest first), then availability, then creation order. Each leased
        row's delivery count increments. A candidate that has already been
        leased ``max_deliveries`` times is moved to the dead-letter table with
        reason ``"max_deliveries"`` instead, and does not count towards
        ``limit``; in the same commit its task (when the row's attempt is
        still current, QUEUED or RUNNING) becomes CRASHED with the error
        ``"dead-lettered: <reason>"`` and is reported by
        :meth:`take_dead_lettered`. Returns the leased rows in that order.

        When nothing is deliverable it waits up to ``wait_seconds`` (wall
        time) for work, waking as soon as work is enqueued where the backend
        can tell; empty when the wait ends without work.
        """
        ...

    def take_dead_lettered(self) -> list[TaskAttemptRef]:
        """Drain the tasks this process's dequeues crashed by dead-lettering
        since the last call, so the caller can apply the run's failure policy
        (``orchestrator.settle_crashed_task``)."""
        ...

    def ack(self, delivery_id: str, worker_id: str) -> bool:
        """Remove the row if ``worker_id`` holds its lease (live or expired but
        not taken over). True iff this call removed it."""
        ...

    def nack(
        self,
        delivery_id: str,
        worker_id: str,
        *,
        delay: float = 0.0,
        poison: bool = False,
        reason: str = "",
    ) -> bool:
        """Give the row back: it becomes deliverable ``delay`` seconds from now,
        keeping its delivery count. With ``poison`` it moves to the dead-letter
        table with ``reason`` instead. Only the lease holder may nack; False
        (nothing changed) otherwise."""
        ...

    def extend_lease(self, delivery_id: str, worker_id: str, lease_seconds: float) -> bool:
        """Heartbeat: the lease now ends ``lease_seconds`` from now. Only the
        holder of a live lease may extend it; an expired lease cannot be
        revived (another worker may already see the row). False otherwise."""
        ...

    def list_dead_letters(self, run_id: str | None = None) -> list[DeadLetter]:
        """Dead letters (re-injected ones included) in the order they were parked."""
        ...

    def reinject_dead_letter(self, dead_letter_id: str) -> str | None:
        """One transaction: give the dead letter's task a fresh attempt and a
        new queue row, and mark the dead letter re-injected.

        Applies while the dead letter's attempt is still the task's current
        attempt (a task crashed by the dead-lettering included), the task is
        QUEUED, RUNNING or CRASHED in its active launch
        and the run is RUNNING. Returns the new attempt ID. ``None`` (nothing
        changed) for an unknown or already re-injected dead letter, or when
        the task moved on; so of two racing callers at most one succeeds.
        """
        ...


@runtime_checkable
class QueueForecastStore(Protocol):
    """When the next delivery becomes due (dagwerk extension): lets a burst
    worker wait for a retry on its backoff instead of exiting before it."""

    def next_delivery_in(
        self,
        *,
        queues: Sequence[str] | None = None,
        plugins: Collection[str] | None = None,
        worker_id: str | None = None,
    ) -> float | None:
        """Seconds until the earliest row not under a live lease, in one of
        ``queues`` and of one of ``plugins`` (``None``: any), becomes
        deliverable: ``0.0`` when one is deliverable now, ``None`` when no
        such row exists. A row under ``worker_id``'s own live lease counts
        too, as due when that lease ends (a worker that holds no attempt of
        it then redelivers it). Read-only."""
        ...
