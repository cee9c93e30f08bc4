"""The worker's calls into :mod:`dagwerk.tracing`, one per step of an attempt
(each does nothing when the worker does not trace)."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Protocol

from dagwerk.tracing import WorkerTracing, now_ns

# What is read of the worker's Attempt and ExecutionOutcome: as protocols,
# so this module stays out of the worker's modules' import cycle.


class _Delivery(Protocol):
    @property
    def delivery_id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def offered_at(self) -> float | None: ...


class _Task(Protocol):
    @property
    def attempt_number(self) -> int: ...
    @property
    def started_at(self) -> float | None: ...


class _Node(Protocol):
    @property
    def slug(self) -> str: ...


class Attempt(Protocol):
    @property
    def delivery(self) -> _Delivery: ...
    @property
    def task(self) -> _Task: ...
    @property
    def node(self) -> _Node: ...


class ExecutionOutcome(Protocol):
    @property
    def kind(self) -> Enum: ...
    @property
    def error(self) -> BaseException | None: ...


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
        offered_at=delivery.offered_at,
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
