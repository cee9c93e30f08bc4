"""Store protocols, their result records and the errors of the store boundary.

An application brings its own database and queue by implementing these
protocols; :mod:`dagwerk.backends` ships implementations. ``DagStore``,
``DagWaitStore``, ``DagRetryStore`` and ``OutputResolver`` are the seed's,
method for method: a store that implements exactly those works with every
seed function. dagwerk's additions are extension protocols of their own
(``WaitResponseStore``, ``DelayedRetryStore``, ``NodeRerunStore``,
``DagRunStore``, the queue, ...), looked up once per store
(:class:`dagwerk.capabilities.StoreCapabilities`); without one, its caller
does what the seed does. Each capability's protocols and records live in a
module of their own (``dagwerk.store_queue``, ``dagwerk.store_waits``, ...)
and are re-exported here. Every method that
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
    WorkerPresenceRequest,
    check_worker_presence,
    validate_output_batch_routing_size,
    validate_output_batch_size,
    validate_pipeline_name,
    validate_plugin_names,
    validate_queue_names,
    validate_run_preference,
    validate_seconds,
    validate_wait_id,
    validate_worker_id,
)
from dagwerk.constants import (
    FailurePolicy,
    NodeDisposition,
    RunStatus,
)
from dagwerk.models import (
    DagNode,
    EmittedOutput,
    LaunchCreateResult,
    NodeLaunch,
    PlanningSnapshot,
    ResolvedOutput,
    TaskInputPlan,
)
from dagwerk.store_backstop import (
    BackstopStore,
    LiveNodeStore,
    QueueStats,
    RunningTasksStore,
    StallRecord,
    WaitAgesStore,
)
from dagwerk.store_children import (
    DagBudgetStore,
    DagChildStore,
)
from dagwerk.store_claims import (
    BatchQueueStore,
    ClaimAheadStore,
    ClaimedDelivery,
    CompletionOutcome,
    CompletionRequest,
    RecentOutputsStore,
    UnitOfWorkStore,
)
from dagwerk.store_durable import (
    MAX_STEP_NAME_LENGTH,
    DurableTaskStore,
    StepRecord,
    TaskChildRecord,
    TaskJournal,
    TaskWaitEntry,
    validate_step_name,
)
from dagwerk.store_lifetime import (
    ClosableStore,
    LimitedStore,
)
from dagwerk.store_logs import (
    MAX_TASK_LOG_BATCH,
    MAX_TASK_LOG_READ,
    RunTraceStore,
    TaskLogError,
    TaskLogLine,
    TaskLogQuery,
    TaskLogStore,
    check_task_log_lines,
    check_task_log_query,
    check_traceparent,
)
from dagwerk.store_queue import (
    DagQueueStore,
    DeadLetter,
    LeasedDelivery,
    QueueForecastStore,
)
from dagwerk.store_retention import (
    DEFAULT_RETENTION_BATCH,
    MAX_RETENTION_BATCH,
    RetentionBatch,
    RetentionCursor,
    RetentionRequest,
    RunRetentionStore,
    check_retention_request,
)
from dagwerk.store_retries import (
    DelayedRetryStore,
    NodeRerunStore,
)
from dagwerk.store_schedules import (
    IdempotentRun,
    IdempotentSubmitStore,
    NamedLease,
    NewRun,
    ScheduleFire,
    ScheduleFireResult,
    ScheduleRecord,
    ScheduleStore,
)
from dagwerk.store_views import (
    NodeTaskStats,
    RunCursor,
    RunPage,
    RunQuery,
    RunViewStore,
    TaskQuery,
    TaskWait,
)
from dagwerk.store_waits import (
    WaitRecord,
    WaitRecordStore,
    WaitResponseStore,
)
from dagwerk.store_workers import (
    WORKER_RECORDS_KEPT_SECONDS,
    ExpiredLease,
    WorkerPresenceStore,
    WorkerRecord,
)
from dagwerk.topology import RunTopology

__all__ = [  # noqa: RUF022 (extension modules' names grouped at the end)
    "WORKER_RECORDS_KEPT_SECONDS",
    "AttemptRecord",
    "BackstopStore",
    "BatchQueueStore",
    "ClaimAheadStore",
    "ClaimedDelivery",
    "ClosableStore",
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
    "DelayedRetryStore",
    "Delivery",
    "ExpiredLease",
    "InvalidStoreValueError",
    "LaunchProgress",
    "LeasedDelivery",
    "LimitedStore",
    "LiveNodeStore",
    "NodeLaunchRef",
    "NodeRerunStore",
    "OutputPublicationError",
    "OutputResolver",
    "QueueForecastStore",
    "QueueStats",
    "RecentOutputsStore",
    "RerunRefusedError",
    "RunActivity",
    "RunActivityStore",
    "RunFrontier",
    "RunFrontierStore",
    "RunRecord",
    "RunReopenResult",
    "RunTopologyStore",
    "RunningTasksStore",
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
    "UnitOfWorkStore",
    "WaitAgesStore",
    "WaitRecord",
    "WaitRecordStore",
    "WaitResponseStore",
    "WorkerPresenceRequest",
    "WorkerPresenceStore",
    "WorkerRecord",
    "check_worker_presence",
    "validate_output_batch_routing_size",
    "validate_output_batch_size",
    "validate_pipeline_name",
    "validate_plugin_names",
    "validate_queue_names",
    "validate_run_preference",
    "validate_seconds",
    "validate_wait_id",
    "validate_worker_id",
    # durable task records (dagwerk.store_durable)
    "MAX_STEP_NAME_LENGTH",
    "DurableTaskStore",
    "StepRecord",
    "TaskChildRecord",
    "TaskJournal",
    "TaskWaitEntry",
    "validate_step_name",
    "MAX_TASK_LOG_BATCH",
    "MAX_TASK_LOG_READ",
    "RunTraceStore",
    "TaskLogError",
    "TaskLogLine",
    "TaskLogQuery",
    "TaskLogStore",
    "check_task_log_lines",
    "check_task_log_query",
    "check_traceparent",
    "IdempotentRun",
    "IdempotentSubmitStore",
    "NamedLease",
    "NewRun",
    "ScheduleFire",
    "ScheduleFireResult",
    "ScheduleRecord",
    "ScheduleStore",
    "NodeTaskStats",
    "RunCursor",
    "RunPage",
    "RunQuery",
    "RunViewStore",
    "TaskQuery",
    "TaskWait",
]
__all__ += [  # dagwerk.store_retention
    "DEFAULT_RETENTION_BATCH",
    "MAX_RETENTION_BATCH",
    "RetentionBatch",
    "RetentionCursor",
    "RetentionRequest",
    "RunRetentionStore",
    "check_retention_request",
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
    """Optional: tasks that wait on application data (human input, providers).

    Stores that keep the application's response with the wait also
    implement :class:`WaitResponseStore`.
    """

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
        self, task_id: str, wait_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskResumeResult | None:
        """One transaction: resolve an active wait and create exactly one
        replacement QUEUED attempt with its outbox row.

        An exact repeat returns the first result without new work, even
        after later changes. ``None``: unknown wait, wrong attempt or
        generation, or a wait invalidated before it was resolved.
        """
        ...


@runtime_checkable
class DagRetryStore(DagStore, Protocol):
    """Task and run retries.

    Stores that fail and retry an attempt in one commit also implement
    :class:`DelayedRetryStore`; stores that re-run chosen nodes,
    :class:`NodeRerunStore`.
    """

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
        pipeline: str | None = None,
    ) -> bool:
        """Store a PENDING run with a validated copy of its nodes and frozen input.

        ``pipeline`` is the name of the pipeline it comes from, kept for
        people (``RunRecord.pipeline``); it changes nothing else. Returns
        False (no change) if the run id exists; invalid nodes, input, policy
        or pipeline name raise typed errors before any write."""
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
    extension): the launches around the completed nodes instead of
    every launch of the run. Without it the orchestrator reconciles in full."""

    def get_run_frontier(
        self, run_id: str, node_indices: Sequence[int], *, count_complete: bool = False
    ) -> RunFrontier | None:
        """The run's frontier with the active launches of ``node_indices``
        (indices outside the run are ignored) and, with ``count_complete``,
        its count of complete launches; ``None`` if the run does not exist.
        Read-only."""
        ...
