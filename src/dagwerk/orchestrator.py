"""Run orchestration over the store protocols.

Every function here is written once against :mod:`dagwerk.store` and knows
nothing of a backend. The store makes each transition atomic; these
functions decide which transition to ask for next and check what the store
returns (:class:`~dagwerk.store.StoreContractError` on nonsense).

Callbacks fire only after a terminal transition committed, and only in the
call whose ``try_finalize_run`` returned True, so each transition is
announced exactly once. The application serialises terminal handlers and run
retries per run until a callback returns (RT-13).

Failure policies (``decisions.md``): ``fail_fast`` finalises the run on the
first failure; ``stop_on_first_failure`` creates no new launch after a failure
and finalises once no task is QUEUED or RUNNING; ``continue_others`` keeps
independent branches going, gives descendants of a failure a zero-task
``UPSTREAM_FAILED`` launch and finalises once nothing can progress. A store
that does not implement :class:`~dagwerk.store.DagRunStore` runs ``fail_fast``.
"""

from __future__ import annotations

import logging

from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import (
    FailurePolicy,
    RunStatus,
    TaskStatus,
)
from dagwerk.errors import DagwerkError
from dagwerk.limits import Limits
from dagwerk.models import (
    DagNode,
    EmittedOutput,
)
from dagwerk.reconcile import (
    OrchestratorCallbacks,
    Reconciler,
    RunCallback,
    cached_topology,
    failure_policy,
    limits_of,
    policy_needs_reconcile,
    topology_cache,
)
from dagwerk.store import (
    DagRunStore,
    DagStore,
    OutputPublicationError,
    StoreContractError,
    TaskAttemptRef,
    TaskCompletionResult,
    TaskFailureResult,
)
from dagwerk.topology import RunTopology

__all__ = [
    "OrchestratorCallbacks",
    "RunCallback",
    "RunDefinitionMissingError",
    "RunStartRejectedError",
    "abort_run",
    "cancel_run",
    "on_task_complete",
    "on_task_crashed",
    "on_task_failed",
    "reconcile_run",
    "settle_crashed_task",
    "start_run",
]

logger = logging.getLogger(__name__)


class RunStartRejectedError(DagwerkError, RuntimeError):
    """The stored run cannot enter or stay in RUNNING."""

    code = "run_start_rejected"


class RunDefinitionMissingError(DagwerkError, ValueError):
    """The store holds no node definition for the run."""

    code = "run_definition_missing"


_ABORT_STATUSES = frozenset({RunStatus.FAILED, RunStatus.CRASHED, RunStatus.CANCELLED})


def _build_topology(nodes: list[DagNode] | None, run_id: str, limits: Limits) -> RunTopology:
    if nodes is None:
        raise RunDefinitionMissingError(
            f"run {run_id!r} has no stored node definition", field="run_id"
        )
    return RunTopology.build(nodes, limits=limits)


# --- start and reconcile ----------------------------------------------------


def start_run(
    store: DagStore,
    run_id: str,
    *,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> list[int]:
    """Validate the stored topology, start the run and reconcile it.

    The topology is validated before run state is touched, so an invalid
    stored graph leaves the run PENDING with no work written. Returns the root
    node indices in index order. Raises ``ValueError`` (no stored definition,
    invalid graph) or :class:`RunStartRejectedError` (missing or terminal run).
    Safe to repeat for a RUNNING run.
    """
    limits = limits_of(store, limits)
    cache = topology_cache(store, limits)
    if cache is None:
        topology = _build_topology(store.get_run_nodes(run_id), run_id, limits)
    else:
        found = cached_topology(cache, run_id)
        if found is None:
            raise RunDefinitionMissingError(
                f"run {run_id!r} has no stored node definition", field="run_id"
            )
        topology = found
    if not store.try_start_run(run_id):
        raise RunStartRejectedError(
            f"run {run_id!r} cannot be started: it is missing or already terminal",
            field="run_id",
        )
    Reconciler(store, run_id, topology, callbacks, limits).run()
    return list(topology.roots)


def reconcile_run(
    store: DagStore,
    run_id: str,
    *,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> None:
    """Create launches for the ready nodes of a RUNNING run and finalise it when
    its failure policy or completion says so.

    Does nothing (and reads no topology) unless the run is RUNNING. Safe to
    call after any commit, any number of times. Raises
    :class:`~dagwerk.store.StoreContractError` when the store contradicts the
    protocol (e.g. a RUNNING run without stored nodes).
    """
    if store.get_run_status(run_id) != RunStatus.RUNNING:
        return
    limits = limits_of(store, limits)
    cache = topology_cache(store, limits)
    found: RunTopology | None
    if cache is None:
        nodes = store.get_run_nodes(run_id)
        found = None if nodes is None else RunTopology.build(nodes, limits=limits)
    else:
        found = cached_topology(cache, run_id)
    if found is None:
        raise StoreContractError(f"RUNNING run {run_id!r} has no stored node definition")
    topology = found
    Reconciler(store, run_id, topology, callbacks, limits).run()


# --- task callbacks ---------------------------------------------------------


def on_task_complete(
    store: DagStore,
    *,
    task_id: str,
    expected_attempt_id: str,
    outputs: tuple[EmittedOutput, ...] = (),
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> None:
    """Publish the attempt's outputs; reconcile when its launch became complete.

    An :class:`~dagwerk.store.OutputPublicationError` fails the task (and, by
    policy, the run) with its text. ``None`` from the store (stale, queued or
    waiting attempt) returns silently. An exact repeat reconciles again, which
    repairs a crash between the completion commit and reconcile (FN-06). A
    non-final completion of a fail-fast run reads neither topology nor launches.
    """
    complete_attempt(
        store,
        task_id=task_id,
        expected_attempt_id=expected_attempt_id,
        outputs=outputs,
        callbacks=callbacks,
        limits=limits,
    )


def complete_attempt(
    store: DagStore,
    *,
    task_id: str,
    expected_attempt_id: str,
    outputs: tuple[EmittedOutput, ...] = (),
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> TaskCompletionResult | None:
    """:func:`on_task_complete` that also returns the store's completion record
    (``None`` when this attempt's completion was not accepted), so the worker
    needs no read to learn whether its attempt won."""
    try:
        result = store.try_complete_task(
            task_id, tuple(outputs), expected_attempt_id=expected_attempt_id
        )
    except OutputPublicationError as exc:
        on_task_failed(
            store,
            task_id=task_id,
            expected_attempt_id=expected_attempt_id,
            error_message=str(exc),
            callbacks=callbacks,
            limits=limits,
        )
        return None
    if result is None:
        return None
    if not isinstance(result, TaskCompletionResult):
        raise StoreContractError.unexpected(
            "try_complete_task", result, "TaskCompletionResult or None"
        )
    for name, got, want in (
        ("task_id", result.task_id, task_id),
        ("attempt_id", result.attempt_id, expected_attempt_id),
    ):
        if got != want:
            raise StoreContractError.mismatch("try_complete_task", name, got, want)
    if result.launch_complete or policy_needs_reconcile(store, result.run_id):
        reconcile_run(store, result.run_id, callbacks=callbacks, limits=limits)
    return result


def _on_task_failure(
    store: DagStore,
    result: TaskFailureResult | None,
    *,
    task_id: str,
    expected_attempt_id: str,
    expected_status: TaskStatus,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None,
) -> None:
    if result is None:
        return
    operation = "mark_task_failed" if expected_status == TaskStatus.FAILED else "mark_task_crashed"
    if not isinstance(result, TaskFailureResult):
        raise StoreContractError.unexpected(operation, result, "TaskFailureResult or None")
    for name, got, want in (
        ("task_id", result.task_id, task_id),
        ("attempt_id", result.attempt_id, expected_attempt_id),
        ("status", result.status, expected_status),
    ):
        if got != want:
            raise StoreContractError.mismatch(operation, name, got, want)
    if failure_policy(store, result.run_id) is FailurePolicy.FAIL_FAST:
        status = RunStatus.FAILED if expected_status == TaskStatus.FAILED else RunStatus.CRASHED
        # The cause is rechecked inside the terminal transaction: a task retry
        # that committed in between keeps the run RUNNING (OR-16).
        cause = TaskAttemptRef(task_id, expected_attempt_id)
        if store.try_finalize_run(result.run_id, status, cause=cause):
            callbacks.fire(status, result.run_id)
        return
    reconcile_run(store, result.run_id, callbacks=callbacks, limits=limits)


def on_task_failed(
    store: DagStore,
    *,
    task_id: str,
    expected_attempt_id: str,
    error_message: str,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> None:
    """Mark the current attempt FAILED, then apply the run's failure policy
    (fail-fast: finalise the run FAILED citing the attempt's persisted error)."""
    result = store.mark_task_failed(task_id, error_message, expected_attempt_id=expected_attempt_id)
    _on_task_failure(
        store,
        result,
        task_id=task_id,
        expected_attempt_id=expected_attempt_id,
        expected_status=TaskStatus.FAILED,
        callbacks=callbacks,
        limits=limits,
    )


def on_task_crashed(
    store: DagStore,
    *,
    task_id: str,
    expected_attempt_id: str,
    error_message: str,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> None:
    """Mark the current attempt CRASHED, then apply the run's failure policy
    (fail-fast: finalise the run CRASHED citing the attempt)."""
    result = store.mark_task_crashed(
        task_id, error_message, expected_attempt_id=expected_attempt_id
    )
    _on_task_failure(
        store,
        result,
        task_id=task_id,
        expected_attempt_id=expected_attempt_id,
        expected_status=TaskStatus.CRASHED,
        callbacks=callbacks,
        limits=limits,
    )


def settle_crashed_task(
    store: DagStore,
    task_id: str,
    *,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
) -> bool:
    """Apply the run's failure policy to a task the store already crashed
    (e.g. the queue dead-lettered its delivery): fail-fast finalises the run
    CRASHED citing the attempt; the other policies reconcile.

    Returns whether the task was still a current CRASHED task of a RUNNING
    run (only then does anything happen). Safe to repeat.
    """
    runs = StoreCapabilities.of(store).runs
    if runs is None:
        raise StoreContractError("settle_crashed_task needs a store with get_task (DagRunStore)")
    record = runs.get_task(task_id)
    if record is None or record.invalidated or record.status != TaskStatus.CRASHED:
        return False
    if store.get_run_status(record.run_id) != RunStatus.RUNNING:
        return False
    result = TaskFailureResult(
        task_id=record.task_id,
        attempt_id=record.attempt_id,
        run_id=record.run_id,
        node_index=record.node_index,
        generation=record.generation,
        status=TaskStatus.CRASHED,
    )
    _on_task_failure(
        store,
        result,
        task_id=task_id,
        expected_attempt_id=record.attempt_id,
        expected_status=TaskStatus.CRASHED,
        callbacks=callbacks,
        limits=limits,
    )
    return True


# --- external termination ---------------------------------------------------


def abort_run(
    store: DagStore,
    *,
    run_id: str,
    reason: str,
    callbacks: OrchestratorCallbacks,
    status: RunStatus = RunStatus.FAILED,
) -> bool:
    """Terminate a run from outside the task lifecycle (deadline, user request).

    ``status`` must be FAILED, CRASHED or CANCELLED (else ``ValueError``).
    Returns whether this call committed the transition; only then does the
    callback fire.
    """
    if status not in _ABORT_STATUSES:
        raise ValueError(f"abort status must be failed, crashed or cancelled, not {status!r}")
    status = RunStatus(status)
    if store.try_finalize_run(run_id, status, reason=reason):
        callbacks.fire(status, run_id)
        return True
    return False


def cancel_run(
    store: DagRunStore,
    run_id: str,
    *,
    callbacks: OrchestratorCallbacks | None = None,
    reason: str | None = None,
) -> bool:
    """Cancel a PENDING or RUNNING run in one commit (waits invalidated,
    unfinished tasks cancelled). Returns whether this call made the transition;
    only then does ``on_run_cancelled`` fire."""
    if store.try_cancel_run(run_id, reason):
        if callbacks is not None:
            callbacks.on_run_cancelled(run_id)
        return True
    return False
