"""The check of a store's launch result against the launch requested
(OR-06/OR-07), split out of :mod:`dagwerk.orchestrator`."""

from __future__ import annotations

from dagwerk.constants import LaunchCreateStatus, NodeDisposition
from dagwerk.models import LaunchCreateResult, NodeLaunch
from dagwerk.store import StoreContractError

__all__ = ["check_launch_result"]


def check_launch_result(
    result: object,
    *,
    run_id: str,
    node_index: int,
    plugin: str,
    plan_count: int,
    disposition: NodeDisposition,
    generation: int,
) -> NodeLaunch | None:
    """OR-06/OR-07: the launch the store reports must be the one requested.

    ``None`` means "try again": STALE, or ALREADY_EXISTS for another generation.
    """
    if not isinstance(result, LaunchCreateResult):
        raise StoreContractError("try_create_node_launch must return a LaunchCreateResult")
    if result.status == LaunchCreateStatus.STALE:
        return None
    launch = result.launch
    if not isinstance(launch, NodeLaunch):
        raise StoreContractError(f"a {result.status.value} launch result carries no NodeLaunch")

    def mismatch(name: str) -> StoreContractError:
        return StoreContractError(
            f"launch result for node {node_index} has mismatched field {name!r}", field=name
        )

    if launch.run_id != run_id:
        raise mismatch("run_id")
    if launch.node_index != node_index:
        raise mismatch("node_index")
    if launch.plugin_name != plugin:
        raise mismatch("plugin_name")
    if any(not task_id for task_id in launch.task_ids) or len(set(launch.task_ids)) != len(
        launch.task_ids
    ):
        raise mismatch("task_ids")
    if launch.disposition == NodeDisposition.LAUNCHED:
        if not launch.task_ids:
            raise mismatch("task_ids")
    else:
        if launch.task_ids:
            raise mismatch("task_ids")
        if not launch.complete:
            raise mismatch("complete")
        if launch.disposition == NodeDisposition.FAILED and not launch.error:
            raise mismatch("error")
    if result.status == LaunchCreateStatus.ALREADY_EXISTS:
        # Only a launch of the generation this snapshot planned counts as ours.
        return launch if launch.generation == generation else None
    if launch.generation != generation:
        raise mismatch("generation")
    expected = NodeDisposition.LAUNCHED if plan_count else disposition
    if launch.disposition != expected:
        raise mismatch("disposition")
    if len(launch.task_ids) != plan_count:
        raise mismatch("task_ids")
    if plan_count and launch.complete:
        raise mismatch("complete")
    return launch
