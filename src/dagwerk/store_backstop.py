"""What the gated-dispatch backstop, the stall diagnosis and the idle sweep
read and write (dagwerk extensions): leases, stalls, queue statistics, wait
ages, live nodes and running tasks without a delivery.

Re-exported by :mod:`dagwerk.store`; import the names from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dagwerk.constants import (
    RunStatus,
)


@dataclass(frozen=True, slots=True)
class StallRecord:
    """A persisted stall of a run: first seen at ``detected_at`` (store clock
    seconds), with the reason and held nodes of its latest observation."""

    run_id: str
    reason: str
    held_nodes: tuple[int, ...]
    detected_at: float


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's backlog: rows waiting for a worker, and the store time since
    which the oldest deliverable row has been deliverable (``None``: none is)."""

    queue: str
    depth: int
    oldest_available_at: float | None


@runtime_checkable
class BackstopStore(Protocol):
    """What the periodic backstop needs from a store (dagwerk extension).

    Time comes from the store's clock. Each method is one transaction. A
    store may also be a :class:`LiveNodeStore` (the built-in stores are):
    the backstop then skips the stall diagnosis of a run that is plainly
    making progress.
    """

    def try_acquire_lease(self, name: str, holder: str, seconds: float) -> bool:
        """Take or renew the named lease for ``seconds``: True when it was free,
        expired or already held by ``holder``; False (nothing changed) while
        another holder's lease is live. Of two racing callers at most one wins."""
        ...

    def release_lease(self, name: str, holder: str) -> bool:
        """Drop the named lease if ``holder`` holds it (live or expired); True
        iff this call dropped it."""
        ...

    def repair_missing_deliveries(self, run_id: str) -> list[str]:
        """Re-create the outbox row of every QUEUED task of the run's active
        generation whose current attempt has neither a queue row nor a
        dead letter that was not re-injected (an invariant violation), keeping
        the attempt and its lost-delivery count. Only for a RUNNING run.
        Returns the repaired task IDs in creation order; an exact repeat
        repairs nothing and returns an empty list."""
        ...

    def wait_ages(self, run_id: str) -> Mapping[str, float]:
        """``{task_id: seconds since its wait began}`` for each WAITING task of
        the run's active generation, measured from the store time that
        ``try_wait_task`` committed with the wait (empty for a missing or
        non-RUNNING run). Read-only."""
        ...

    def try_record_stall(self, run_id: str, reason: str, held_nodes: tuple[int, ...]) -> bool:
        """Persist that the run is stalled. True iff no stall was recorded for
        the run (a new stall: emit its event); otherwise the record's reason
        and held nodes are updated, its detection time kept, and False."""
        ...

    def clear_stall(self, run_id: str) -> bool:
        """Forget the run's stall; True iff one was recorded."""
        ...

    def list_stalls(self) -> list[StallRecord]:
        """Every recorded stall, oldest detection first."""
        ...

    def queue_stats(self) -> list[QueueStats]:
        """Per queue with rows: the rows not under a live lease and the
        oldest ``available_at`` among rows deliverable now, by queue name. Read-only."""
        ...

    def run_status_counts(self) -> Mapping[RunStatus, int]:
        """How many runs have each status (absent: none). Read-only."""
        ...


@runtime_checkable
class LiveNodeStore(Protocol):
    """A cheap answer to "is this run making progress?" (dagwerk extension,
    the backstop's shortcut).

    Without it the backstop diagnoses every RUNNING run from all its tasks.
    """

    def has_live_node(self, run_id: str) -> bool:
        """True iff some node of the run has an active launch that launched
        tasks, no active FAILED or CRASHED task, and an active task that is
        RUNNING, or QUEUED with a queue row for its current attempt; that is,
        a node the stall diagnosis finds live from its tasks. Read-only."""
        ...


@runtime_checkable
class WaitAgesStore(Protocol):
    """How long each waiting task of a run has waited (dagwerk extension; every
    :class:`BackstopStore` is one).

    Without it the stall diagnosis counts every wait as fresh.
    """

    def wait_ages(self, run_id: str) -> Mapping[str, float]:
        """As :meth:`BackstopStore.wait_ages`."""
        ...


@runtime_checkable
class RunningTasksStore(Protocol):
    """The idle sweep's read of one run (dagwerk extension).

    Without it the sweep reads the run's deliveries and tasks in full.
    """

    def running_without_delivery(self, run_id: str) -> list[tuple[str, str]]:
        """``(task_id, attempt_id)`` of the run's RUNNING tasks of the active
        generation whose current attempt has no queue row, in task creation
        order (a task with a row, leased or not, reaches its worker again by
        redelivery). Read-only."""
        ...
