"""Several task completions per commit: the batched form of
:func:`dagwerk.orchestrator.complete_attempt`.

A worker that finished several attempts hands their completions to
:func:`complete_attempts`; the store commits them together with the acks of
their deliveries (:class:`~dagwerk.store.BatchQueueStore`), and every run
whose state may have moved is then reconciled once. On a store that offers
:class:`~dagwerk.store.UnitOfWorkStore` (SQLite) the completions and the
reconciles they cause (the children's launches) commit together: one commit
per batch instead of one plus one per launch; the run callbacks fire after
that commit. On a :class:`~dagwerk.store_run_units.RunUnitStore`
(PostgreSQL) a batch of one run that expects to end a launch
(``CompletionRequest.ends_launch``) commits the same way. Per request this does
what ``complete_attempt`` followed by ``ack`` does: outputs refused by the
store fail the task with the store's text, a stale attempt changes nothing,
an exact repeat replays the first result and reconciles again (FN-06).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import cast

from dagwerk._protocols import implements
from dagwerk.constants import RunStatus
from dagwerk.frontier import reconcile_after_completion
from dagwerk.limits import Limits
from dagwerk.orchestrator import (
    on_task_failed,
    reconcile_run,
)
from dagwerk.reconcile import (
    OrchestratorCallbacks,
    RunCallback,
    policy_needs_reconcile,
)
from dagwerk.store import (
    BatchQueueStore,
    ClaimAheadStore,
    CompletionOutcome,
    CompletionRequest,
    DagStore,
    OutputPublicationError,
    StoreContractError,
    TaskCompletionResult,
    UnitOfWorkStore,
)
from dagwerk.store_completion_reads import CompletionReadsStore
from dagwerk.store_run_units import RunUnitStore

__all__ = ["complete_attempts"]

_LOG = logging.getLogger("dagwerk.completions")


def complete_attempts(
    store: DagStore,
    worker_id: str,
    requests: Sequence[CompletionRequest],
    *,
    callbacks: OrchestratorCallbacks,
    limits: Limits | None = None,
    before: Callable[[], object] | None = None,
    then: Callable[[], object] | None = None,
) -> list[CompletionOutcome]:
    """Complete and acknowledge ``requests`` in one store call, then reconcile.

    Returns the store's outcome per request. A request refused with
    :class:`~dagwerk.store.OutputPublicationError` has already failed its
    task here (its delivery is not acknowledged: the caller acks it); any
    other error outcome (e.g. a budget refusal) is left to the caller, and
    nothing of that request was written.

    On a :class:`~dagwerk.store.UnitOfWorkStore`, ``then`` runs inside the
    same unit of work after the reconcile (the worker claims its next batch
    there, seeing the launches just made); an exception from it is logged
    and undoes only its own writes. ``before`` runs in the unit before the
    completions (the worker announces that claim there, see
    :class:`~dagwerk.store.ClaimAheadStore`); an exception from it leaves the
    unit. On a :class:`~dagwerk.store.ClaimAheadStore` without units
    (PostgreSQL) ``before`` runs before the completions and ``then`` after
    the reconciles, each store call committing on its own; an exception from
    ``then`` is logged. Elsewhere neither is called.
    """
    if not implements(store, BatchQueueStore):
        raise StoreContractError("complete_attempts needs a BatchQueueStore")
    items = list(requests)
    if not implements(store, UnitOfWorkStore):
        if not implements(store, ClaimAheadStore):
            return _complete(store, worker_id, items, callbacks, limits)
        # Without units (PostgreSQL), the launches of the reconciles may
        # still claim their tasks for the claim that follows them on this
        # thread (see ClaimAheadStore); each write commits on its own.
        if before is not None:
            before()
        # The reconciles' first reads come with the completions' writes.
        reads = (
            store.reads_with_completions()
            if implements(store, CompletionReadsStore)
            else nullcontext()
        )
        with reads:
            if implements(store, RunUnitStore) and _ends_a_launch_of_one_run(items):
                # A completion that ends its launch commits with the launches
                # of the children it made ready: one commit instead of two.
                deferred = _DeferredCallbacks()
                with store.run_unit():
                    outcomes = _complete(store, worker_id, items, deferred.callbacks, limits)
                deferred.fire(callbacks)
            else:
                outcomes = _complete(store, worker_id, items, callbacks, limits)
        if then is not None:
            try:
                then()
            except Exception:
                _LOG.exception("the work after a batch of completions failed")
        return outcomes
    deferred = _DeferredCallbacks()
    with store.unit_of_work():
        if before is not None:
            before()
        # Any error of the completions and their reconciles leaves the unit
        # (rolling all of it back), so their writes need no savepoints.
        with store.unit_of_work(all_or_nothing=True):
            outcomes = _complete(store, worker_id, items, deferred.callbacks, limits)
        if then is not None:
            try:
                then()
            except Exception:
                _LOG.exception("the work after a batch of completions failed")
    deferred.fire(callbacks)
    return outcomes


def _ends_a_launch_of_one_run(items: list[CompletionRequest]) -> bool:
    """Whether ``items`` name one run and one of them expects to end its
    launch (``CompletionRequest.ends_launch``)."""
    if not items or items[0].run_id is None:
        return False
    run_id = items[0].run_id
    return all(item.run_id == run_id for item in items) and any(item.ends_launch for item in items)


def _complete(
    store: DagStore,
    worker_id: str,
    items: list[CompletionRequest],
    callbacks: OrchestratorCallbacks,
    limits: Limits | None,
) -> list[CompletionOutcome]:
    outcomes = cast(BatchQueueStore, store).complete_and_ack(worker_id, items)
    if not isinstance(outcomes, list):
        raise StoreContractError.unexpected(
            "complete_and_ack", outcomes, "a list of one outcome per request"
        )
    if len(outcomes) != len(items):
        raise StoreContractError(
            f"complete_and_ack returned {len(outcomes)} outcomes; "
            f"expected {len(items)} (one per request)"
        )
    to_reconcile: dict[str, set[int]] = {}
    for item, outcome in zip(items, outcomes, strict=True):
        if isinstance(outcome, OutputPublicationError):
            on_task_failed(
                store,
                task_id=item.task_id,
                expected_attempt_id=item.expected_attempt_id,
                error_message=str(outcome),
                callbacks=callbacks,
                limits=limits,
            )
            continue
        if not isinstance(outcome, TaskCompletionResult):
            continue
        for name, got, want in (
            ("task_id", outcome.task_id, item.task_id),
            ("attempt_id", outcome.attempt_id, item.expected_attempt_id),
        ):
            if got != want:
                raise StoreContractError.mismatch("complete_and_ack", name, got, want)
        done = to_reconcile.setdefault(outcome.run_id, set())
        if outcome.launch_complete:
            done.add(outcome.node_index)
    for run_id, done in to_reconcile.items():
        # One reconcile per run sees every completion of the batch; after
        # completed launches only their children can have become ready, so
        # the reconcile reads just that neighbourhood (dagwerk.frontier),
        # falling back to the full pass whenever it cannot decide.
        if done:
            reconcile_after_completion(store, run_id, done, callbacks=callbacks, limits=limits)
        elif policy_needs_reconcile(store, run_id):
            reconcile_run(store, run_id, callbacks=callbacks, limits=limits)
    return outcomes


class _DeferredCallbacks:
    """Run callbacks held back until the unit of work that finalised the
    runs has committed; each fires once, in order."""

    def __init__(self) -> None:
        self.fired: list[tuple[RunStatus, str]] = []
        fired = self.fired  # not self: the callbacks would make a cycle with it

        def hold(status: RunStatus) -> RunCallback:
            return lambda run_id: fired.append((status, run_id))

        self.callbacks = OrchestratorCallbacks(
            on_run_completed=hold(RunStatus.COMPLETED),
            on_run_failed=hold(RunStatus.FAILED),
            on_run_crashed=hold(RunStatus.CRASHED),
            on_run_cancelled=hold(RunStatus.CANCELLED),
        )

    def fire(self, callbacks: OrchestratorCallbacks) -> None:
        """Fire every held callback; the first one that raised re-raises
        after the others fired (each terminal transition is announced once)."""
        error: Exception | None = None
        for status, run_id in self.fired:
            try:
                callbacks.fire(status, run_id)
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error
