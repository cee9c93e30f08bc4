"""Task and run retries over :class:`~dagwerk.store.DagRetryStore`, and node
re-runs over :class:`~dagwerk.store.NodeRerunStore`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dagwerk.errors import DagwerkError
from dagwerk.store import (
    DagRetryStore,
    InvalidStoreValueError,
    NodeRerunStore,
    RunReopenResult,
    StoreContractError,
)

__all__ = ["RetryRejectedError", "RunRetryResult", "rerun_nodes", "retry_run", "retry_task"]


class RetryRejectedError(DagwerkError, RuntimeError):
    """The run no longer permits the retry (the store refused it; nothing changed)."""

    code = "retry_rejected"


@dataclass(frozen=True, slots=True)
class RunRetryResult:
    """What a run retry committed: affected nodes, their new generations, retry count."""

    affected_nodes: tuple[int, ...]
    generations: Mapping[int, int]
    retry_count: int


def retry_task(store: DagRetryStore, task_id: str, *, expected_attempt_id: str) -> str | None:
    """Replace the current CRASHED attempt; the new attempt ID, or ``None``."""
    return store.try_create_task_retry(task_id, expected_attempt_id=expected_attempt_id)


def _normalise_boundary(boundary_indices: Iterable[int]) -> tuple[int, ...]:
    values = list(boundary_indices)
    if not values:
        raise InvalidStoreValueError("retry boundary must not be empty", field="boundary_indices")
    for value in values:
        if type(value) is not int:
            raise InvalidStoreValueError(
                f"retry boundary must contain integers, got {value!r}", field="boundary_indices"
            )
        if value < 0:
            raise InvalidStoreValueError(
                f"retry boundary contains an invalid node index {value}",
                field="boundary_indices",
            )
    return tuple(sorted(set(values)))


def _checked_generations(operation: str, result: RunReopenResult) -> dict[int, int]:
    """The result's new generations, which must be keyed by its affected nodes."""
    generations = dict(result.generations)
    if set(generations) != set(result.affected_nodes):
        raise StoreContractError(
            f"{operation} returned generations for nodes {sorted(generations)}; "
            f"expected the affected nodes {sorted(result.affected_nodes)}",
            field="generations",
        )
    return generations


def retry_run(
    store: DagRetryStore, run_id: str, boundary_indices: Iterable[int] | None = None
) -> RunRetryResult:
    """Reopen a FAILED, CRASHED or CANCELLED run in one store transaction.

    A supplied boundary must be a non-empty collection of non-negative ints;
    it is sorted and deduplicated and only asserts that those nodes still hold
    active failures (the store derives the affected set). Raises
    :class:`RetryRejectedError` when the store refuses. Call ``reconcile_run``
    after a successful retry.
    """
    boundary = None if boundary_indices is None else _normalise_boundary(boundary_indices)
    result = store.try_reopen_run(run_id, boundary)
    if result is None:
        raise RetryRejectedError(f"run {run_id!r} cannot be retried", field="run_id")
    if not isinstance(result, RunReopenResult):
        raise StoreContractError.unexpected("try_reopen_run", result, "RunReopenResult or None")
    generations = _checked_generations("try_reopen_run", result)
    return RunRetryResult(
        affected_nodes=tuple(result.affected_nodes),
        generations=MappingProxyType(generations),
        retry_count=result.retry_count,
    )


def rerun_nodes(store: NodeRerunStore, run_id: str, node_indices: Iterable[int]) -> RunRetryResult:
    """Re-run ``node_indices`` and all their descendants as a new generation,
    reopening the run (a COMPLETED run too) in one store transaction.

    The indices must be a non-empty collection of non-negative ints; they are
    sorted and deduplicated. Raises :class:`~dagwerk.store.RerunRefusedError`
    when an affected task is RUNNING and :class:`RetryRejectedError` when the
    store refuses (missing or PENDING run, index out of range). Call
    ``reconcile_run`` afterwards to launch the reset nodes.
    """
    indices = _normalise_boundary(node_indices)
    result = store.try_rerun_nodes(run_id, indices)
    if result is None:
        raise RetryRejectedError(f"nodes {list(indices)} of run {run_id!r} cannot be re-run")
    if not isinstance(result, RunReopenResult):
        raise StoreContractError.unexpected("try_rerun_nodes", result, "RunReopenResult or None")
    generations = _checked_generations("try_rerun_nodes", result)
    if not set(indices) <= set(result.affected_nodes):
        raise StoreContractError(
            f"try_rerun_nodes returned affected nodes {sorted(result.affected_nodes)}; "
            f"expected them to include the requested nodes {list(indices)}",
            field="affected_nodes",
        )
    return RunRetryResult(
        affected_nodes=tuple(result.affected_nodes),
        generations=MappingProxyType(generations),
        retry_count=result.retry_count,
    )
