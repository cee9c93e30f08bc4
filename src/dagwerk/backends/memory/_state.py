"""The mutable records behind :class:`MemoryStore` (private).

Only the store touches these, always under its lock. Public reads return
frozen copies (``RunRecord``, ``TaskRecord``, ``NodeLaunch``), never these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from dagwerk.constants import FailurePolicy, NodeDisposition, RunStatus, TaskStatus
from dagwerk.json import FrozenDict, JsonValue
from dagwerk.models import DagNode, NodeLaunch, OutputRef, ResolvedOutput, TaskInputPlan
from dagwerk.store import (
    AttemptRecord,
    TaskCompletionResult,
    TaskFailureResult,
    TaskResumeResult,
    TaskWaitResult,
)
from dagwerk.topology import RunTopology


class WaitState(Enum):
    ACTIVE = "active"
    RESOLVED = "resolved"
    INVALIDATED = "invalidated"


@dataclass(slots=True)
class OutputState:
    ref: OutputRef
    resolved: ResolvedOutput
    node_index: int
    routing_size: int
    invalidated: bool = False


@dataclass(slots=True)
class LaunchState:
    launch_id: str
    node_index: int
    generation: int
    plugin: str
    disposition: NodeDisposition
    task_ids: tuple[str, ...]
    error: str
    completed: int = 0
    # The public NodeLaunch, rebuilt only when completeness changes.
    cached: NodeLaunch | None = None

    @property
    def complete(self) -> bool:
        return self.disposition is not NodeDisposition.LAUNCHED or self.completed == len(
            self.task_ids
        )

    def view(self, run_id: str) -> NodeLaunch:
        if self.cached is None or self.cached.complete != self.complete:
            self.cached = NodeLaunch(
                id=self.launch_id,
                run_id=run_id,
                node_index=self.node_index,
                plugin_name=self.plugin,
                generation=self.generation,
                disposition=self.disposition,
                task_ids=self.task_ids,
                complete=self.complete,
                error=self.error,
            )
        return self.cached


@dataclass(slots=True)
class TaskState:
    task_id: str
    run_id: str
    node_index: int
    generation: int
    launch_id: str
    seq: int
    status: TaskStatus
    attempt_id: str
    plan: TaskInputPlan
    error: str | None = None
    resumed_from_wait_id: str | None = None
    active_wait_id: str | None = None
    invalidated: bool = False
    # Every wait ID this task ever used: a task never reuses one (WT-04).
    wait_ids: set[str] = field(default_factory=set)
    completion: TaskCompletionResult | None = None
    failure: TaskFailureResult | None = None
    attempt_number: int = 1
    # The worker that last leased a delivery of the current attempt.
    worker_id: str | None = None
    # Attempts lost with their worker (recoveries); a recovered attempt's row
    # starts its delivery count here so poison tasks still dead-letter.
    lost_deliveries: int = 0
    past_attempts: list[AttemptRecord] = field(default_factory=list)
    # The stored traceback of each of its attempts that has one, by attempt ID.
    tracebacks: dict[str, str] = field(default_factory=dict)
    # Store times the current attempt was claimed and settled.
    started_at: float | None = None
    finished_at: float | None = None


@dataclass(slots=True)
class WaitEntry:
    task_id: str
    wait_id: str
    attempt_id: str
    generation: int
    state: WaitState
    result: TaskWaitResult
    resume: TaskResumeResult | None = None
    response: JsonValue | None = None
    # Store time at which the wait began (committed with the WAITING status).
    waited_at: float = 0.0


@dataclass(slots=True)
class RunState:
    run_id: str
    nodes: tuple[DagNode, ...]
    run_input: FrozenDict
    failure_policy: FailurePolicy
    status: RunStatus = RunStatus.PENDING
    retry_count: int = 0
    error: str | None = None
    topology: RunTopology | None = None
    generations: list[int] = field(default_factory=list)
    node_revisions: list[int] = field(default_factory=list)
    # Bumped by every terminal transition and reopen: all older tokens go stale.
    epoch: int = 0
    launches: dict[int, LaunchState] = field(default_factory=dict)
    reserved_ids: set[str] = field(default_factory=set)
    outputs: dict[str, OutputState] = field(default_factory=dict)
    node_outputs: dict[int, list[str]] = field(default_factory=dict)
    task_ids: list[str] = field(default_factory=list)
    # Per-status counts of the active generation's tasks.
    counts: dict[TaskStatus, int] = field(default_factory=lambda: dict.fromkeys(TaskStatus, 0))
    # Active FAILED/CRASHED tasks -> creation sequence, for the failure policies.
    failed_tasks: dict[str, int] = field(default_factory=dict)
    created_at: float = 0.0
    finished_at: float | None = None
    pipeline: str | None = None

    def __post_init__(self) -> None:
        count = len(self.nodes)
        self.generations = [0] * count
        self.node_revisions = [0] * count

    @property
    def settled_nodes(self) -> int:
        return sum(1 for launch in self.launches.values() if launch.complete)


@dataclass(slots=True)
class QueueRow:
    """The queue state of one outbox row (``available_at`` is its visibility time)."""

    seq: int
    queue: str
    priority: int
    available_at: float
    run_id: str = ""
    plugin: str = ""
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    delivery_count: int = 0
