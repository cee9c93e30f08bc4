"""The dagwerk extensions of the store protocols: wait responses, stored
waits, delayed task retries, node re-runs, the durable queue, batched worker
operations, the gated-dispatch backstop, child runs and budgets.

Re-exported by :mod:`dagwerk.store`, which holds the seed's protocols
(``DagStore``, ``DagWaitStore``, ``DagRetryStore``, ``OutputResolver``,
method for method as the seed defines them); import them from there. A
store written to the seed's protocols alone works with every seed function;
the extensions a store implements are looked up once per store
(:class:`dagwerk.capabilities.StoreCapabilities`), and without one its
caller does what the seed does.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dagwerk._store_types import (
    Delivery,
    RunReopenResult,
    TaskAttemptRef,
    TaskCompletionResult,
    TaskRecord,
    TaskResumeResult,
    TaskWaitResult,
)
from dagwerk.budgets import AccountUsage, Admission, Budget
from dagwerk.constants import (
    FailurePolicy,
    RunStatus,
)
from dagwerk.errors import DagwerkError
from dagwerk.json import JsonValue
from dagwerk.limits import Limits
from dagwerk.lineage import RunLink
from dagwerk.models import (
    DagNode,
    EmittedOutput,
    ResolvedOutput,
)

# --- dagwerk extensions of the seed's waits and retries ----------------------


@runtime_checkable
class WaitResponseStore(Protocol):
    """Wait responses: a resume stores the application's answer with the wait,
    and the resumed attempt reads it back (dagwerk extension of
    ``DagWaitStore``).

    Without it ``resume_task`` accepts no response and a resumed attempt gets
    none (``ctx.wait_response`` is ``None``), as in the seed.
    """

    def try_resume_task(
        self,
        task_id: str,
        wait_id: str,
        *,
        expected_attempt_id: str,
        expected_generation: int,
        response: object = None,
    ) -> TaskResumeResult | None:
        """``DagWaitStore.try_resume_task``, storing ``response`` (JSON,
        frozen) with the resolved wait in the same commit. An exact repeat
        returns the first result and keeps the first response."""
        ...

    def get_wait_response(self, task_id: str, wait_id: str) -> JsonValue | None:
        """The response stored when the wait was resolved; ``None`` for an
        unknown or unresolved wait, or a resume without a response. Read-only."""
        ...


@runtime_checkable
class DelayedRetryStore(Protocol):
    """A failure and its retry in one commit (dagwerk extension of
    ``DagRetryStore``), for the worker's retry policies.

    Without it the worker records a failure the policy would retry as the
    task's final failure (``on_task_failed``), as in the seed.
    """

    def try_fail_task_with_retry(
        self, task_id: str, error: str, *, expected_attempt_id: str, available_at: float
    ) -> str | None:
        """One transaction: record ``error`` as the FAILED outcome of the current
        RUNNING attempt and replace it with a new QUEUED attempt (same plan,
        generation and wait correlation) whose delivery becomes available at
        ``available_at`` (store clock seconds). The run never sees the task
        FAILED, so no finaliser can close it in between. Returns the new
        attempt ID; ``None`` (nothing changed) when the attempt is not the
        current RUNNING one of an active task in a RUNNING run.
        """
        ...


@runtime_checkable
class NodeRerunStore(Protocol):
    """Re-running nodes of any run, a COMPLETED one included (dagwerk
    extension of ``DagRetryStore``; ``retry.rerun_nodes`` and
    ``Engine.rerun`` need it)."""

    def try_rerun_nodes(self, run_id: str, node_indices: tuple[int, ...]) -> RunReopenResult | None:
        """One transaction under the run lock: the named nodes and all their
        descendants become a new generation (launches, tasks and outputs
        invalidated as a unit; output IDs stay reserved) and the run is
        RUNNING again, from RUNNING or any terminal status (COMPLETED
        included); the retry count increments.

        Raises :class:`~dagwerk.store.RerunRefusedError` (nothing changed) if
        an affected task is RUNNING. ``None``: missing or PENDING run, empty
        or out-of-range indices.
        """
        ...


# --- dagwerk extension: the durable queue -------------------------------------


@dataclass(frozen=True, slots=True)
class LeasedDelivery:
    """A delivery leased to one worker until ``lease_expires_at`` (clock seconds).

    ``delivery_count`` counts this lease too (the first lease has count 1).
    The claim, not the lease, decides whether the attempt may run: a lease
    only hides the row from other workers for a while.
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


# --- dagwerk extension: batched worker operations -----------------------------


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
    (dagwerk extension; SQLite).

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
        its launches may claim their tasks for it. True when noted; False
        where the store cannot (nothing changes)."""
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


# --- dagwerk extension: the gated-dispatch backstop ---------------------------


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


# --- dagwerk extension: stored waits -------------------------------------------


@dataclass(frozen=True, slots=True)
class WaitRecord:
    """One wait of a task as the store keeps it: written by ``try_wait_task``
    and kept after the wait is resolved or invalidated (WT-16)."""

    task_id: str
    wait_id: str
    attempt_id: str
    """The attempt that entered the wait: the ``expected_attempt_id`` that
    resumes it and that an exact repeat of the resume passes again."""
    generation: int
    resumed_attempt_id: str | None
    """The attempt the resume created; ``None`` while the wait is unresolved."""
    invalidated: bool
    """The wait was invalidated before it was resolved (its run was cancelled
    or failed, or its node's generation was replaced): it cannot be resumed."""


@runtime_checkable
class WaitRecordStore(Protocol):
    """Reads the stored waits of a task (dagwerk extension).

    Lets a caller that knows only the task and the wait ID (``Engine.resume``,
    ``dagwerk resume``) repeat a resume exactly: the attempt that entered the
    wait stays in the record, while the task row moves on to later attempts.
    """

    def get_wait(self, task_id: str, wait_id: str) -> WaitRecord | None:
        """The task's wait ``wait_id``, resolved and invalidated ones included;
        ``None`` for an unknown task or a wait ID the task never waited on.
        Read-only."""
        ...


# --- dagwerk extension: worker presence ----------------------------------------


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


@runtime_checkable
class QueueForecastStore(Protocol):
    """When the next delivery becomes due (dagwerk extension): lets a burst
    worker wait for a retry on its backoff instead of exiting before it."""

    def next_delivery_in(
        self,
        *,
        queues: Sequence[str] | None = None,
        plugins: Collection[str] | None = None,
    ) -> float | None:
        """Seconds until the earliest row not under a live lease, in one of
        ``queues`` and of one of ``plugins`` (``None``: any), becomes
        deliverable: ``0.0`` when one is deliverable now, ``None`` when no
        such row exists. Read-only."""
        ...


# --- dagwerk extension: store settings and lifetime ------------------------------


@runtime_checkable
class LimitedStore(Protocol):
    """A store that validates with configurable limits (dagwerk extension).

    The orchestrator validates under the same limits; without it, under
    :data:`~dagwerk.limits.DEFAULT_LIMITS`.
    """

    limits: Limits
    """The byte and count limits the store validates runs, launches and
    completions with."""


@runtime_checkable
class ClosableStore(Protocol):
    """A store holding resources (connections, files) until closed (dagwerk
    extension)."""

    def close(self) -> None:
        """Release the store's resources; the store is unusable afterwards."""
        ...


# --- dagwerk extension: composite child runs and budgets ------------


@runtime_checkable
class DagChildStore(Protocol):
    """Child runs with persisted lineage (see :mod:`dagwerk.lineage`).

    A child run's terminal transition resumes its waiting parent task in the
    same commit, with :func:`~dagwerk.lineage.child_result_payload` as the
    wait response; a run's FAILED, CRASHED or CANCELLED transition cancels
    its unfinished descendants in the same commit.
    """

    def create_child_run(
        self,
        run_id: str,
        nodes: Sequence[DagNode],
        *,
        link: RunLink,
        run_input: Mapping[str, object] | None = None,
        failure_policy: FailurePolicy | str = FailurePolicy.FAIL_FAST,
        budget: Budget | None = None,
    ) -> bool:
        """As ``create_run``, storing ``link`` (its ``wait_id`` must be ``None``)
        and an optional own budget; the run also draws on its parent's budget
        accounts. False (no change) if the run exists."""
        ...

    def try_wait_for_child(
        self,
        task_id: str,
        *,
        expected_attempt_id: str,
        expected_generation: int,
        nodes: Sequence[DagNode],
        link: RunLink,
        run_input: Mapping[str, object] | None = None,
        failure_policy: FailurePolicy | str = FailurePolicy.FAIL_FAST,
        budget: Budget | None = None,
    ) -> TaskWaitResult | None:
        """One transaction: create the child ``link.run_id`` already RUNNING
        (its roots are launched by the next reconcile, the caller's or a
        backstop pass's, so a crash in between strands nothing) and move the
        current RUNNING attempt to WAITING under ``link.wait_id``. ``None``
        (nothing changed): not the current RUNNING attempt, a wait already
        active, the wait ID used before, or the child run exists."""
        ...

    def get_run_link(self, run_id: str) -> RunLink | None:
        """The child record of a run; ``None`` for a root or unknown run."""
        ...

    def list_child_runs(self, run_id: str) -> list[str]:
        """IDs of the runs started by tasks of ``run_id``, oldest first."""
        ...


@runtime_checkable
class DagBudgetStore(Protocol):
    """Per-run budgets (see :mod:`dagwerk.budgets`)."""

    def try_set_run_budget(self, run_id: str, budget: Budget) -> bool:
        """Give a PENDING run without budget accounts its own budget. False
        (no change) otherwise."""
        ...

    def get_run_budget(self, run_id: str) -> tuple[AccountUsage, ...]:
        """Usage of every account the run draws on (own first, then its
        ancestors'); empty without budgets. Read-only."""
        ...

    def try_admit_task(
        self,
        task_id: str,
        *,
        expected_attempt_id: str,
        input_bytes: int,
        cost_units: int | None,
    ) -> Admission:
        """One transaction fenced by the current RUNNING attempt: charge
        ``input_bytes`` and hold ``cost_units`` on every account of the run,
        or nothing. STALE: not the current RUNNING attempt (nothing consumed);
        EXHAUSTED: an account has no room (nothing consumed); an exact repeat
        is ADMITTED again without a second charge.

        ``try_complete_task`` of a run with accounts charges the canonical
        bytes of its outputs and converts the attempt's hold into a charge in
        its own commit, or raises :class:`~dagwerk.budgets.BudgetExhaustedError`
        before any write.
        """
        ...
