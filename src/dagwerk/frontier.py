"""The reconcile after a completion, from the completed nodes' neighbourhood.

:func:`~dagwerk.orchestrator.reconcile_run` reads every launch of the run, so
a run of ``n`` nodes costs O(n) per completion and O(n²) in all. After the
launch of node ``X`` completes, only ``X``'s children can have become ready;
:func:`reconcile_after_completion` reads the launches of those children and
of their parents (:class:`~dagwerk.store.RunFrontierStore`) and launches the
ready ones, exactly as the full reconcile would have, in index order.

It hands the run to the full reconcile whenever the neighbourhood cannot
decide: a store without the frontier or the topology cache, a policy other
than ``fail_fast``, any failure in the run, a launch that completes at once
(zero tasks: its own children may be ready) or fails, and a run whose every
node is complete (finalisation: counted only when a completed node is a
leaf). The full reconcile stays the repair path:
a ready node outside the neighbourhood (e.g. one deferred after stale
snapshots) waits for the next full reconcile (the backstop's, at the latest).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dagwerk._protocols import implements
from dagwerk.constants import FailurePolicy, RunStatus
from dagwerk.limits import Limits
from dagwerk.orchestrator import (
    reconcile_run,
)
from dagwerk.reconcile import (
    FAILED_DISPOSITIONS,
    OrchestratorCallbacks,
    Reconciler,
    cached_topology,
    failure_policy,
    limits_of,
    topology_cache,
)
from dagwerk.store import (
    DagStore,
    LaunchProgress,
    RunFrontier,
    RunFrontierStore,
    StoreContractError,
)
from dagwerk.topology import RunTopology

__all__ = ["reconcile_after_completion"]


def reconcile_after_completion(
    store: DagStore,
    run_id: str,
    completed: Iterable[int],
    *,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> None:
    """Reconcile a run after the launches of the ``completed`` node indices
    completed; the same outcome as :func:`~dagwerk.orchestrator.reconcile_run`
    for a run that was reconciled before those completions.

    Does nothing unless the run is RUNNING. Falls back to ``reconcile_run``
    when ``completed`` is empty or the neighbourhood cannot decide (see the
    module docstring). Safe to call after any commit, any number of times.
    """
    nodes = sorted(set(completed))
    limits = limits_of(store, limits)
    cache = topology_cache(store, limits)
    if (
        not nodes
        or cache is None
        or not implements(store, RunFrontierStore)
        or failure_policy(store, run_id) is not FailurePolicy.FAIL_FAST
    ):
        reconcile_run(store, run_id, callbacks=callbacks, limits=limits)
        return
    topology = cached_topology(cache, run_id)
    count = 0 if topology is None else len(topology.nodes)
    if topology is None or any(type(i) is not int or not 0 <= i < count for i in nodes):
        reconcile_run(store, run_id, callbacks=callbacks, limits=limits)
        return
    if not _advance_children(store, store, run_id, topology, nodes, callbacks, limits):
        reconcile_run(store, run_id, callbacks=callbacks, limits=limits)


def _advance_children(  # noqa: PLR0917 (private helper)
    store: DagStore,
    frontier_store: RunFrontierStore,
    run_id: str,
    topology: RunTopology,
    completed: list[int],
    callbacks: OrchestratorCallbacks,
    limits: Limits,
) -> bool:
    """Launch the ready children of ``completed``; False when the full
    reconcile must decide instead."""
    # Only a completed leaf can have completed the run: a completed node's
    # child without a complete launch proves the run unfinished for free.
    children, wanted, leaf = topology.neighbourhood(completed)
    frontier = frontier_store.get_run_frontier(run_id, wanted, count_complete=leaf)
    if frontier is None:
        return True  # no run: the full reconcile would do nothing either
    launches = _checked_launches(frontier, run_id, set(wanted), len(topology.nodes))
    if frontier.status is not RunStatus.RUNNING:
        return True
    if frontier.has_failure:
        return False
    if leaf:
        found = frontier.complete_nodes
        if type(found) is not int:
            raise StoreContractError.unexpected(
                "get_run_frontier(count_complete=True)", found, "int", field="complete_nodes"
            )
        if found >= len(topology.nodes):
            return False
    if children and all(kid in launches and launches[kid].complete for kid in children):
        return False  # not after a plain completion: let the full reconcile judge
    dependencies = topology.dependencies
    ready = [
        kid
        for kid in children
        if kid not in launches
        and all(p in launches and launches[p].complete for p in dependencies[kid])
    ]
    reconciler = Reconciler(store, run_id, topology, callbacks, limits)
    for kid in ready:
        launch = reconciler.launch(kid, None)
        if launch is None:
            continue  # deferred after stale snapshots, as in the full reconcile
        if launch.complete or launch.disposition in FAILED_DISPOSITIONS:
            # A zero-task launch may unlock its own children; a failed one
            # finalises the run: both are the full reconcile's business.
            return False
    return True


def _checked_launches(
    frontier: object, run_id: str, wanted: set[int], count: int
) -> Mapping[int, LaunchProgress]:
    operation = f"get_run_frontier of run {run_id!r}"
    if not isinstance(frontier, RunFrontier):
        raise StoreContractError.unexpected(operation, frontier, "RunFrontier or None")
    if not isinstance(frontier.status, RunStatus):
        raise StoreContractError.unexpected(operation, frontier.status, "RunStatus", field="status")
    if frontier.node_count != count:
        raise StoreContractError.mismatch(operation, "node_count", frontier.node_count, count)
    if not isinstance(frontier.launches, Mapping):
        raise StoreContractError.unexpected(
            operation,
            frontier.launches,
            "a Mapping of node index to LaunchProgress",
            field="launches",
        )
    for index, launch in frontier.launches.items():
        if not isinstance(launch, LaunchProgress):
            raise StoreContractError(
                f"{operation} returned {type(launch).__name__} for node {index!r}; "
                "expected LaunchProgress",
                field="launches",
            )
        if index not in wanted:
            raise StoreContractError(
                f"{operation} returned a launch of node {index!r}; "
                f"expected only the requested nodes {sorted(wanted)}",
                field="launches",
            )
        if launch.node_index != index:
            raise StoreContractError(
                f"{operation} returned the launch of node {launch.node_index} "
                f"under key {index!r}; expected key {launch.node_index}",
                field="launches",
            )
    return frontier.launches
