"""The checks of store requests that every backend makes the same way.

A store validates a request before it writes anything (OB-02); the checks
that depend only on the request (and on the run's stored definition) live
here, so the in-memory and SQL stores raise the same
:class:`~dagwerk.store.InvalidStoreValueError` (or
:class:`~dagwerk.errors.JsonLimitError`) with the same field and message.
A store of an application's own may use them too. Each ``check_*``
function raises or returns the checked value.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from dagwerk.budgets import Budget
from dagwerk.constants import RUN_TERMINAL_STATUSES, FailurePolicy, NodeDisposition, RunStatus
from dagwerk.errors import JsonLimitError
from dagwerk.json import FrozenDict, bounded_json_size, freeze_object
from dagwerk.limits import Limits
from dagwerk.lineage import RunLink
from dagwerk.models import DagNode, NodeDefinition, TaskInputPlan
from dagwerk.store import (
    InvalidStoreValueError,
    NodeLaunchRef,
    TaskAttemptRef,
    validate_pipeline_name,
    validate_queue_names,
    validate_seconds,
    validate_worker_id,
)
from dagwerk.topology import RunTopology

__all__ = [
    "RunDefinition",
    "check_admission",
    "check_budget",
    "check_child_link",
    "check_claim",
    "check_launch_request",
    "check_limit",
    "check_name",
    "check_node_index",
    "check_plans",
    "check_rerun_indices",
    "check_run_definition",
    "check_run_id",
    "check_snapshot_limits",
    "check_snapshot_sources",
    "check_stall",
    "check_store_settings",
    "check_string",
    "check_terminal_request",
    "check_wait_link",
    "requested_outputs",
]


# --- values -------------------------------------------------------------------


def check_string(value: object, name: str) -> str:
    """``value`` when it is a string (empty allowed)."""
    if not isinstance(value, str):
        raise InvalidStoreValueError(f"{name} must be a string", field=name)
    return value


def check_name(value: object, name: str) -> str:
    """``value`` when it is a non-empty string."""
    if not isinstance(value, str) or not value:
        raise InvalidStoreValueError(f"{name} must be a non-empty string", field=name)
    return value


def check_limit(limit: object) -> int:
    """A ``limit`` argument: an int of at least 1."""
    if type(limit) is not int or limit < 1:
        raise InvalidStoreValueError("limit must be an int >= 1", field="limit")
    return limit


def check_store_settings(
    max_deliveries: object, default_queue: object, default_priority: object
) -> None:
    """A store's constructor settings: ``max_deliveries`` an int of at least
    1, ``default_queue`` a non-empty string, ``default_priority`` an int."""
    if type(max_deliveries) is not int or max_deliveries < 1:
        raise InvalidStoreValueError("max_deliveries must be an int >= 1", field="max_deliveries")
    if not isinstance(default_queue, str) or not default_queue:
        raise InvalidStoreValueError("queue must be a non-empty string", field="default_queue")
    if type(default_priority) is not int:
        raise InvalidStoreValueError("priority must be an int", field="default_priority")


# --- runs ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunDefinition:
    """A run's checked definition: its nodes (the caller's objects, to copy
    or serialise), its frozen input and its failure policy."""

    nodes: tuple[DagNode, ...]
    run_input: FrozenDict
    failure_policy: FailurePolicy


def check_run_id(run_id: object) -> str:
    """A run ID: a non-empty string."""
    if not isinstance(run_id, str) or not run_id:
        raise InvalidStoreValueError("run ID must be a non-empty string", field="run_id")
    return run_id


def check_run_definition(
    run_id: object,
    nodes: object,
    *,
    run_input: Mapping[str, object] | None,
    failure_policy: FailurePolicy | str,
    pipeline: object,
    limits: Limits,
) -> RunDefinition:
    """The arguments of ``create_run`` (and of a child run's creation, with
    ``pipeline`` ``None``): the run ID, a sequence of ``DagNode``, a known
    failure policy, the pipeline name and the run input within
    ``limits.max_run_input_bytes``. The graph itself is validated by
    ``start_run`` (OR-01)."""
    check_run_id(run_id)
    if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Sequence):
        raise InvalidStoreValueError("nodes must be a sequence of DagNode", field="nodes")
    checked: list[DagNode] = []
    for index, node in enumerate(nodes):
        if not isinstance(node, DagNode):
            raise InvalidStoreValueError(f"node {index} is not a DagNode", field=f"nodes[{index}]")
        checked.append(node)
    policy = FailurePolicy(failure_policy)
    validate_pipeline_name(pipeline)
    frozen = freeze_object(run_input)
    limit = limits.max_run_input_bytes
    if bounded_json_size(frozen, limit) > limit:
        raise JsonLimitError(
            f"run input exceeds the {limit}-byte limit", field="run_input", limit=limit
        )
    return RunDefinition(nodes=tuple(checked), run_input=frozen, failure_policy=policy)


def check_terminal_request(status: object, cause: object, reason: object) -> RunStatus:
    """The arguments of ``try_finalize_run``: a terminal status, and at most
    one of a cause (a ``TaskAttemptRef`` or ``NodeLaunchRef``; none for a
    completion or a cancellation) and a reason string (none for a
    completion). Returns the status."""
    value = _terminal_status(status)
    if cause is not None and reason is not None:
        raise InvalidStoreValueError(
            "a terminal transition takes a cause or a reason, not both", field="cause"
        )
    if value is RunStatus.COMPLETED and (cause is not None or reason is not None):
        raise InvalidStoreValueError("run completion takes no cause or reason", field="cause")
    if cause is not None and not isinstance(cause, (TaskAttemptRef, NodeLaunchRef)):
        raise InvalidStoreValueError(
            "cause must be a TaskAttemptRef or NodeLaunchRef", field="cause"
        )
    if cause is not None and value is RunStatus.CANCELLED:
        raise InvalidStoreValueError("cancellation takes no cause", field="cause")
    if reason is not None:
        check_string(reason, "reason")
    return value


def _terminal_status(status: object) -> RunStatus:
    try:
        value = RunStatus(status)  # type: ignore[arg-type]
    except ValueError:
        raise InvalidStoreValueError(f"unknown run status {status!r}", field="status") from None
    if value not in RUN_TERMINAL_STATUSES:
        raise InvalidStoreValueError(f"run status {value.value!r} is not terminal", field="status")
    return value


def check_rerun_indices(node_indices: Sequence[object], node_count: int) -> tuple[int, ...] | None:
    """The node indices of ``try_rerun_nodes``; ``None`` (the store refuses,
    nothing changes) when they are empty or one is not a node of the run."""
    indices = tuple(node_indices)
    if not indices or any(type(i) is not int or not 0 <= i < node_count for i in indices):
        return None
    return indices  # type: ignore[return-value]  # every entry checked to be an int


# --- planning snapshots and launches ---------------------------------------------


def check_snapshot_limits(
    max_outputs_per_edge: object, max_outputs_total: object, max_routing_bytes: object
) -> tuple[int, int, int]:
    """The three limits of ``get_planning_snapshot``, each a non-negative int."""
    return (
        _non_negative(max_outputs_per_edge, "max_outputs_per_edge"),
        _non_negative(max_outputs_total, "max_outputs_total"),
        _non_negative(max_routing_bytes, "max_routing_bytes"),
    )


def _non_negative(value: object, name: str) -> int:
    if type(value) is not int or value < 0:
        raise InvalidStoreValueError(f"{name} must be a non-negative int", field=name)
    return value


def check_node_index(node_index: object, node_count: int, run_id: str) -> int:
    """``node_index`` when it is a node of the run of ``node_count`` nodes."""
    if type(node_index) is not int or not 0 <= node_index < node_count:
        raise InvalidStoreValueError(
            f"node index {node_index!r} is not a node of run {run_id!r}", field="node_index"
        )
    return node_index


def check_snapshot_sources(source_indices: Mapping[str, object], node_count: int) -> None:
    """Every source index of a planning snapshot names a node of the run."""
    for name, source in source_indices.items():
        if type(source) is not int or not 0 <= source < node_count:
            raise InvalidStoreValueError(
                f"edge {name!r} names an unknown source index {source!r}",
                field="source_indices",
            )


def check_launch_request(
    node: NodeDefinition,
    *,
    plugin_name: object,
    token: object,
    plans: tuple[object, ...],
    zero: NodeDisposition | None,
    error: object,
    limits: Limits,
) -> None:
    """The arguments of ``try_create_node_launch`` for ``node`` (its index
    already checked): its plugin, a non-empty snapshot token, an error
    string, at most ``limits.max_task_plans_per_launch`` plans, and a
    zero-task disposition exactly when there are no plans (a FAILED one with
    an error)."""
    if plugin_name != node.plugin:
        raise InvalidStoreValueError(
            f"plugin {plugin_name!r} does not match node {node.slug!r} ({node.plugin!r})",
            field="plugin_name",
        )
    if not isinstance(token, str) or not token:
        raise InvalidStoreValueError("snapshot token must be a non-empty string", field="token")
    check_string(error, "error")
    limit = limits.max_task_plans_per_launch
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


def requested_outputs(plans: tuple[object, ...]) -> set[str]:
    """The output IDs the plans name, each plan checked to be a
    ``TaskInputPlan``."""
    wanted: set[str] = set()
    for position, plan in enumerate(plans):
        if not isinstance(plan, TaskInputPlan):
            raise InvalidStoreValueError(f"plan {position} is not a TaskInputPlan", field="plans")
        for planned in plan.edges:
            wanted.update(planned.output_ids)
    return wanted


def check_plans(
    topology: RunTopology,
    node_index: int,
    generation: int,
    plans: tuple[TaskInputPlan, ...],
    *,
    published_by: Callable[[str], int | None],
) -> None:
    """The plans of a launch of node ``node_index``: each a ``TaskInputPlan``
    of the node's ``generation`` whose edges are the node's edges, naming only
    outputs their source published. ``published_by(output_id)`` is the index
    of the node whose valid output it is, ``None`` for an unknown or
    invalidated output."""
    requested_outputs(plans)
    node = topology.nodes[node_index]
    edge_sources = topology.source_indices(node_index)
    for position, plan in enumerate(plans):
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
                if published_by(output_id) != source:
                    raise InvalidStoreValueError(
                        f"plan {position} edge {planned.edge!r} names output "
                        f"{output_id!r}, which its source has not published",
                        field="plans",
                    )


# --- the queue and the backstop -----------------------------------------------------


def check_claim(
    worker_id: object,
    limit: object,
    lease_seconds: object,
    queues: Sequence[str] | None,
    wait_seconds: object,
) -> tuple[float, list[str] | None, float]:
    """The arguments of a dequeue or claim: the lease, the queue names
    (``None``: any) and the wait."""
    validate_worker_id(worker_id)
    check_limit(limit)
    lease = validate_seconds(lease_seconds, "lease_seconds", positive=True)
    names = validate_queue_names(queues)
    return lease, names, validate_seconds(wait_seconds, "wait_seconds", positive=False)


def check_stall(run_id: object, reason: object, held_nodes: Collection[int]) -> tuple[int, ...]:
    """The arguments of ``try_record_stall``; the held node indices sorted,
    without repeats."""
    check_name(run_id, "run_id")
    check_string(reason, "reason")
    held = tuple(sorted(set(held_nodes)))
    if any(type(index) is not int or index < 0 for index in held):
        raise InvalidStoreValueError("held_nodes must be node indices", field="held_nodes")
    return held


# --- child runs and budgets ----------------------------------------------------------


def check_budget(budget: object, *, optional: bool) -> Budget | None:
    """A ``Budget`` (or, when ``optional``, ``None``)."""
    if not isinstance(budget, Budget) and not (optional and budget is None):
        raise InvalidStoreValueError("budget must be a Budget", field="budget")
    return budget


def check_admission(input_bytes: object, cost_units: object) -> None:
    """The amounts of ``try_admit_task``: non-negative ints (``cost_units``
    may be ``None``)."""
    if type(input_bytes) is not int or input_bytes < 0:
        raise InvalidStoreValueError("input_bytes must be an int >= 0", field="input_bytes")
    if cost_units is not None and (type(cost_units) is not int or cost_units < 0):
        raise InvalidStoreValueError("cost_units must be an int >= 0", field="cost_units")


def check_child_link(link: object, run_id: object) -> RunLink:
    """The link of ``create_child_run``: a ``RunLink`` naming the child run,
    without a wait."""
    if not isinstance(link, RunLink):
        raise InvalidStoreValueError("link must be a RunLink", field="link")
    if link.run_id != run_id:
        raise InvalidStoreValueError("link.run_id must name the child run", field="link")
    if link.wait_id is not None:
        raise InvalidStoreValueError(
            "create_child_run stores no wait; use try_wait_for_child", field="link"
        )
    return link


def check_wait_link(link: object) -> str:
    """The link of ``try_wait_for_child``: a ``RunLink`` with a wait ID,
    which is returned."""
    if not isinstance(link, RunLink) or link.wait_id is None:
        raise InvalidStoreValueError("link must be a RunLink with a wait ID", field="link")
    return link.wait_id
