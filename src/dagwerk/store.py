"""Store protocols, their result records and the errors of the store boundary.

An application brings its own database and queue by implementing these
protocols; :mod:`dagwerk.backends` ships implementations. Every method that
changes state runs as one transaction under the run's serialisation boundary:
it validates everything first, then writes, so a rejected call changes
nothing. ``try_*`` methods return ``None`` (or ``False``) when the transition
is refused; refusal never raises. Exact repeats of committed callbacks return
the first stored result.

Result records validate their own fields, so a store cannot hand the
orchestrator a malformed record by accident.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dagwerk._store_types import (
    AttemptRecord,
    Delivery,
    InvalidStoreValueError,
    NodeLaunchRef,
    OutputPublicationError,
    RerunRefusedError,
    RunRecord,
    RunReopenResult,
    StoreContractError,
    TaskAttemptRef,
    TaskClaimResult,
    TaskCompletionResult,
    TaskFailureResult,
    TaskRecord,
    TaskRecoveryResult,
    TaskResumeResult,
    TaskWaitResult,
    validate_output_batch_routing_size,
    validate_output_batch_size,
    validate_queue_names,
    validate_seconds,
    validate_wait_id,
    validate_worker_id,
)
from dagwerk.budgets import AccountUsage, Admission, Budget
from dagwerk.constants import (
    FailurePolicy,
    NodeDisposition,
    RunStatus,
)
from dagwerk.errors import DagwerkError
from dagwerk.json import JsonValue
from dagwerk.lineage import RunLink
from dagwerk.models import (
    DagNode,
    EmittedOutput,
    LaunchCreateResult,
    NodeLaunch,
    PlanningSnapshot,
    ResolvedOutput,
    TaskInputPlan,
)
from dagwerk.topology import RunTopology

__all__ = [
    "AttemptRecord",
    "BackstopStore",
    "BatchQueueStore",
    "ClaimedDelivery",
    "CompletionOutcome",
    "CompletionRequest",
    "DagBudgetStore",
    "DagChildStore",
    "DagQueueStore",
    "DagRetryStore",
    "DagRunStore",
    "DagStore",
    "DagWaitStore",
    "DeadLetter",
    "Delivery",
    "InvalidStoreValueError",
    "LaunchProgress",
    "LeasedDelivery",
    "NodeLaunchRef",
    "OutputPublicationError",
    "OutputResolver",
    "QueueStats",
    "RerunRefusedError",
    "RunActivity",
    "RunActivityStore",
    "RunFrontier",
    "RunFrontierStore",
    "RunRecord",
    "RunReopenResult",
    "RunTopologyStore",
    "StallRecord",
    "StoreContractError",
    "TaskAttemptRef",
    "TaskClaimResult",
    "TaskCompletionResult",
    "TaskFailureResult",
    "TaskRecord",
    "TaskRecoveryResult",
    "TaskResumeResult",
    "TaskWaitResult",
    "validate_output_batch_routing_size",
    "validate_output_batch_size",
    "validate_queue_names",
    "validate_seconds",
    "validate_wait_id",
    "validate_worker_id",
]


# --- protocols --------------------------------------------------------------


@runtime_checkable
class DagStore(Protocol):
    """The storage every application must provide.

    All state changes of one run share one serialisation boundary (the run
    lock); each method below is one transaction under it. Published routing
    fields never change.
    """

    def get_run_status(self, run_id: str) -> RunStatus | None:
        """The run's status; ``None`` if the run does not exist. Read-only."""
        ...

    def get_run_nodes(self, run_id: str) -> list[DagNode] | None:
        """A copy of the node definitions stored with the run; ``None`` if absent.

        The stored definition never changes after the run is created.
        """
        ...

    def try_start_run(self, run_id: str) -> bool:
        """Under the run lock: PENDING -> RUNNING returns True; a RUNNING run also
        returns True (start requests are redelivered). Missing or terminal runs
        return False unchanged. Creates no launches."""
        ...

    def list_node_launches(self, run_id: str) -> Mapping[int, NodeLaunch]:
        """The run's non-invalidated launches keyed by node index. Read-only;
        empty for a missing run."""
        ...

    def get_planning_snapshot(
        self,
        run_id: str,
        node_index: int,
        source_indices: Mapping[str, int],
        *,
        max_outputs_per_edge: int,
        max_outputs_total: int,
        max_routing_bytes: int,
    ) -> PlanningSnapshot:
        """One consistent read of a node's sources under the run lock.

        Every edge in ``source_indices`` is present in ``outputs_by_edge``; each
        source with an active launch has its disposition; the snapshot carries
        the node's current generation, the frozen run input and a token that
        goes stale when any source state, the run status or a retry changes.
        At most ``limit + 1`` outputs per edge and ``total + 1`` overall are
        returned; loading stops after the first output whose routing size
        crosses ``max_routing_bytes`` (kept as the overflow signal) and later
        edges are empty. Zero-task sources expose no outputs.
        """
        ...

    def try_create_node_launch(  # noqa: PLR0917 (the seed's positional signature)
        self,
        run_id: str,
        node_index: int,
        plugin_name: str,
        snapshot_token: str,
        plans: tuple[TaskInputPlan, ...],
        zero_task_disposition: NodeDisposition | None,
        error: str = "",
    ) -> LaunchCreateResult:
        """One transaction: check the token and run state, then write the launch,
        its tasks, plans, first attempts and outbox rows together.

        With no plans it writes a complete zero-task launch with
        ``zero_task_disposition``. STALE (no launch) when the token is stale,
        the run is not RUNNING, or an existing launch belongs to another
        generation; ALREADY_EXISTS (the existing launch) for a repeat against the
        generation the token represents. Invalid arguments raise before any
        write.
        """
        ...

    def try_claim_task(
        self, task_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskClaimResult | None:
        """One compare-and-set: the run is RUNNING, the task belongs to the active
        launch of ``expected_generation``, is QUEUED and its current attempt is
        ``expected_attempt_id`` -> RUNNING. Only the status changes.

        ``None`` forbids execution and says nothing about why (owned elsewhere,
        finished, waiting, stale); it does not prove that acking is safe. A
        second identical claim returns ``None``.
        """
        ...

    def try_recover_task(
        self, task_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskRecoveryResult | None:
        """One transaction: replace the current RUNNING attempt of the active
        generation with a new QUEUED attempt and its outbox row, keeping the plan
        and the wait correlation. Callbacks from the abandoned attempt become
        stale. The task's count of lost deliveries grows by one and the new
        row starts its delivery count there, so a task that keeps losing its
        worker still reaches the dead-letter queue after ``max_deliveries``.

        An exact repeat (task, abandoned attempt, generation) returns the stored
        result even after later changes, without new work. ``None``: the attempt
        is not the current RUNNING one (or the run is not RUNNING); nothing
        changed.
        """
        ...

    def try_complete_task(
        self, task_id: str, outputs: tuple[EmittedOutput, ...], *, expected_attempt_id: str
    ) -> TaskCompletionResult | None:
        """One transaction: publish the outputs and mark the task COMPLETED,
        together with launch completeness and progress.

        Ownership is checked before the outputs, so a stale, queued or waiting
        attempt gets ``None`` even for an oversized batch. A first batch that
        cannot be published raises :class:`OutputPublicationError` before any
        write (the task stays RUNNING). Correlation IDs are derived from the
        stored node and plan; output IDs are reserved for the run's lifetime.
        An exact repeat by the completing attempt returns the first result and
        publishes nothing.
        """
        ...

    def mark_task_failed(
        self, task_id: str, error: str, *, expected_attempt_id: str
    ) -> TaskFailureResult | None:
        """One transaction: the current RUNNING attempt -> FAILED with ``error``.

        A repeat by that attempt returns the first result while the task still
        holds it (the first error stays). ``None``: not the current RUNNING
        attempt of an active task in a RUNNING run; nothing changed.
        """
        ...

    def mark_task_crashed(
        self, task_id: str, error: str, *, expected_attempt_id: str
    ) -> TaskFailureResult | None:
        """As :meth:`mark_task_failed`, with status CRASHED."""
        ...

    def try_finalize_run(
        self,
        run_id: str,
        status: RunStatus,
        *,
        cause: TaskAttemptRef | NodeLaunchRef | None = None,
        reason: str | None = None,
    ) -> bool:
        """One transaction: validate and apply a terminal transition.

        A non-terminal ``status``, both ``cause`` and ``reason``, or COMPLETED
        with either raises ``ValueError``. A cause must still be current in the
        active generation; its persisted status and error decide the transition
        and become the run error. COMPLETED requires an active, complete,
        non-failed launch for every stored node. FAILED/CRASHED/CANCELLED
        invalidate active waits and cancel unfinished tasks in the same commit.
        False: missing or terminal run, or preconditions not met; nothing changed.
        """
        ...


@runtime_checkable
class DagWaitStore(DagStore, Protocol):
    """Optional: tasks that wait on application data (human input, providers)."""

    def try_wait_task(
        self, task_id: str, wait_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskWaitResult | None:
        """One transaction: the current RUNNING attempt -> WAITING under ``wait_id``.
        No new attempt and no outbox row; the entering delivery is not acked.

        An exact repeat returns the stored result, even after the wait was
        resolved or invalidated. ``None``: another attempt or generation, a
        different wait while waiting, a reused wait ID, or a non-RUNNING run.
        """
        ...

    def try_resume_task(
        self,
        task_id: str,
        wait_id: str,
        *,
        expected_attempt_id: str,
        expected_generation: int,
        response: object = None,
    ) -> TaskResumeResult | None:
        """One transaction: resolve an active wait, store ``response`` (JSON,
        frozen) with it, and create exactly one replacement QUEUED attempt with
        its outbox row.

        An exact repeat returns the first result without new work (the first
        response stays), even after later changes. ``None``: unknown wait,
        wrong attempt or generation, or a wait invalidated before it was
        resolved.
        """
        ...

    def get_wait_response(self, task_id: str, wait_id: str) -> JsonValue | None:
        """The response stored when the wait was resolved; ``None`` for an
        unknown or unresolved wait, or a resume without a response. Read-only."""
        ...


@runtime_checkable
class DagRetryStore(DagStore, Protocol):
    """Task and run retries."""

    def try_create_task_retry(self, task_id: str, *, expected_attempt_id: str) -> str | None:
        """One transaction: replace the current CRASHED attempt (run RUNNING, task in
        its active launch) with a new QUEUED attempt and its outbox row, keeping
        plan, generation and wait correlation. Returns the new attempt ID;
        ``None`` changes nothing."""
        ...

    def try_reopen_run(
        self, run_id: str, boundary_indices: tuple[int, ...] | None
    ) -> RunReopenResult | None:
        """One transaction under the run lock: reopen a FAILED, CRASHED or
        CANCELLED run.

        The store derives every unsuccessful active launch and its descendants;
        a boundary (FAILED/CRASHED runs only) is an assertion that each listed
        node still holds an active failure. Each affected node generation is
        invalidated as a unit (successful siblings and outputs included; output
        IDs stay reserved) and advanced; the retry count increments and older
        snapshots go stale. ``None``: not retryable or the boundary does not
        hold; nothing changed.
        """
        ...

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

    def try_rerun_nodes(self, run_id: str, node_indices: tuple[int, ...]) -> RunReopenResult | None:
        """One transaction under the run lock: the named nodes and all their
        descendants become a new generation (launches, tasks and outputs
        invalidated as a unit; output IDs stay reserved) and the run is
        RUNNING again, from RUNNING or any terminal status (COMPLETED
        included); the retry count increments.

        Raises :class:`RerunRefusedError` (nothing changed) if an affected task
        is RUNNING. ``None``: missing or PENDING run, empty or out-of-range
        indices.
        """
        ...


@runtime_checkable
class OutputResolver(Protocol):
    """Materialises planned outputs for a worker."""

    def resolve_outputs(
        self, run_id: str, output_ids: tuple[str, ...]
    ) -> Mapping[str, ResolvedOutput]:
        """Exactly the requested, still-valid outputs of that run, keyed by ID.

        Missing or invalidated IDs are absent; ``resolve_task_inputs`` turns any
        difference into a ``MaterializationError``. Read-only.
        """
        ...


@runtime_checkable
class DagRunStore(Protocol):
    """dagwerk's run management and introspection surface."""

    def create_run(
        self,
        run_id: str,
        nodes: Sequence[DagNode],
        *,
        run_input: Mapping[str, object] | None = None,
        failure_policy: FailurePolicy | str = FailurePolicy.FAIL_FAST,
    ) -> bool:
        """Store a PENDING run with a validated copy of its nodes and frozen input.

        Returns False (no change) if the run id exists; invalid nodes, input or
        policy raise typed errors before any write."""
        ...

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run's record; ``None`` if it does not exist."""
        ...

    def get_task(self, task_id: str) -> TaskRecord | None:
        """The task's record (invalidated tasks included); ``None`` if unknown."""
        ...

    def list_tasks(self, run_id: str, *, include_invalidated: bool = False) -> list[TaskRecord]:
        """Tasks of the run in creation order (active generation only unless asked)."""
        ...

    def list_deliveries(self, run_id: str | None = None) -> list[Delivery]:
        """Deliverable outbox rows (not acked, not invalidated), in creation order."""
        ...

    def ack_delivery(self, delivery_id: str) -> bool:
        """Remove a delivery; True if this call removed it."""
        ...

    def try_cancel_run(self, run_id: str, reason: str | None = None) -> bool:
        """PENDING or RUNNING -> CANCELLED in one commit: invalidate active waits,
        cancel unfinished tasks, drop their deliveries. True iff this call made
        the transition."""
        ...

    def get_output_ids(self, run_id: str, node_index: int) -> tuple[str, ...]:
        """Ids of the outputs currently published (active generation) by a node, in order."""
        ...

    def list_attempts(self, task_id: str) -> list[AttemptRecord]:
        """Every attempt of the task, oldest first (empty for an unknown task)."""
        ...

    def list_runs(self, *, status: RunStatus | None = None, limit: int = 50) -> list[RunRecord]:
        """Up to ``limit`` runs (of ``status`` when given), newest first."""
        ...


@dataclass(frozen=True, slots=True)
class RunActivity:
    """What the failure policies need to know about a run's active generation.

    ``failed_nodes`` are nodes whose active launch FAILED or holds a FAILED or
    CRASHED task; ``failed_launches`` are ordered by node index, the task
    references by task creation order.
    """

    queued: int
    running: int
    waiting: int
    failed_nodes: frozenset[int]
    failed_launches: tuple[NodeLaunchRef, ...]
    failed_tasks: tuple[TaskAttemptRef, ...]
    crashed_tasks: tuple[TaskAttemptRef, ...]

    @property
    def has_failure(self) -> bool:
        return bool(self.failed_nodes)


@runtime_checkable
class RunActivityStore(Protocol):
    """Optional fast path for the failure policies (dagwerk extension).

    A store that keeps per-run counters implements this so that the
    ``stop_on_first_failure`` and ``continue_others`` policies do not scan every
    task after each completion. Without it the orchestrator derives the same
    record from :meth:`DagRunStore.list_tasks`.
    """

    def get_run_activity(self, run_id: str) -> RunActivity | None:
        """Counts and failures of the run's active generation; ``None`` if the run
        does not exist. Read-only."""
        ...


@runtime_checkable
class RunTopologyStore(Protocol):
    """Optional fast path: the run's validated topology, cached (dagwerk extension).

    A run's node definitions never change after the run record is created, so
    a store may build the :class:`~dagwerk.topology.RunTopology` once and hand
    the same immutable object to every caller. Without it the orchestrator
    reads :meth:`DagStore.get_run_nodes` and builds the topology itself.
    """

    def get_run_topology(self, run_id: str) -> RunTopology | None:
        """The run's topology validated under the store's ``limits``; ``None`` if
        the run does not exist. Raises
        :class:`~dagwerk.errors.GraphValidationError` for an invalid stored
        definition (and caches nothing then). Read-only."""
        ...

    def get_run_node(self, run_id: str, node_index: int) -> DagNode | None:
        """A copy of one stored node definition; ``None`` if the run or the
        index does not exist. Read-only."""
        ...

    def get_run_failure_policy(self, run_id: str) -> FailurePolicy | None:
        """The run's failure policy (fixed when the run is created); ``None`` if
        the run does not exist. Read-only."""
        ...


@dataclass(frozen=True, slots=True)
class LaunchProgress:
    """The state of one active launch that readiness depends on."""

    launch_id: str
    node_index: int
    generation: int
    disposition: NodeDisposition
    complete: bool


@dataclass(frozen=True, slots=True)
class RunFrontier:
    """What a reconcile after a completion needs to know about a run, read in
    one snapshot.

    ``complete_nodes`` counts the run's active launches that are complete
    (any disposition), ``None`` unless asked for (counting reads every
    launch of the run); ``has_failure`` says whether an active launch FAILED
    or an active task is FAILED or CRASHED; ``launches`` holds the active
    launches of the requested nodes that have one, keyed by node index.
    """

    status: RunStatus
    node_count: int
    complete_nodes: int | None
    has_failure: bool
    launches: Mapping[int, LaunchProgress]


@runtime_checkable
class RunFrontierStore(Protocol):
    """Optional fast path for the reconcile after a completion (dagwerk
    extension, issue 9): the launches around the completed nodes instead of
    every launch of the run. Without it the orchestrator reconciles in full."""

    def get_run_frontier(
        self, run_id: str, node_indices: Sequence[int], *, count_complete: bool = False
    ) -> RunFrontier | None:
        """The run's frontier with the active launches of ``node_indices``
        (indices outside the run are ignored) and, with ``count_complete``,
        its count of complete launches; ``None`` if the run does not exist.
        Read-only."""
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
    ) -> list[LeasedDelivery]:
        """Lease up to ``limit`` rows to ``worker_id`` in one transaction.

        Candidates are available now (``available_at`` reached, no live lease)
        and in one of ``queues`` (any queue when ``None``), taken by priority
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


CompletionOutcome = TaskCompletionResult | None | DagwerkError
"""Per request: the completion record, ``None`` (not accepted), or the typed
error that refused it (nothing of that request was written)."""


@runtime_checkable
class BatchQueueStore(Protocol):
    """Several worker transitions per commit (dagwerk extension, issue 9).

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
    ) -> list[ClaimedDelivery]:
        """:meth:`DagQueueStore.dequeue`, then for every leased row
        ``try_claim_task(task_id, expected_attempt_id=row.attempt_id,
        expected_generation=row.generation)``; the claims commit together
        (with the leases, where the backend can do so without a lock-order
        hazard). Same arguments, waiting and dead-lettering as ``dequeue``;
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

    Time comes from the store's clock. Each method is one transaction.
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


# --- dagwerk extension: composite child runs and budgets (issue 7) ------------


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
