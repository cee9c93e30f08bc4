"""Run lifecycle of the in-memory store: create, start, finalise, cancel, reopen."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dagwerk.backends.requests import (
    check_limit,
    check_rerun_indices,
    check_run_definition,
    check_run_id,
    check_string,
    check_terminal_request,
)
from dagwerk.constants import (
    RUN_RETRYABLE_STATUSES,
    RUN_TERMINAL_STATUSES,
    FailurePolicy,
    NodeDisposition,
    RunStatus,
    TaskStatus,
)
from dagwerk.models import DagNode
from dagwerk.store import (
    NodeLaunchRef,
    RerunRefusedError,
    RunActivity,
    RunRecord,
    RunReopenResult,
    TaskAttemptRef,
)
from dagwerk.topology import RunTopology
from dagwerk.transitions import check_run_transition

from ._base import MemoryStoreBase
from ._state import RunState

_FAILED_RUN_TASK = {RunStatus.FAILED: TaskStatus.FAILED, RunStatus.CRASHED: TaskStatus.CRASHED}


class RunsMixin(MemoryStoreBase):
    def create_run(
        self,
        run_id: str,
        nodes: Sequence[DagNode],
        *,
        run_input: Mapping[str, object] | None = None,
        failure_policy: FailurePolicy | str = FailurePolicy.FAIL_FAST,
        pipeline: str | None = None,
    ) -> bool:
        """Store a PENDING run with validated copies of its nodes and frozen input.

        False (no change) if the id exists. The graph itself is validated by
        ``start_run`` (OR-01), so an invalid graph can be stored but never starts.
        """
        with self._lock:
            check_run_id(run_id)
            if run_id in self._runs:
                return False
            definition = check_run_definition(
                run_id,
                nodes,
                run_input=run_input,
                failure_policy=failure_policy,
                pipeline=pipeline,
                limits=self.limits,
            )
            self._runs[run_id] = RunState(
                run_id=run_id,
                nodes=tuple(node.model_copy(deep=True) for node in definition.nodes),
                run_input=definition.run_input,
                failure_policy=definition.failure_policy,
                created_at=float(self._clock()),
                pipeline=pipeline,
            )
            return True

    def get_run_status(self, run_id: str) -> RunStatus | None:
        with self._lock:
            run = self._runs.get(run_id)
            return None if run is None else run.status

    def get_run_nodes(self, run_id: str) -> list[DagNode] | None:
        with self._lock:
            run = self._runs.get(run_id)
            return None if run is None else [node.model_copy() for node in run.nodes]

    def get_run_topology(self, run_id: str) -> RunTopology | None:
        with self._lock:
            run = self._runs.get(run_id)
            return None if run is None else self._topology(run)

    def get_run_node(self, run_id: str, node_index: int) -> DagNode | None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or type(node_index) is not int or not 0 <= node_index < len(run.nodes):
                return None
            return run.nodes[node_index].model_copy()

    def get_run_failure_policy(self, run_id: str) -> FailurePolicy | None:
        with self._lock:
            run = self._runs.get(run_id)
            return None if run is None else run.failure_policy

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._lock:
            run = self._runs.get(run_id)
            return None if run is None else run_record(run)

    def list_runs(self, *, status: RunStatus | None = None, limit: int = 50) -> list[RunRecord]:
        check_limit(limit)
        wanted = None if status is None else RunStatus(status)
        with self._lock:
            found: list[RunRecord] = []
            # Creation order is insertion order; the newest come first.
            for run in sorted(
                reversed(self._runs.values()), key=lambda r: r.created_at, reverse=True
            ):
                if wanted is None or run.status is wanted:
                    found.append(run_record(run))
                    if len(found) == limit:
                        break
            return found

    def get_run_activity(self, run_id: str) -> RunActivity | None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return None
            failed_launches = tuple(
                NodeLaunchRef(launch.launch_id, index, launch.generation)
                for index, launch in sorted(run.launches.items())
                if launch.disposition is NodeDisposition.FAILED
            )
            failed: list[TaskAttemptRef] = []
            crashed: list[TaskAttemptRef] = []
            for task_id in sorted(run.failed_tasks, key=run.failed_tasks.__getitem__):
                task = self._tasks[task_id]
                ref = TaskAttemptRef(task.task_id, task.attempt_id)
                (failed if task.status is TaskStatus.FAILED else crashed).append(ref)
            return RunActivity(
                queued=run.counts[TaskStatus.QUEUED],
                running=run.counts[TaskStatus.RUNNING],
                waiting=run.counts[TaskStatus.WAITING],
                failed_nodes=frozenset(self._failed_nodes(run)),
                failed_launches=failed_launches,
                failed_tasks=tuple(failed),
                crashed_tasks=tuple(crashed),
            )

    def try_start_run(self, run_id: str) -> bool:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return False
            if run.status is RunStatus.RUNNING:
                return True
            if run.status is not RunStatus.PENDING:
                return False
            check_run_transition(run.status, RunStatus.RUNNING)
            run.status = RunStatus.RUNNING
            return True

    # -- terminal transitions --------------------------------------------------

    def try_finalize_run(
        self,
        run_id: str,
        status: RunStatus,
        *,
        cause: TaskAttemptRef | NodeLaunchRef | None = None,
        reason: str | None = None,
    ) -> bool:
        with self._lock:
            status = check_terminal_request(status, cause, reason)
            run = self._runs.get(run_id)
            if run is None or run.status in RUN_TERMINAL_STATUSES:
                return False
            if status is RunStatus.COMPLETED:
                if run.status is not RunStatus.RUNNING or not self._can_complete(run):
                    return False
                error = None
            elif cause is not None:
                found = self._cause_error(run, status, cause)
                if found is None:
                    return False
                error = found
            else:
                error = reason
            self._terminate(run, status, error)
            return True

    def try_cancel_run(self, run_id: str, reason: str | None = None) -> bool:
        with self._lock:
            if reason is not None:
                check_string(reason, "reason")
            run = self._runs.get(run_id)
            if run is None or run.status not in (RunStatus.PENDING, RunStatus.RUNNING):
                return False
            self._terminate(run, RunStatus.CANCELLED, reason)
            return True

    def _can_complete(self, run: RunState) -> bool:
        # OR-09: an active launch for exactly every stored node, all complete,
        # none failed; complete LAUNCHED launches have only COMPLETED tasks.
        if set(run.launches) != set(range(len(run.nodes))):
            return False
        return all(
            launch.complete
            and launch.disposition not in (NodeDisposition.FAILED, NodeDisposition.UPSTREAM_FAILED)
            for launch in run.launches.values()
        )

    def _cause_error(
        self, run: RunState, status: RunStatus, cause: TaskAttemptRef | NodeLaunchRef
    ) -> str | None:
        """The persisted error of a still-current cause, else ``None`` (OR-10, OR-11)."""
        if isinstance(cause, NodeLaunchRef):
            launch = run.launches.get(cause.node_index)
            if (
                status is not RunStatus.FAILED
                or launch is None
                or launch.launch_id != cause.launch_id
                or launch.generation != cause.generation
                or launch.disposition is not NodeDisposition.FAILED
            ):
                return None
            return launch.error
        task = self._tasks.get(cause.task_id)
        if task is None or task.run_id != run.run_id or self._owned(task) is None:
            return None
        if task.attempt_id != cause.attempt_id or task.status is not _FAILED_RUN_TASK[status]:
            return None
        return task.error if task.error is not None else ""

    def _terminate(self, run: RunState, status: RunStatus, error: str | None) -> None:
        check_run_transition(run.status, status)
        # Waits are invalidated and unfinished work cancelled in the same
        # commit as the terminal status, so nothing is stranded (OR-12).
        for launch in run.launches.values():
            for task_id in launch.task_ids:
                self._stop_task(run, self._tasks[task_id])
        run.status = status
        run.error = error
        run.epoch += 1
        run.finished_at = float(self._clock())
        # Resume a waiting parent and cancel descendants in this same commit.
        self._after_terminate(run, status, error)

    # -- run retry ---------------------------------------------------------------

    def try_reopen_run(
        self, run_id: str, boundary_indices: tuple[int, ...] | None
    ) -> RunReopenResult | None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.status not in RUN_RETRYABLE_STATUSES:
                return None
            count = len(run.nodes)
            failed_nodes = self._failed_nodes(run)
            if boundary_indices is not None:
                if run.status not in (RunStatus.FAILED, RunStatus.CRASHED):
                    return None
                boundary = tuple(boundary_indices)
                if not boundary:
                    return None
                for index in boundary:
                    if type(index) is not int or not 0 <= index < count:
                        return None
                    if index not in run.launches or index not in failed_nodes:
                        return None
            topology = self._topology(run)
            # RT-05: the store derives the affected set from every unsuccessful
            # active launch; the boundary above is only an assertion.
            roots = [
                index
                for index, launch in run.launches.items()
                if not launch.complete
                or launch.disposition in (NodeDisposition.FAILED, NodeDisposition.UPSTREAM_FAILED)
            ]
            affected = sorted(topology.downstream_closure(roots)) if roots else []
            for index in affected:
                self._invalidate_node(run, index)
            check_run_transition(run.status, RunStatus.RUNNING)
            run.status = RunStatus.RUNNING
            run.error = None
            run.retry_count += 1
            run.epoch += 1
            run.finished_at = None
            return RunReopenResult(
                affected_nodes=tuple(affected),
                retry_count=run.retry_count,
                generations={index: run.generations[index] for index in affected},
            )

    def try_rerun_nodes(self, run_id: str, node_indices: tuple[int, ...]) -> RunReopenResult | None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.status is RunStatus.PENDING:
                return None
            indices = check_rerun_indices(node_indices, len(run.nodes))
            if indices is None:
                return None
            affected = sorted(self._topology(run).downstream_closure(list(indices)))
            for index in affected:
                launch = run.launches.get(index)
                if launch is None:
                    continue
                for task_id in launch.task_ids:
                    if self._tasks[task_id].status is TaskStatus.RUNNING:
                        raise RerunRefusedError(
                            f"node {index} has a running task {task_id!r}; "
                            "stop it before re-running",
                            field="node_indices",
                        )
            for index in affected:
                self._invalidate_node(run, index)
            if run.status is not RunStatus.RUNNING:
                check_run_transition(run.status, RunStatus.RUNNING)
                run.status = RunStatus.RUNNING
                run.error = None
                run.finished_at = None
            run.retry_count += 1
            run.epoch += 1
            return RunReopenResult(
                affected_nodes=tuple(affected),
                retry_count=run.retry_count,
                generations={index: run.generations[index] for index in affected},
            )

    def _invalidate_node(self, run: RunState, index: int) -> None:
        """Retire the node's active generation as a unit (RT-06)."""
        launch = run.launches.pop(index, None)
        if launch is not None:
            for task_id in launch.task_ids:
                task = self._tasks[task_id]
                self._stop_task(run, task)
                # Leave the active-generation counters before the flag hides it.
                run.counts[task.status] -= 1
                run.failed_tasks.pop(task_id, None)
                task.invalidated = True
        for output_id in run.node_outputs.pop(index, ()):
            # The ID stays reserved; the output stops resolving (TI-03).
            run.outputs[output_id].invalidated = True
        run.generations[index] += 1
        self._bump(run, index)


def run_record(run: RunState) -> RunRecord:
    return RunRecord(
        run_id=run.run_id,
        status=run.status,
        failure_policy=run.failure_policy,
        retry_count=run.retry_count,
        error=run.error,
        node_count=len(run.nodes),
        settled_nodes=run.settled_nodes,
        created_at=run.created_at,
        finished_at=run.finished_at,
        pipeline=run.pipeline,
    )
