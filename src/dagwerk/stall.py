"""Why a node has not run, and whether a run is stalled (pure; seed 004).

Everything here is a function of durable facts the caller read from the
store: the run's nodes and status, its failure policy, the active launches,
the active tasks, which (task, attempt) pairs have a deliverable queue row,
how long each WAITING task has waited, and (where the store records them)
the workers seen and the deliveries held on expired leases. Nothing is stored: the status of
a node is derived again on every call, so it cannot go stale (GD-01).

A RUNNING run is *stalled* when nothing can make progress without an
operator: no task is QUEUED with a delivery, RUNNING, or WAITING within its
node's ``wait_timeout_seconds``, no node can become ready, and the run is not
merely waiting to be finalised. Once workers have recorded themselves, a
QUEUED task, or a RUNNING one whose lease expired, counts as live only while
some live worker serves its node's plugin and queue: otherwise the node is
held with "no live worker has plugin X" and when a worker was last seen.
Stalls are observability only (GD-04): the caller reports them and never
"fixes" them here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from dagwerk.constants import FailurePolicy, NodeDisposition, RunStatus, TaskStatus
from dagwerk.models import DagNode, NodeLaunch


class TaskFacts(Protocol):
    """What the diagnosis reads of a task (a store's ``TaskRecord``)."""

    @property
    def task_id(self) -> str: ...
    @property
    def attempt_id(self) -> str: ...
    @property
    def node_index(self) -> int: ...
    @property
    def status(self) -> TaskStatus: ...
    @property
    def error(self) -> str | None: ...
    @property
    def active_wait_id(self) -> str | None: ...


class WorkerFacts(Protocol):
    """What the diagnosis reads of a recorded worker (a store's ``WorkerRecord``)."""

    @property
    def plugins(self) -> tuple[str, ...]: ...
    @property
    def seen_seconds_ago(self) -> float: ...
    @property
    def live(self) -> bool: ...
    def serves(self, plugin: str, queue: str) -> bool: ...


class LeaseFacts(Protocol):
    """What the diagnosis reads of a delivery on an expired lease (a store's
    ``ExpiredLease``)."""

    @property
    def task_id(self) -> str: ...
    @property
    def attempt_id(self) -> str: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def expired_seconds_ago(self) -> float: ...


__all__ = [
    "NodeExplanation",
    "NodeState",
    "RunDiagnosis",
    "StallState",
    "diagnose_run",
]


class NodeState(StrEnum):
    """The derived state of one node of a run."""

    DONE = "done"
    SKIPPED = "skipped"
    FAILED = "failed"
    UPSTREAM_FAILED = "upstream_failed"
    RUNNING = "running"
    QUEUED = "queued"
    WAITING = "waiting"
    READY = "ready"
    PENDING = "pending"
    HELD = "held"
    """Cannot progress: held by the failure policy, an overdue wait or a lost delivery."""
    NOT_RUN = "not_run"
    """The run is over and the node never ran."""


_LIVE = frozenset({NodeState.RUNNING, NodeState.QUEUED, NodeState.WAITING, NodeState.READY})
_SETTLED = frozenset(
    {NodeState.DONE, NodeState.SKIPPED, NodeState.FAILED, NodeState.UPSTREAM_FAILED}
)


@dataclass(frozen=True, slots=True)
class NodeExplanation:
    """One node's derived state and the reason, in words, it has (not) run."""

    node_index: int
    slug: str
    state: NodeState
    reason: str


@dataclass(frozen=True, slots=True)
class StallState:
    """A stall: the held nodes (not settled, sorted) and a one-line reason."""

    held_nodes: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class RunDiagnosis:
    """Per-node explanations in node order, and the stall (``None``: not stalled)."""

    run_id: str
    status: RunStatus
    nodes: tuple[NodeExplanation, ...]
    stall: StallState | None

    @property
    def stalled(self) -> bool:
        return self.stall is not None


def _dependencies(nodes: Sequence[DagNode]) -> list[tuple[int, ...]]:
    """Source node indices of each node, in edge order, without repeats."""
    index_of = {node.slug: index for index, node in enumerate(nodes)}
    found: list[tuple[int, ...]] = []
    for node in nodes:
        seen: dict[int, None] = {}
        for edge in node.edges:
            source = index_of.get(edge.source)
            if source is not None:
                seen.setdefault(source, None)
        found.append(tuple(seen))
    return found


@dataclass(frozen=True, slots=True)
class _Workers:
    """What the diagnosis knows of the workers (``records`` ``None``: nothing)."""

    records: Sequence[WorkerFacts] | None
    expired: Mapping[tuple[str, str], LeaseFacts]

    def missing(self, node: DagNode) -> str | None:
        """Why no live worker serves the node's tasks; ``None`` when one does
        (or the workers are not known)."""
        if not self.records:
            return None  # no worker ever recorded itself: nothing is known
        live = [w for w in self.records if w.live]
        if any(w.serves(node.plugin, node.queue) for w in live):
            return None
        where = ""
        if any(node.plugin in w.plugins for w in live):
            where = f" in queue '{node.queue}'"
        if live:
            seen = "1 live worker serves" if len(live) == 1 else f"{len(live)} live workers serve"
            seen += " other plugins or queues"
        else:
            seen = f"no worker seen for {min(w.seen_seconds_ago for w in self.records):.0f}s"
        return f"no live worker has plugin '{node.plugin}'{where} ({seen})"


def _task_state(
    node: DagNode,
    tasks: Sequence[TaskFacts],
    delivered: Collection[tuple[str, str]],
    waited: Mapping[str, float],
    workers: _Workers,
) -> tuple[NodeState, str]:
    """The state of a launched node from its tasks (first match wins)."""
    failed = [t for t in tasks if t.status in (TaskStatus.FAILED, TaskStatus.CRASHED)]
    if failed:
        first = failed[0]
        return NodeState.FAILED, f"task {first.task_id} {first.status.value}: {first.error or ''}"
    running = [t for t in tasks if t.status is TaskStatus.RUNNING]
    if running:
        leases = [workers.expired.get((t.task_id, t.attempt_id)) for t in running]
        on_expired = [lease for lease in leases if lease is not None]
        if len(on_expired) < len(running):
            return NodeState.RUNNING, "running"
        oldest = max(on_expired, key=lambda lease: lease.expired_seconds_ago)
        expired = (
            f"task {oldest.task_id} is RUNNING on a lease of worker {oldest.worker_id} "
            f"that expired {oldest.expired_seconds_ago:.0f}s ago"
        )
        missing = workers.missing(node)
        if missing is not None:
            return NodeState.HELD, f"{expired}; {missing}"
        return NodeState.RUNNING, f"{expired}; a live worker will recover it"
    queued = [t for t in tasks if t.status is TaskStatus.QUEUED]
    if any((t.task_id, t.attempt_id) in delivered for t in queued):
        missing = workers.missing(node)
        if missing is not None:
            return NodeState.HELD, missing
        return NodeState.QUEUED, "queued for a worker"
    if queued:
        lost = queued[0]
        return NodeState.HELD, f"task {lost.task_id} is QUEUED but its delivery is missing"
    waiting = [t for t in tasks if t.status is TaskStatus.WAITING]
    if waiting:
        first = waiting[0]
        wait = f"waiting for resume of wait {first.active_wait_id}"
        limit = node.wait_timeout_seconds
        if limit is not None:
            overdue = [t for t in waiting if waited.get(t.task_id, 0.0) >= limit]
            if len(overdue) == len(waiting):
                age = waited.get(first.task_id, 0.0)
                return NodeState.HELD, f"{wait} for {age:.0f}s (wait timeout {limit:g}s)"
        return NodeState.WAITING, wait
    if any(t.status is TaskStatus.CANCELLED for t in tasks):
        return NodeState.NOT_RUN, "cancelled"
    return NodeState.DONE, "completed"


def diagnose_run(
    run_id: str,
    status: RunStatus,
    nodes: Sequence[DagNode],
    launches: Mapping[int, NodeLaunch],
    tasks: Sequence[TaskFacts],
    *,
    failure_policy: FailurePolicy | str = FailurePolicy.FAIL_FAST,
    delivered: Collection[tuple[str, str]] = frozenset(),
    wait_ages: Mapping[str, float] | None = None,
    workers: Sequence[WorkerFacts] | None = None,
    expired_leases: Sequence[LeaseFacts] = (),
) -> RunDiagnosis:
    """Explain every node of a run and decide whether the run is stalled.

    ``tasks`` are the run's active tasks; ``delivered`` holds the
    ``(task_id, attempt_id)`` pairs that have a deliverable queue row;
    ``wait_ages`` maps WAITING task IDs to seconds waited so far;
    ``workers`` are the recorded workers (``None`` or empty: not known, every
    queued task counts as served) and ``expired_leases`` the run's deliveries held
    on expired leases. Only a RUNNING run can be stalled.
    """
    policy = FailurePolicy(failure_policy)
    known = _Workers(
        workers, {(lease.task_id, lease.attempt_id): lease for lease in expired_leases}
    )
    waited = wait_ages or {}
    deps = _dependencies(nodes)
    by_node: dict[int, list[TaskFacts]] = {}
    for record in tasks:
        by_node.setdefault(record.node_index, []).append(record)
    states: dict[int, tuple[NodeState, str]] = {}
    # Pass 1: nodes with a launch are explained by their launch and tasks.
    for index, node in enumerate(nodes):
        launch = launches.get(index)
        if launch is None:
            continue
        if launch.disposition is NodeDisposition.FAILED:
            states[index] = (NodeState.FAILED, f"planning failed: {launch.error}")
        elif launch.disposition is NodeDisposition.UPSTREAM_FAILED:
            states[index] = (NodeState.UPSTREAM_FAILED, "")  # named in pass 2
        elif launch.disposition is not NodeDisposition.LAUNCHED:
            states[index] = (NodeState.SKIPPED, f"{launch.disposition.value}: no task to run")
        else:
            states[index] = _task_state(node, by_node.get(index, []), delivered, waited, known)
    failed_anywhere = [i for i, (state, _) in sorted(states.items()) if state is NodeState.FAILED]
    # Pass 2: nodes without a launch (and UPSTREAM_FAILED ones), in index order
    # of a topological walk so each dependency is explained first.
    for index in _topological(deps):
        found = states.get(index)
        if found is not None and found[0] is not NodeState.UPSTREAM_FAILED:
            continue
        culprit = _failed_source(index, deps, states)
        if found is not None:
            where = nodes[culprit].slug if culprit is not None else "an upstream node"
            states[index] = (NodeState.UPSTREAM_FAILED, f"upstream failed at {where}")
            continue
        states[index] = _unlaunched(
            index,
            nodes=nodes,
            deps=deps,
            states=states,
            status=status,
            policy=policy,
            failed_anywhere=failed_anywhere,
        )
    explanations = tuple(
        NodeExplanation(index, node.slug, *states[index]) for index, node in enumerate(nodes)
    )
    stall = _stall(status, explanations) if status is RunStatus.RUNNING else None
    return RunDiagnosis(run_id, status, explanations, stall)


def _topological(deps: Sequence[tuple[int, ...]]) -> list[int]:
    """Indices with every dependency first, in rounds: each round is every
    node whose dependencies are all placed, in index order (cycles and
    unknown dependencies, which validation rejects, fall back to the lowest
    unplaced index). Linear in nodes and edges: it once rescanned every
    unplaced node per round, which is quadratic for a chain."""
    count = len(deps)
    unplaced_deps = [len(set(found)) for found in deps]
    dependents: list[list[int]] = [[] for _ in range(count)]
    for index, found in enumerate(deps):
        for dependency in set(found):
            if type(dependency) is int and 0 <= dependency < count:
                dependents[dependency].append(index)
    placed = [False] * count
    order: list[int] = []
    ready = [index for index in range(count) if unplaced_deps[index] == 0]
    lowest = 0
    while len(order) < count:
        if not ready:
            while placed[lowest]:
                lowest += 1
            ready = [lowest]
        freed: list[int] = []
        for index in ready:
            placed[index] = True
            order.append(index)
        for index in ready:
            for dependent in dependents[index]:
                unplaced_deps[dependent] -= 1
                if unplaced_deps[dependent] == 0 and not placed[dependent]:
                    freed.append(dependent)
        ready = sorted(freed)
    return order


def _failed_source(
    index: int, deps: Sequence[tuple[int, ...]], states: Mapping[int, tuple[NodeState, str]]
) -> int | None:
    """The failed node behind ``index``'s first failed or upstream-failed source."""
    for source in deps[index]:
        found = states.get(source)
        if found is None:
            continue
        if found[0] is NodeState.FAILED:
            return source
        if found[0] is NodeState.UPSTREAM_FAILED:
            return _failed_source(source, deps, states)
    return None


def _unlaunched(
    index: int,
    *,
    nodes: Sequence[DagNode],
    deps: Sequence[tuple[int, ...]],
    states: Mapping[int, tuple[NodeState, str]],
    status: RunStatus,
    policy: FailurePolicy,
    failed_anywhere: Sequence[int],
) -> tuple[NodeState, str]:
    culprit = _failed_source(index, deps, states)
    if culprit is not None:
        return NodeState.UPSTREAM_FAILED, f"upstream failed at {nodes[culprit].slug}"
    if status is not RunStatus.RUNNING:
        return NodeState.NOT_RUN, f"run is {status.value}"
    if policy is FailurePolicy.STOP_ON_FIRST_FAILURE and failed_anywhere:
        return (
            NodeState.HELD,
            f"held by stop_on_first_failure (node {nodes[failed_anywhere[0]].slug} failed)",
        )
    for source in deps[index]:
        state = states.get(source, (NodeState.PENDING, ""))[0]
        if state not in (NodeState.DONE, NodeState.SKIPPED):
            return NodeState.PENDING, f"waiting on node {nodes[source].slug}"
    return NodeState.READY, "ready to launch"


def _stall(status: RunStatus, explanations: Sequence[NodeExplanation]) -> StallState | None:
    """GD-04 in this engine's terms: nothing live, something not settled."""
    if any(e.state in _LIVE for e in explanations):
        return None
    held = [e for e in explanations if e.state not in _SETTLED]
    if not held:
        return None  # everything settled: the run only awaits finalisation
    # PENDING nodes are held by something upstream that is itself held; the
    # reason names the nodes that are stuck for a reason of their own.
    roots = [e for e in held if e.state is not NodeState.PENDING] or held
    reason = "; ".join(f"{e.slug}: {e.reason}" for e in roots)
    return StallState(tuple(e.node_index for e in held), reason)
