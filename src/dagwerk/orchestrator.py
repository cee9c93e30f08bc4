"""Run orchestration over the store protocols.

Every function here is written once against :mod:`dagwerk.store` and knows
nothing of a backend. The store makes each transition atomic; these
functions decide which transition to ask for next and check what the store
returns (:class:`~dagwerk.store.StoreContractError` on nonsense).

Callbacks fire only after a terminal transition committed, and only in the
call whose ``try_finalize_run`` returned True, so each transition is
announced exactly once. The application serialises terminal handlers and run
retries per run until a callback returns (RT-13).

Failure policies (``decisions.md``): ``fail_fast`` finalises the run on the
first failure; ``stop_on_first_failure`` creates no new launch after a failure
and finalises once no task is QUEUED or RUNNING; ``continue_others`` keeps
independent branches going, gives descendants of a failure a zero-task
``UPSTREAM_FAILED`` launch and finalises once nothing can progress. A store
that does not implement :class:`~dagwerk.store.DagRunStore` runs ``fail_fast``.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dagwerk._launch_checks import check_launch_result
from dagwerk._protocols import implements
from dagwerk.constants import (
    FailurePolicy,
    NodeDisposition,
    RunStatus,
    TaskStatus,
)
from dagwerk.errors import DagwerkError
from dagwerk.limits import DEFAULT_LIMITS, Limits
from dagwerk.models import (
    DagNode,
    EmittedOutput,
    NodeLaunch,
    PlanningSnapshot,
    TaskInputPlan,
)
from dagwerk.planning import construct_task_plans
from dagwerk.store import (
    DagRunStore,
    DagStore,
    NodeLaunchRef,
    OutputPublicationError,
    RunActivity,
    RunActivityStore,
    RunTopologyStore,
    StoreContractError,
    TaskAttemptRef,
    TaskCompletionResult,
    TaskFailureResult,
)
from dagwerk.topology import RunTopology

__all__ = [
    "OrchestratorCallbacks",
    "RunCallback",
    "RunDefinitionMissingError",
    "RunStartRejectedError",
    "abort_run",
    "cancel_run",
    "on_task_complete",
    "on_task_crashed",
    "on_task_failed",
    "reconcile_run",
    "settle_crashed_task",
    "start_run",
]

logger = logging.getLogger(__name__)

RunCallback = Callable[[str], None]
"""Receives the run ID."""


@dataclass(frozen=True, slots=True)
class OrchestratorCallbacks:
    """Run lifecycle callbacks, each invoked once after its terminal transition commits.

    A raising callback propagates to the caller; the transition it announces
    has already committed and its work is already cancelled.
    """

    on_run_completed: RunCallback
    on_run_failed: RunCallback
    on_run_crashed: RunCallback
    on_run_cancelled: RunCallback

    def fire(self, status: RunStatus, run_id: str) -> None:
        """Invoke the callback for a terminal ``status``."""
        {
            RunStatus.COMPLETED: self.on_run_completed,
            RunStatus.FAILED: self.on_run_failed,
            RunStatus.CRASHED: self.on_run_crashed,
            RunStatus.CANCELLED: self.on_run_cancelled,
        }[status](run_id)


class RunStartRejectedError(DagwerkError, RuntimeError):
    """The stored run cannot enter or stay in RUNNING."""

    code = "run_start_rejected"


class RunDefinitionMissingError(DagwerkError, ValueError):
    """The store holds no node definition for the run."""

    code = "run_definition_missing"


_ABORT_STATUSES = frozenset({RunStatus.FAILED, RunStatus.CRASHED, RunStatus.CANCELLED})
# continue_others: these dispositions make every descendant unrunnable.
_FAILED_DISPOSITIONS = frozenset({NodeDisposition.FAILED, NodeDisposition.UPSTREAM_FAILED})


def _limits_of(store: object, limits: Limits | None) -> Limits:
    if limits is not None:
        return limits
    found = getattr(store, "limits", None)
    return found if isinstance(found, Limits) else DEFAULT_LIMITS


def _failure_policy(store: DagStore, run_id: str) -> FailurePolicy:
    if implements(store, RunTopologyStore):
        # Fixed at creation: the store answers from its cache, not a run read.
        found = store.get_run_failure_policy(run_id)
        if found is not None:
            return FailurePolicy(found)
    if implements(store, DagRunStore):
        record = store.get_run(run_id)
        if record is not None:
            return FailurePolicy(record.failure_policy)
    return FailurePolicy.FAIL_FAST


def _build_topology(nodes: list[DagNode] | None, run_id: str, limits: Limits) -> RunTopology:
    if nodes is None:
        raise RunDefinitionMissingError(
            f"run {run_id!r} has no stored node definition", field="run_id"
        )
    return RunTopology.build(nodes, limits=limits)


def _topology_cache(store: DagStore, limits: Limits) -> RunTopologyStore | None:
    """The store as a topology cache when it validates under the same limits."""
    if implements(store, RunTopologyStore) and getattr(store, "limits", None) == limits:
        return store
    return None


def _cached_topology(cache: RunTopologyStore, run_id: str) -> RunTopology | None:
    found = cache.get_run_topology(run_id)
    if found is not None and not isinstance(found, RunTopology):
        raise StoreContractError.unexpected("get_run_topology", found, "RunTopology or None")
    return found


# --- start and reconcile ----------------------------------------------------


def start_run(
    store: DagStore,
    run_id: str,
    *,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> list[int]:
    """Validate the stored topology, start the run and reconcile it.

    The topology is validated before run state is touched, so an invalid
    stored graph leaves the run PENDING with no work written. Returns the root
    node indices in index order. Raises ``ValueError`` (no stored definition,
    invalid graph) or :class:`RunStartRejectedError` (missing or terminal run).
    Safe to repeat for a RUNNING run.
    """
    limits = _limits_of(store, limits)
    cache = _topology_cache(store, limits)
    if cache is None:
        topology = _build_topology(store.get_run_nodes(run_id), run_id, limits)
    else:
        found = _cached_topology(cache, run_id)
        if found is None:
            raise RunDefinitionMissingError(
                f"run {run_id!r} has no stored node definition", field="run_id"
            )
        topology = found
    if not store.try_start_run(run_id):
        raise RunStartRejectedError(
            f"run {run_id!r} cannot be started: it is missing or already terminal",
            field="run_id",
        )
    _Reconciler(store, run_id, topology, callbacks, limits).run()
    return list(topology.roots)


def reconcile_run(
    store: DagStore,
    run_id: str,
    *,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> None:
    """Create launches for the ready nodes of a RUNNING run and finalise it when
    its failure policy or completion says so.

    Does nothing (and reads no topology) unless the run is RUNNING. Safe to
    call after any commit, any number of times. Raises
    :class:`~dagwerk.store.StoreContractError` when the store contradicts the
    protocol (e.g. a RUNNING run without stored nodes).
    """
    if store.get_run_status(run_id) != RunStatus.RUNNING:
        return
    limits = _limits_of(store, limits)
    cache = _topology_cache(store, limits)
    found: RunTopology | None
    if cache is None:
        nodes = store.get_run_nodes(run_id)
        found = None if nodes is None else RunTopology.build(nodes, limits=limits)
    else:
        found = _cached_topology(cache, run_id)
    if found is None:
        raise StoreContractError(f"RUNNING run {run_id!r} has no stored node definition")
    topology = found
    _Reconciler(store, run_id, topology, callbacks, limits).run()


class _Reconciler:
    """One reconcile pass: reads launches once, then launches ready nodes in
    index order, unlocking children of zero-task launches in the same pass."""

    def __init__(
        self,
        store: DagStore,
        run_id: str,
        topology: RunTopology,
        callbacks: OrchestratorCallbacks,
        limits: Limits,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.topology = topology
        self.callbacks = callbacks
        self.limits = limits
        self.policy = _failure_policy(store, run_id)
        self.launches: dict[int, NodeLaunch] = {}
        self.deferred = False

    # -- launches read once ------------------------------------------------

    def _read_launches(self) -> None:
        count = len(self.topology.nodes)
        raw = self.store.list_node_launches(self.run_id)
        if not isinstance(raw, Mapping):
            raise StoreContractError.unexpected(
                "list_node_launches", raw, "a Mapping of node index to NodeLaunch"
            )
        for index, launch in raw.items():
            if not isinstance(launch, NodeLaunch):
                raise StoreContractError(
                    f"list_node_launches returned {type(launch).__name__} for node {index!r}; "
                    "expected NodeLaunch"
                )
            if type(index) is not int or not 0 <= index < count or launch.node_index != index:
                raise StoreContractError(
                    f"list_node_launches returned the launch of node {launch.node_index} "
                    f"under key {index!r}; expected its node index, one of 0..{count - 1}",
                    field="node_index",
                )
            if launch.run_id != self.run_id:
                raise StoreContractError.mismatch(
                    f"list_node_launches for node {index}", "run_id", launch.run_id, self.run_id
                )
            self.launches[index] = launch

    def run(self) -> None:
        self._read_launches()
        if self.policy is FailurePolicy.CONTINUE_OTHERS:
            self._continue_others()
            return
        if self.policy is FailurePolicy.STOP_ON_FIRST_FAILURE:
            self._stop_on_first_failure()
            return
        failed = [
            i for i, launch in self.launches.items() if launch.disposition == NodeDisposition.FAILED
        ]
        if failed:
            # OR-04: the lowest failed node is reported, whatever the store's order.
            self._finalize_failed_launch(self.launches[min(failed)])
            return
        # A task's final failure and the run's finalisation are two commits; a
        # worker that dies between them leaves a FAILED (or CRASHED) task in a
        # RUNNING run. Re-applying fail-fast from the stored tasks lets the
        # next reconcile (the backstop's, at the latest) end the run.
        if isinstance(self.store, (RunActivityStore, DagRunStore)):
            activity = _run_activity(self.store, self.run_id, self.launches)
            if activity.failed_tasks or activity.crashed_tasks:
                self._finalize_from_activity(activity)
                return
        failed_launch = self._advance()
        if failed_launch is not None:
            self._finalize_failed_launch(failed_launch)

    def _complete_set(self) -> set[int]:
        return {i for i, launch in self.launches.items() if launch.complete}

    def _advance(self, upstream_failed: set[int] | None = None) -> NodeLaunch | None:
        """Launch ready nodes in index order until none is left.

        Without ``upstream_failed`` the pass stops at the first FAILED launch
        and returns it. With it (continue_others) a FAILED launch joins the set
        and descendants of the set get zero-task UPSTREAM_FAILED launches.
        Finalises COMPLETED when every node's launch is complete and nothing
        failed.
        """
        complete = self._complete_set()
        children = self.topology.children
        dependencies = self.topology.dependencies
        ready = self.topology.ready_nodes(complete, self.launches.keys())
        if upstream_failed:
            ready = sorted(set(ready) | self._blocked_by(upstream_failed))
        heapq.heapify(ready)
        queued = set(ready)
        while ready:
            index = heapq.heappop(ready)
            forced = (
                NodeDisposition.UPSTREAM_FAILED
                if upstream_failed is not None
                and any(p in upstream_failed for p in dependencies[index])
                else None
            )
            launch = self._launch(index, forced)
            if launch is None:
                self.deferred = True
                continue
            self.launches[index] = launch
            if launch.disposition in _FAILED_DISPOSITIONS:
                if upstream_failed is None:
                    return launch
                upstream_failed.add(index)
            if launch.complete:
                complete.add(index)
            for kid in children[index]:
                if kid in queued or kid in self.launches:
                    continue
                parents = dependencies[kid]
                if all(p in complete for p in parents) or (
                    upstream_failed is not None and any(p in upstream_failed for p in parents)
                ):
                    queued.add(kid)
                    heapq.heappush(ready, kid)
        if not upstream_failed and len(complete) == len(self.topology.nodes):
            self._finalize(RunStatus.COMPLETED)
        return None

    def _blocked_by(self, failed: set[int]) -> set[int]:
        return {
            kid
            for index in failed
            for kid in self.topology.children[index]
            if kid not in self.launches
        }

    # -- failure policies ----------------------------------------------------

    def _stop_on_first_failure(self) -> None:
        activity = _run_activity(self.store, self.run_id, self.launches)
        if not activity.has_failure:
            if self._advance() is None:
                return
            # A planning failure in this pass is the first failure.
            activity = _run_activity(self.store, self.run_id, self.launches)
        # No new launch after a failure; tasks already dispatched finish first.
        # WAITING tasks are not in flight: finalisation cancels them.
        if activity.queued == 0 and activity.running == 0:
            self._finalize_from_activity(activity)

    def _continue_others(self) -> None:
        activity = _run_activity(self.store, self.run_id, self.launches)
        failed = set(activity.failed_nodes) | {
            i for i, launch in self.launches.items() if launch.disposition in _FAILED_DISPOSITIONS
        }
        self._advance(upstream_failed=failed)
        if not failed:
            return
        activity = _run_activity(self.store, self.run_id, self.launches)
        idle = activity.queued == 0 and activity.running == 0 and activity.waiting == 0
        # Nothing can progress: no task in flight or waiting, and every node has
        # a launch (descendants of failures hold UPSTREAM_FAILED ones).
        if idle and not self.deferred and len(self.launches) == len(self.topology.nodes):
            self._finalize_from_activity(activity)

    def _finalize_from_activity(self, activity: RunActivity) -> None:
        cause: TaskAttemptRef | NodeLaunchRef
        if activity.failed_launches:
            cause, status = activity.failed_launches[0], RunStatus.FAILED
        elif activity.failed_tasks:
            cause, status = activity.failed_tasks[0], RunStatus.FAILED
        elif activity.crashed_tasks:
            cause, status = activity.crashed_tasks[0], RunStatus.CRASHED
        else:
            return
        self._finalize(status, cause=cause)

    # -- single steps --------------------------------------------------------

    def _finalize(
        self, status: RunStatus, *, cause: TaskAttemptRef | NodeLaunchRef | None = None
    ) -> None:
        if self.store.try_finalize_run(self.run_id, status, cause=cause):
            self.callbacks.fire(status, self.run_id)

    def _finalize_failed_launch(self, launch: NodeLaunch) -> None:
        ref = NodeLaunchRef(launch.id, launch.node_index, launch.generation)
        self._finalize(RunStatus.FAILED, cause=ref)

    def _launch(self, index: int, forced: NodeDisposition | None) -> NodeLaunch | None:
        """Snapshot, plan and create one launch; ``None`` if every try was stale."""
        store, topology, limits = self.store, self.topology, self.limits
        node = topology.nodes[index]
        sources = topology.source_indices(index)
        is_root = not topology.dependencies[index]
        for _ in range(max(1, limits.max_snapshot_retries)):
            snapshot = store.get_planning_snapshot(
                self.run_id,
                index,
                sources,
                max_outputs_per_edge=limits.max_snapshot_outputs_per_edge,
                max_outputs_total=limits.max_snapshot_outputs_per_node,
                max_routing_bytes=limits.max_snapshot_routing_bytes,
            )
            if not isinstance(snapshot, PlanningSnapshot):
                raise StoreContractError.unexpected(
                    "get_planning_snapshot", snapshot, "PlanningSnapshot"
                )
            plans: tuple[TaskInputPlan, ...] = ()
            if forced is not None:
                disposition, error = forced, ""
            else:
                plan = construct_task_plans(
                    node, source_indices=sources, snapshot=snapshot, is_root=is_root, limits=limits
                )
                plans, disposition, error = plan.plans, plan.disposition, plan.error
            zero = None if plans else disposition
            result = store.try_create_node_launch(
                self.run_id, index, node.plugin, snapshot.token, plans, zero, error
            )
            launch = check_launch_result(
                result,
                run_id=self.run_id,
                node_index=index,
                plugin=node.plugin,
                plan_count=len(plans),
                disposition=disposition,
                generation=snapshot.generation,
            )
            if launch is not None:
                return launch
        logger.warning(
            "run %s: node %d deferred after %d stale planning snapshots",
            self.run_id,
            index,
            limits.max_snapshot_retries,
        )
        return None


def _run_activity(store: DagStore, run_id: str, launches: Mapping[int, NodeLaunch]) -> RunActivity:
    """The failure-policy view of a run: the store's fast path, else derived from
    its task list (the store must then be a run store)."""
    if implements(store, RunActivityStore):
        found = store.get_run_activity(run_id)
        if found is not None:
            return found
    if not implements(store, DagRunStore):
        raise StoreContractError("failure policies need a DagRunStore")
    counts = dict.fromkeys(TaskStatus, 0)
    failed_nodes = {
        i for i, launch in launches.items() if launch.disposition == NodeDisposition.FAILED
    }
    failed_tasks: list[TaskAttemptRef] = []
    crashed_tasks: list[TaskAttemptRef] = []
    for record in store.list_tasks(run_id):
        counts[record.status] += 1
        if record.status == TaskStatus.FAILED:
            failed_tasks.append(TaskAttemptRef(record.task_id, record.attempt_id))
            failed_nodes.add(record.node_index)
        elif record.status == TaskStatus.CRASHED:
            crashed_tasks.append(TaskAttemptRef(record.task_id, record.attempt_id))
            failed_nodes.add(record.node_index)
    failed_launches = tuple(
        NodeLaunchRef(launch.id, i, launch.generation)
        for i, launch in sorted(launches.items())
        if launch.disposition == NodeDisposition.FAILED
    )
    return RunActivity(
        queued=counts[TaskStatus.QUEUED],
        running=counts[TaskStatus.RUNNING],
        waiting=counts[TaskStatus.WAITING],
        failed_nodes=frozenset(failed_nodes),
        failed_launches=failed_launches,
        failed_tasks=tuple(failed_tasks),
        crashed_tasks=tuple(crashed_tasks),
    )


# --- task callbacks ---------------------------------------------------------


def on_task_complete(
    store: DagStore,
    *,
    task_id: str,
    expected_attempt_id: str,
    outputs: tuple[EmittedOutput, ...] = (),
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> None:
    """Publish the attempt's outputs; reconcile when its launch became complete.

    An :class:`~dagwerk.store.OutputPublicationError` fails the task (and, by
    policy, the run) with its text. ``None`` from the store (stale, queued or
    waiting attempt) returns silently. An exact repeat reconciles again, which
    repairs a crash between the completion commit and reconcile (FN-06). A
    non-final completion of a fail-fast run reads neither topology nor launches.
    """
    complete_attempt(
        store,
        task_id=task_id,
        expected_attempt_id=expected_attempt_id,
        outputs=outputs,
        callbacks=callbacks,
        limits=limits,
    )


def complete_attempt(
    store: DagStore,
    *,
    task_id: str,
    expected_attempt_id: str,
    outputs: tuple[EmittedOutput, ...] = (),
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> TaskCompletionResult | None:
    """:func:`on_task_complete` that also returns the store's completion record
    (``None`` when this attempt's completion was not accepted), so the worker
    needs no read to learn whether its attempt won."""
    try:
        result = store.try_complete_task(
            task_id, tuple(outputs), expected_attempt_id=expected_attempt_id
        )
    except OutputPublicationError as exc:
        on_task_failed(
            store,
            task_id=task_id,
            expected_attempt_id=expected_attempt_id,
            error_message=str(exc),
            callbacks=callbacks,
            limits=limits,
        )
        return None
    if result is None:
        return None
    if not isinstance(result, TaskCompletionResult):
        raise StoreContractError.unexpected(
            "try_complete_task", result, "TaskCompletionResult or None"
        )
    for name, got, want in (
        ("task_id", result.task_id, task_id),
        ("attempt_id", result.attempt_id, expected_attempt_id),
    ):
        if got != want:
            raise StoreContractError.mismatch("try_complete_task", name, got, want)
    if result.launch_complete or _policy_needs_reconcile(store, result.run_id):
        reconcile_run(store, result.run_id, callbacks=callbacks, limits=limits)
    return result


def _policy_needs_reconcile(store: DagStore, run_id: str) -> bool:
    # Under stop_on_first_failure and continue_others the last task in flight
    # may settle the run although its own launch never completes (a sibling
    # failed), so a completion after a failure reconciles too.
    if _failure_policy(store, run_id) is FailurePolicy.FAIL_FAST:
        return False
    if implements(store, RunActivityStore):
        activity = store.get_run_activity(run_id)
        return activity is not None and activity.has_failure
    return True


def _on_task_failure(
    store: DagStore,
    result: TaskFailureResult | None,
    *,
    task_id: str,
    expected_attempt_id: str,
    expected_status: TaskStatus,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None,
) -> None:
    if result is None:
        return
    operation = "mark_task_failed" if expected_status == TaskStatus.FAILED else "mark_task_crashed"
    if not isinstance(result, TaskFailureResult):
        raise StoreContractError.unexpected(operation, result, "TaskFailureResult or None")
    for name, got, want in (
        ("task_id", result.task_id, task_id),
        ("attempt_id", result.attempt_id, expected_attempt_id),
        ("status", result.status, expected_status),
    ):
        if got != want:
            raise StoreContractError.mismatch(operation, name, got, want)
    if _failure_policy(store, result.run_id) is FailurePolicy.FAIL_FAST:
        status = RunStatus.FAILED if expected_status == TaskStatus.FAILED else RunStatus.CRASHED
        # The cause is rechecked inside the terminal transaction: a task retry
        # that committed in between keeps the run RUNNING (OR-16).
        cause = TaskAttemptRef(task_id, expected_attempt_id)
        if store.try_finalize_run(result.run_id, status, cause=cause):
            callbacks.fire(status, result.run_id)
        return
    reconcile_run(store, result.run_id, callbacks=callbacks, limits=limits)


def on_task_failed(
    store: DagStore,
    *,
    task_id: str,
    expected_attempt_id: str,
    error_message: str,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> None:
    """Mark the current attempt FAILED, then apply the run's failure policy
    (fail-fast: finalise the run FAILED citing the attempt's persisted error)."""
    result = store.mark_task_failed(task_id, error_message, expected_attempt_id=expected_attempt_id)
    _on_task_failure(
        store,
        result,
        task_id=task_id,
        expected_attempt_id=expected_attempt_id,
        expected_status=TaskStatus.FAILED,
        callbacks=callbacks,
        limits=limits,
    )


def on_task_crashed(
    store: DagStore,
    *,
    task_id: str,
    expected_attempt_id: str,
    error_message: str,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> None:
    """Mark the current attempt CRASHED, then apply the run's failure policy
    (fail-fast: finalise the run CRASHED citing the attempt)."""
    result = store.mark_task_crashed(
        task_id, error_message, expected_attempt_id=expected_attempt_id
    )
    _on_task_failure(
        store,
        result,
        task_id=task_id,
        expected_attempt_id=expected_attempt_id,
        expected_status=TaskStatus.CRASHED,
        callbacks=callbacks,
        limits=limits,
    )


def settle_crashed_task(
    store: DagStore,
    task_id: str,
    *,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> bool:
    """Apply the run's failure policy to a task the store already crashed
    (e.g. the queue dead-lettered its delivery): fail-fast finalises the run
    CRASHED citing the attempt; the other policies reconcile.

    Returns whether the task was still a current CRASHED task of a RUNNING
    run (only then does anything happen). Safe to repeat.
    """
    get_task = getattr(store, "get_task", None)
    if get_task is None:
        raise StoreContractError("settle_crashed_task needs a store with get_task")
    record = get_task(task_id)
    if record is None or record.invalidated or record.status != TaskStatus.CRASHED:
        return False
    if store.get_run_status(record.run_id) != RunStatus.RUNNING:
        return False
    result = TaskFailureResult(
        task_id=record.task_id,
        attempt_id=record.attempt_id,
        run_id=record.run_id,
        node_index=record.node_index,
        generation=record.generation,
        status=TaskStatus.CRASHED,
    )
    _on_task_failure(
        store,
        result,
        task_id=task_id,
        expected_attempt_id=record.attempt_id,
        expected_status=TaskStatus.CRASHED,
        callbacks=callbacks,
        limits=limits,
    )
    return True


# --- external termination ---------------------------------------------------


def abort_run(
    store: DagStore,
    *,
    run_id: str,
    reason: str,
    callbacks: OrchestratorCallbacks,
    status: RunStatus = RunStatus.FAILED,
) -> bool:
    """Terminate a run from outside the task lifecycle (deadline, user request).

    ``status`` must be FAILED, CRASHED or CANCELLED (else ``ValueError``).
    Returns whether this call committed the transition; only then does the
    callback fire.
    """
    if status not in _ABORT_STATUSES:
        raise ValueError(f"abort status must be failed, crashed or cancelled, not {status!r}")
    status = RunStatus(status)
    if store.try_finalize_run(run_id, status, reason=reason):
        callbacks.fire(status, run_id)
        return True
    return False


def cancel_run(
    store: DagRunStore,
    run_id: str,
    *,
    callbacks: OrchestratorCallbacks | None = None,
    reason: str | None = None,
) -> bool:
    """Cancel a PENDING or RUNNING run in one commit (waits invalidated,
    unfinished tasks cancelled). Returns whether this call made the transition;
    only then does ``on_run_cancelled`` fire."""
    if store.try_cancel_run(run_id, reason):
        if callbacks is not None:
            callbacks.on_run_cancelled(run_id)
        return True
    return False
