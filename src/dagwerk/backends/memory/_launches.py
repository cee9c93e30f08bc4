"""Planning snapshots, node launches and output resolution of the in-memory store."""

from __future__ import annotations

from collections.abc import Mapping

from dagwerk.backends.requests import (
    check_launch_request,
    check_node_index,
    check_plans,
    check_snapshot_limits,
    check_snapshot_sources,
)
from dagwerk.constants import LaunchCreateStatus, NodeDisposition, RunStatus, TaskStatus
from dagwerk.json import ReadOnlyDict
from dagwerk.models import (
    LaunchCreateResult,
    NodeLaunch,
    OutputRef,
    PlanningSnapshot,
    ResolvedOutput,
    TaskInputPlan,
)
from dagwerk.store import InvalidStoreValueError

from ._base import MemoryStoreBase
from ._state import LaunchState, RunState, TaskState

_STALE = LaunchCreateResult(status=LaunchCreateStatus.STALE)


class LaunchesMixin(MemoryStoreBase):
    def list_node_launches(self, run_id: str) -> Mapping[int, NodeLaunch]:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return {}
            return {index: run.launches[index].view(run_id) for index in sorted(run.launches)}

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
        with self._lock:
            per_edge, total_limit, byte_limit = check_snapshot_limits(
                max_outputs_per_edge, max_outputs_total, max_routing_bytes
            )
            run = self._runs.get(run_id)
            if run is None:
                raise InvalidStoreValueError(f"run {run_id!r} does not exist", field="run_id")
            check_node_index(node_index, len(run.nodes), run_id)
            check_snapshot_sources(source_indices, len(run.nodes))
            outputs_by_edge: dict[str, tuple[OutputRef, ...]] = {}
            dispositions: dict[str, NodeDisposition] = {}
            total = 0
            size = 0
            stopped = False
            for name, source in source_indices.items():
                launch = run.launches.get(source)
                if launch is not None:
                    dispositions[name] = launch.disposition
                edge: list[OutputRef] = []
                if (
                    not stopped
                    and launch is not None
                    and launch.disposition is NodeDisposition.LAUNCHED
                ):
                    for output_id in run.node_outputs.get(source, ()):
                        # One output beyond each count limit signals overflow.
                        if len(edge) > per_edge or total > total_limit:
                            break
                        output = run.outputs[output_id]
                        edge.append(output.ref)
                        total += 1
                        size += output.routing_size
                        if size > byte_limit:
                            # The crossing output is kept as the overflow signal;
                            # later edges stay empty.
                            stopped = True
                            break
                outputs_by_edge[name] = tuple(edge)
            return PlanningSnapshot.model_construct(
                token=self._token(run, node_index),
                generation=run.generations[node_index],
                outputs_by_edge=ReadOnlyDict(outputs_by_edge),
                source_dispositions=ReadOnlyDict(dispositions),
                runtime_inputs=run.run_input,
            )

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
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.status is not RunStatus.RUNNING:
                return _STALE
            plans = tuple(plans)
            check_node_index(node_index, len(run.nodes), run_id)
            check_launch_request(
                self._topology(run).nodes[node_index],
                plugin_name=plugin_name,
                token=snapshot_token,
                plans=plans,
                zero=zero_task_disposition,
                error=error,
                limits=self.limits,
            )
            generation = run.generations[node_index]
            # OR-19: a stale token wins over an existing launch.
            if snapshot_token != self._token(run, node_index):
                return _STALE
            existing = run.launches.get(node_index)
            if existing is not None:
                if existing.generation != generation:
                    return _STALE
                return LaunchCreateResult(
                    status=LaunchCreateStatus.ALREADY_EXISTS, launch=existing.view(run_id)
                )
            # Plan contents are checked against the state the fresh token covers.
            check_plans(
                self._topology(run),
                node_index,
                generation,
                plans,
                published_by=lambda output_id: _published_by(run, output_id),
            )
            launch_id = f"{run_id}:launch:{node_index}:{generation}"
            task_ids = tuple(f"{run_id}:{node_index}:{generation}:{n}" for n in range(len(plans)))
            disposition = NodeDisposition.LAUNCHED if plans else zero_task_disposition
            assert disposition is not None  # checked by check_launch_request
            launch = LaunchState(
                launch_id=launch_id,
                node_index=node_index,
                generation=generation,
                plugin=plugin_name,
                disposition=disposition,
                task_ids=task_ids,
                error=error,
            )
            run.launches[node_index] = launch
            for task_id, plan in zip(task_ids, plans, strict=True):
                task = TaskState(
                    task_id=task_id,
                    run_id=run_id,
                    node_index=node_index,
                    generation=generation,
                    launch_id=launch_id,
                    seq=self._next_seq(),
                    status=TaskStatus.QUEUED,
                    attempt_id=self._new_attempt_id(),
                    plan=plan,
                )
                self._tasks[task_id] = task
                run.task_ids.append(task_id)
                run.counts[TaskStatus.QUEUED] += 1
                self._enqueue(run, task)
            self._bump(run, node_index)
            return LaunchCreateResult(status=LaunchCreateStatus.CREATED, launch=launch.view(run_id))

    # -- outputs -------------------------------------------------------------------

    def resolve_outputs(
        self, run_id: str, output_ids: tuple[str, ...]
    ) -> Mapping[str, ResolvedOutput]:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return {}
            found: dict[str, ResolvedOutput] = {}
            for output_id in output_ids:
                output = run.outputs.get(output_id)
                if output is not None and not output.invalidated:
                    found[output_id] = output.resolved
            return found

    def get_run_outputs(self, run_id: str) -> Mapping[int, tuple[ResolvedOutput, ...]]:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return {}
            found: dict[int, tuple[ResolvedOutput, ...]] = {}
            for index, output_ids in run.node_outputs.items():
                valid = [run.outputs[o] for o in output_ids if not run.outputs[o].invalidated]
                if valid:
                    found[index] = tuple(output.resolved for output in valid)
            return dict(sorted(found.items()))

    def get_output_ids(self, run_id: str, node_index: int) -> tuple[str, ...]:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return ()
            return tuple(run.node_outputs.get(node_index, ()))


def _published_by(run: RunState, output_id: str) -> int | None:
    """The node whose valid output ``output_id`` is; ``None``: none."""
    output = run.outputs.get(output_id)
    return None if output is None or output.invalidated else output.node_index
