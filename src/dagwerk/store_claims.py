"""Batched worker operations (dagwerk extensions): claims and completions
several to a commit, outputs kept in memory, claims made ahead by launches,
and units of work.

Re-exported by :mod:`dagwerk.store`; import the names from there.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dagwerk._store_types import (
    TaskCompletionResult,
    TaskRecord,
)
from dagwerk.errors import DagwerkError
from dagwerk.models import (
    EmittedOutput,
    ResolvedOutput,
)
from dagwerk.store_queue import LeasedDelivery


@dataclass(frozen=True, slots=True)
class ClaimedDelivery:
    """One row leased by :meth:`BatchQueueStore.claim_deliveries`.

    ``task`` is the task as the claim left it (RUNNING under the delivery's
    attempt) when the claim succeeded, and ``None`` when it was refused (the
    run is not RUNNING, the attempt or generation moved on, the task is not
    QUEUED, ...): the lease still holds and the caller decides what to do
    with the row, as after a plain ``dequeue`` and a refused ``try_claim_task``.
    """

    delivery: LeasedDelivery
    task: TaskRecord | None
    alone: bool = False
    """The task is the only task of its launch, where the claim read that
    (so its completion is expected to end the launch, see
    :attr:`CompletionRequest.ends_launch`); ``False`` where it did not."""


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """One completion for :meth:`BatchQueueStore.complete_and_ack`."""

    task_id: str
    expected_attempt_id: str
    outputs: tuple[EmittedOutput, ...]
    delivery_id: str
    run_id: str | None = None
    """The task's run, where the caller knows it (a worker does, from the
    delivery): a store that groups requests by run may take it instead of
    reading it. A wrong one costs the store a read, never a wrong write."""
    ends_launch: bool = False
    """The caller expects the completion to end its task's launch (its
    reconcile may then launch the children): a store may hold the run for
    that reconcile from the start (:class:`~dagwerk.store_run_units.RunUnitStore`).
    A wrong guess costs time, never a wrong write."""


CompletionOutcome = TaskCompletionResult | None | DagwerkError
"""Per request: the completion record, ``None`` (not accepted), or the typed
error that refused it (nothing of that request was written)."""


@runtime_checkable
class BatchQueueStore(Protocol):
    """Several worker transitions per commit (dagwerk extension).

    Each method does what a sequence of single operations does, with the same
    fencing and validation, but in fewer transactions: nothing is weaker, a
    crash between two commits leaves the state those single operations would
    have left.
    """

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
        """:meth:`DagQueueStore.dequeue`, then for every leased row
        ``try_claim_task(task_id, expected_attempt_id=row.attempt_id,
        expected_generation=row.generation)``; the claims commit together
        (with the leases, where the backend can do so without a lock-order
        hazard). Same arguments, filters, waiting and dead-lettering as ``dequeue``;
        one entry per leased row, in lease order."""
        ...

    def complete_and_ack(
        self, worker_id: str, requests: Sequence[CompletionRequest]
    ) -> list[CompletionOutcome]:
        """For each request in order, ``try_complete_task(task_id, outputs,
        expected_attempt_id=...)``, and when it did not raise,
        ``ack(delivery_id, worker_id)``; all in one commit. A request whose
        completion raises a :class:`~dagwerk.errors.DagwerkError` (outputs
        refused, budget exhausted, ...) writes nothing, is not acked and gets
        the error as its outcome; the other requests are unaffected. Any
        other error rolls the whole call back and propagates."""
        ...


@runtime_checkable
class RecentOutputsStore(Protocol):
    """Outputs this store object committed lately, kept in memory (dagwerk
    extension; the SQL stores): a worker resolves a claimed task's inputs
    from them without reading them again.

    Without it the worker resolves inputs with ``resolve_outputs``.
    """

    def resolve_recent_outputs(
        self, run_id: str, output_ids: tuple[str, ...]
    ) -> Mapping[str, ResolvedOutput]:
        """``OutputResolver.resolve_outputs`` for a task the caller has
        claimed: the same answer, from memory where this store object itself
        committed every one of the outputs lately, else from storage."""
        ...


@runtime_checkable
class ClaimAheadStore(Protocol):
    """Launches that claim their tasks for the claim ending the unit of work
    (dagwerk extension; SQLite), or on a store without units (PostgreSQL)
    for the calling thread's next claim.

    Without it the worker's next claim takes the launched tasks itself.
    """

    def expect_claim(
        self,
        worker_id: str,
        *,
        limit: int,
        lease_seconds: float,
        queues: Sequence[str] | None = None,
        plugins: Collection[str] | None = None,
    ) -> bool:
        """Inside the calling thread's unit of work: the unit will end with
        ``claim_deliveries`` with these arguments (and no run preference), so
        its launches may claim their tasks for it. On a store without units
        the same holds for the launches the thread makes before its next
        ``claim_deliveries``, which hands their claimed tasks over first.
        True when noted; False where the store cannot (nothing changes)."""
        ...

    def handed_over_all_available(self) -> bool:
        """Whether the calling thread's last ``claim_deliveries`` handed over
        only tasks its launches had claimed, and those launches saw nothing
        else available for it and nothing was written since: a claim ahead
        right after it would find nothing worth a look (rows that arrived
        since wait for the next claim, as they would for any worker)."""
        ...


@runtime_checkable
class UnitOfWorkStore(Protocol):
    """Several store calls of one thread in one transaction (dagwerk
    extension).

    Inside ``with store.unit_of_work():`` every store call the entering
    thread makes joins one write transaction that commits when the block
    ends; a block left by an exception rolls all of it back. Each call stays
    atomic on its own (a call that raises undoes only its own writes), reads
    see the block's earlier writes, and nothing of the block is visible to
    other connections before it commits. Other threads of the process wait
    for the block. Callers must not act on a call's result outside the store
    (callbacks, acknowledgements to others) before the block has committed.
    Blocks nest: an inner block joins the outer one.

    A block entered with ``all_or_nothing=True`` (usually an inner one) gives
    up the calls' own atomicity for speed: a call that raises inside it
    dooms the whole unit, whose later calls raise and which rolls back at
    its end, raising :class:`~dagwerk.store.StoreContractError` even if the
    caller swallowed the first error. For callers that let every error
    leave the unit anyway.
    """

    def unit_of_work(self, *, all_or_nothing: bool = False) -> AbstractContextManager[None]:
        """The block's context manager."""
        ...
