"""Materialise a task's planned inputs through an :class:`~dagwerk.store.OutputResolver`."""

from __future__ import annotations

from collections.abc import Mapping

from dagwerk._trusted import trusted_model
from dagwerk.errors import MaterializationError
from dagwerk.json import ReadOnlyDict
from dagwerk.models import ResolvedOutput, TaskInputPlan, TaskInputs
from dagwerk.store import OutputResolver

__all__ = ["resolve_task_inputs"]


def resolve_task_inputs(store: OutputResolver, *, run_id: str, plan: TaskInputPlan) -> TaskInputs:
    """Resolve every output the plan names with one bulk request.

    Each ID is requested once (first-seen order across edges); every edge is
    rebuilt in its recorded order, so an ID on two edges appears on both. The
    resolver must return exactly the requested IDs as ``ResolvedOutput`` values
    keyed by their own ID; anything else, or an exception from the resolver,
    raises :class:`~dagwerk.errors.MaterializationError`. Parameters pass
    through unchanged; secret references are not resolved here.
    """
    requested = tuple(dict.fromkeys(oid for edge in plan.edges for oid in edge.output_ids))
    try:
        resolved = store.resolve_outputs(run_id, requested)
    except Exception as exc:
        raise MaterializationError(f"materializer failed: {exc}") from exc
    if not isinstance(resolved, Mapping):
        raise MaterializationError("materializer must return a mapping of output ID to output")
    missing = [oid for oid in requested if oid not in resolved]
    if missing:
        raise MaterializationError(
            f"materializer did not return {len(missing)} requested outputs: {missing[:5]!r}",
            field="output_ids",
        )
    if len(resolved) != len(requested):
        extra = [key for key in resolved if key not in set(requested)]
        raise MaterializationError(
            f"materializer returned {len(extra)} outputs that were not requested: {extra[:5]!r}",
            field="output_ids",
        )
    for key, value in resolved.items():
        if not isinstance(value, ResolvedOutput):
            raise MaterializationError(f"materializer returned a non-ResolvedOutput for {key!r}")
        if value.id != key:
            raise MaterializationError(
                f"materializer returned output {value.id!r} under key {key!r}"
            )
    edges = {edge.edge: tuple(resolved[oid] for oid in edge.output_ids) for edge in plan.edges}
    return trusted_model(TaskInputs, {"edges": ReadOnlyDict(edges), "parameters": plan.parameters})
