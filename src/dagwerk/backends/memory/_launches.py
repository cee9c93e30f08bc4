"""Planning snapshots, node launches and output resolution of the in-memory store."""

from __future__ import annotations

from collections.abc import Mapping

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


def _limit(value: object, name: str) -> int:
    if type(value) is not int or value < 0:
        raise InvalidStoreValueError(f"{name} must be a non-negative int", field=name)
    return value


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
            per_edge = _limit(max_outputs_per_edge, "max_outputs_per_edge")
            total_limit = _limit(max_outputs_total, "max_outputs_total")
            byte_limit = _limit(max_routing_bytes, "max_routing_bytes")
            run = self._runs.get(run_id)
            if run is None:
                raise InvalidStoreValueError(f"run {run_id!r} does not exist", field="run_id")
            count = len(run.nodes)
            if type(node_index) is not int or not 0 <= node_index < count:
                raise InvalidStoreValueError(
                    f"node index {node_index!r} is not a node of run {run_id!r}",
                    field="node_index",
                )
            for name, source in source_indices.items():
                if type(source) is not int or not 0 <= source < count:
                    raise InvalidStoreValueError(
                        f"edge {name!r} names an unknown source index {source!r}",
                        field="source_indices",
                    )
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
            self._validate_launch(
                run,
                node_index,
                plugin_name=plugin_name,
                token=snapshot_token,
                plans=plans,
                zero=zero_task_disposition,
                error=error,
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
            self._validate_plans(run, node_index, plans)
            launch_id = f"{run_id}:launch:{node_index}:{generation}"
            task_ids = tuple(f"{run_id}:{node_index}:{generation}:{n}" for n in range(len(plans)))
            disposition = NodeDisposition.LAUNCHED if plans else zero_task_disposition
            assert disposition is not None  # checked by _validate_launch
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

    def _validate_launch(
        self,
        run: RunState,
        node_index: int,
        *,
        plugin_name: str,
        token: str,
        plans: tuple[TaskInputPlan, ...],
        zero: NodeDisposition | None,
        error: str,
    ) -> None:
        """OB-02: every check happens before any write."""
        count = len(run.nodes)
        if type(node_index) is not int or not 0 <= node_index < count:
            raise InvalidStoreValueError(
                f"node index {node_index!r} is not a node of run {run.run_id!r}",
                field="node_index",
            )
        node = self._topology(run).nodes[node_index]
        if plugin_name != node.plugin:
            raise InvalidStoreValueError(
                f"plugin {plugin_name!r} does not match node {node.slug!r} ({node.plugin!r})",
                field="plugin_name",
            )
        if not isinstance(token, str) or not token:
            raise InvalidStoreValueError("snapshot token must be a non-empty string", field="token")
        if not isinstance(error, str):
            raise InvalidStoreValueError("error must be a string", field="error")
        limit = self.limits.max_task_plans_per_launch
        if len(plans) > limit:
            raise InvalidStoreValueError(
                f"node {node.slug!r} launch has {len(plans)} task plans; maximum is {limit}",
                field="plans",
                limit=limit,
            )
        if plans:
            if zero is not None:
                raise InvalidStoreValueError(
                    "a launch with plans takes no zero-task disposition",
                    field="zero_task_disposition",
                )
            return
        if zero is None or NodeDisposition(zero) is NodeDisposition.LAUNCHED:
            raise InvalidStoreValueError(
                "a launch without plans needs a zero-task disposition",
                field="zero_task_disposition",
            )
        if NodeDisposition(zero) is NodeDisposition.FAILED and not error:
            raise InvalidStoreValueError("a failed launch must carry an error", field="error")

    def _validate_plans(
        self, run: RunState, node_index: int, plans: tuple[TaskInputPlan, ...]
    ) -> None:
        topology = self._topology(run)
        node = topology.nodes[node_index]
        edge_sources = topology.source_indices(node_index)
        generation = run.generations[node_index]
        for position, plan in enumerate(plans):
            if not isinstance(plan, TaskInputPlan):
                raise InvalidStoreValueError(
                    f"plan {position} is not a TaskInputPlan", field="plans"
                )
            if plan.generation != generation:
                raise InvalidStoreValueError(
                    f"plan {position} of node {node.slug!r} has generation {plan.generation}; "
                    f"the node's generation is {generation}",
                    field="plans",
                )
            for planned in plan.edges:
                source = edge_sources.get(planned.edge)
                if source is None or source != planned.source_index:
                    raise InvalidStoreValueError(
                        f"plan {position} edge {planned.edge!r} is not an edge of "
                        f"node {node.slug!r} from source {planned.source_index}",
                        field="plans",
                    )
                for output_id in planned.output_ids:
                    output = run.outputs.get(output_id)
                    if output is None or output.invalidated or output.node_index != source:
                        raise InvalidStoreValueError(
                            f"plan {position} edge {planned.edge!r} names output "
                            f"{output_id!r}, which its source has not published",
                            field="plans",
                        )

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

    def get_output_ids(self, run_id: str, node_index: int) -> tuple[str, ...]:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return ()
            return tuple(run.node_outputs.get(node_index, ()))
