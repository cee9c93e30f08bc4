"""The worker's calls into :mod:`dagwerk.tracing`, one per step of an attempt
(each does nothing when the worker does not trace)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dagwerk.tracing import WorkerTracing, now_ns

if TYPE_CHECKING:
    from dagwerk.runtime.attempts import Attempt
    from dagwerk.runtime.outcomes import ExecutionOutcome

__all__ = ["attempt_started", "attempts_settled", "attempts_settling", "batch_stored", "now_ns"]


def attempt_started(tracing: WorkerTracing | None, attempt: Attempt) -> None:
    if tracing is None:
        return
    delivery = attempt.delivery
    tracing.started(
        delivery.delivery_id,
        run_id=delivery.run_id,
        task_id=delivery.task_id,
        attempt=attempt.task.attempt_number,
        node=attempt.node.slug,
        claimed_at=attempt.task.started_at,
    )


def attempts_settling(
    tracing: WorkerTracing | None,
    attempts: Sequence[Attempt],
    outcomes: Sequence[ExecutionOutcome | Exception],
) -> None:
    if tracing is None:
        return
    for attempt, outcome in zip(attempts, outcomes, strict=True):
        if isinstance(outcome, Exception):
            tracing.settling(attempt.delivery.delivery_id, "error", outcome)
        else:
            tracing.settling(attempt.delivery.delivery_id, outcome.kind.value, outcome.error)


def attempts_settled(tracing: WorkerTracing | None, attempts: Sequence[Attempt]) -> None:
    if tracing is None:
        return
    for attempt in attempts:
        tracing.settled(attempt.delivery.delivery_id)


def batch_stored(
    tracing: WorkerTracing | None, attempts: Sequence[Attempt], operation: str, started_ns: int
) -> None:
    if tracing is not None:
        tracing.store_batch([a.delivery.run_id for a in attempts], operation, started_ns)
