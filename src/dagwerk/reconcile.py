"""The reconcile machinery the orchestration functions share: one pass over a
run's launches that creates the launches of ready nodes and finalises the run
when its failure policy or completion says so, and the lookups it needs (the
limits, the failure policy, the store's topology cache).

:mod:`dagwerk.orchestrator` (``reconcile_run`` and the task callbacks),
:mod:`dagwerk.frontier` and :mod:`dagwerk.completions` build on it.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dagwerk._launch_checks import check_launch_result
from dagwerk._protocols import implements
from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import FailurePolicy, NodeDisposition, RunStatus, TaskStatus
from dagwerk.limits import DEFAULT_LIMITS, Limits
from dagwerk.models import NodeLaunch, PlanningSnapshot, TaskInputPlan
from dagwerk.planning import construct_task_plans
from dagwerk.store import (
    DagRunStore,
    DagStore,
    NodeLaunchRef,
    RunActivity,
    RunActivityStore,
    RunTopologyStore,
    StoreContractError,
    TaskAttemptRef,
)
from dagwerk.topology import RunTopology

__all__ = [
    "OrchestratorCallbacks",
    "Reconciler",
    "RunCallback",
    "cached_topology",
    "failure_policy",
    "limits_of",
    "policy_needs_reconcile",
    "run_activity",
    "topology_cache",
]

logger = logging.getLogger("dagwerk.orchestrator")

# continue_others: these dispositions make every descendant unrunnable.
FAILED_DISPOSITIONS = frozenset({NodeDisposition.FAILED, NodeDisposition.UPSTREAM_FAILED})

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


def limits_of(store: object, limits: Limits | None) -> Limits:
    if limits is not None:
        return limits
    found = StoreCapabilities.of(store).limits
    return DEFAULT_LIMITS if found is None else found


def failure_policy(store: DagStore, run_id: str) -> FailurePolicy:
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


def topology_cache(store: DagStore, limits: Limits) -> RunTopologyStore | None:
    """The store as a topology cache when it validates under the same limits."""
    capabilities = StoreCapabilities.of(store)
    if capabilities.limits == limits:
        return capabilities.topology
    return None


def cached_topology(cache: RunTopologyStore, run_id: str) -> RunTopology | None:
    found = cache.get_run_topology(run_id)
    if found is not None and not isinstance(found, RunTopology):
        raise StoreContractError.unexpected("get_run_topology", found, "RunTopology or None")
    return found


class Reconciler:
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
        self.policy = failure_policy(store, run_id)
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
            activity = run_activity(self.store, self.run_id, self.launches)
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
            launch = self.launch(index, forced)
            if launch is None:
                self.deferred = True
                continue
            self.launches[index] = launch
            if launch.disposition in FAILED_DISPOSITIONS:
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
        activity = run_activity(self.store, self.run_id, self.launches)
        if not activity.has_failure:
            if self._advance() is None:
                return
            # A planning failure in this pass is the first failure.
            activity = run_activity(self.store, self.run_id, self.launches)
        # No new launch after a failure; tasks already dispatched finish first.
        # WAITING tasks are not in flight: finalisation cancels them.
        if activity.queued == 0 and activity.running == 0:
            self._finalize_from_activity(activity)

    def _continue_others(self) -> None:
        activity = run_activity(self.store, self.run_id, self.launches)
        failed = set(activity.failed_nodes) | {
            i for i, launch in self.launches.items() if launch.disposition in FAILED_DISPOSITIONS
        }
        self._advance(upstream_failed=failed)
        if not failed:
            return
        activity = run_activity(self.store, self.run_id, self.launches)
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

    def launch(self, index: int, forced: NodeDisposition | None) -> NodeLaunch | None:
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


def run_activity(store: DagStore, run_id: str, launches: Mapping[int, NodeLaunch]) -> RunActivity:
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


def policy_needs_reconcile(store: DagStore, run_id: str) -> bool:
    # Under stop_on_first_failure and continue_others the last task in flight
    # may settle the run although its own launch never completes (a sibling
    # failed), so a completion after a failure reconciles too.
    if failure_policy(store, run_id) is FailurePolicy.FAIL_FAST:
        return False
    if implements(store, RunActivityStore):
        activity = store.get_run_activity(run_id)
        return activity is not None and activity.has_failure
    return True
