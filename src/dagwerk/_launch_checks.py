"""The check of a store's launch result against the launch requested
(OR-06/OR-07), used by the reconciler."""

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
    operation = "try_create_node_launch"
    if not isinstance(result, LaunchCreateResult):
        raise StoreContractError.unexpected(operation, result, "LaunchCreateResult")
    if result.status == LaunchCreateStatus.STALE:
        return None
    launch = result.launch
    if not isinstance(launch, NodeLaunch):
        raise StoreContractError(
            f"{operation} returned a {result.status.value} result whose launch is "
            f"{type(launch).__name__}; expected NodeLaunch",
            field="launch",
        )
    # Every message names the node, the field and both values.
    operation = f"try_create_node_launch for node {node_index}"

    def wrong(name: str, detail: str) -> StoreContractError:
        return StoreContractError(f"{operation} returned {detail}", field=name)

    for name, got, want in (
        ("run_id", launch.run_id, run_id),
        ("node_index", launch.node_index, node_index),
        ("plugin_name", launch.plugin_name, plugin),
    ):
        if got != want:
            raise StoreContractError.mismatch(operation, name, got, want)
    if any(not task_id for task_id in launch.task_ids) or len(set(launch.task_ids)) != len(
        launch.task_ids
    ):
        raise wrong("task_ids", _task_id_problem(launch.task_ids))
    shown = repr(launch.disposition.value)
    count = len(launch.task_ids)
    if launch.disposition == NodeDisposition.LAUNCHED:
        if not count:
            raise wrong("task_ids", f"disposition {shown} with no task IDs; expected at least 1")
    else:
        if count:
            raise wrong("task_ids", f"disposition {shown} with {_ids(count)}; expected none")
        if not launch.complete:
            raise wrong("complete", f"complete False with disposition {shown}; expected True")
        if launch.disposition == NodeDisposition.FAILED and not launch.error:
            raise wrong("error", f"error '' with disposition {shown}; expected an error message")
    if result.status == LaunchCreateStatus.ALREADY_EXISTS:
        # Only a launch of the generation this snapshot planned counts as ours.
        return launch if launch.generation == generation else None
    expected = NodeDisposition.LAUNCHED if plan_count else disposition
    for name, got, want in (
        ("generation", launch.generation, generation),
        ("disposition", launch.disposition, expected),
    ):
        if got != want:
            raise StoreContractError.mismatch(operation, name, got, want)
    if count != plan_count:
        raise wrong("task_ids", f"{_ids(count)}; expected {plan_count} (one per plan)")
    if plan_count and launch.complete:
        raise wrong("complete", f"complete True with {_ids(count)} to run; expected False")
    return launch


def _task_id_problem(task_ids: tuple[str, ...]) -> str:
    """What is wrong with launch task IDs that are not unique and non-empty."""
    seen: set[str] = set()
    for task_id in task_ids:
        if not task_id:
            break
        if task_id in seen:
            return f"task ID {task_id!r} twice; expected unique task IDs"
        seen.add(task_id)
    return "an empty task ID; expected non-empty task IDs"


def _ids(count: int) -> str:
    return "1 task ID" if count == 1 else f"{count} task IDs"
