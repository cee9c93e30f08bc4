"""Claim and recovery: the wrappers a worker calls around the store.

Both validate the request before the store sees it (``ValueError``) and check
that the store's answer is the record of the request
(:class:`~dagwerk.store.StoreContractError`). ``None`` means "do not execute";
it never explains why.
"""

from __future__ import annotations

from dagwerk.store import (
    DagStore,
    InvalidStoreValueError,
    StoreContractError,
    TaskClaimResult,
    TaskRecoveryResult,
)

__all__ = ["claim_task", "recover_task", "validate_attempt_request"]


def validate_attempt_request(task_id: object, attempt_id: object, generation: object) -> None:
    """FN-04: IDs are non-empty strings, the generation a non-bool int >= 0."""
    if not isinstance(task_id, str) or not task_id:
        raise InvalidStoreValueError("task ID must be a non-empty string", field="task_id")
    if not isinstance(attempt_id, str) or not attempt_id:
        raise InvalidStoreValueError(
            "expected attempt ID must be a non-empty string", field="expected_attempt_id"
        )
    if type(generation) is not int or generation < 0:
        raise InvalidStoreValueError(
            "expected generation must be a non-negative int", field="expected_generation"
        )


def claim_task(
    store: DagStore, task_id: str, *, expected_attempt_id: str, expected_generation: int
) -> TaskClaimResult | None:
    """Let this delivery execute the named attempt, or return ``None``.

    Only one delivery can claim an attempt; ``None`` forbids execution and
    does not say why (owned elsewhere, finished, waiting, stale).
    """
    validate_attempt_request(task_id, expected_attempt_id, expected_generation)
    result = store.try_claim_task(
        task_id, expected_attempt_id=expected_attempt_id, expected_generation=expected_generation
    )
    if result is None:
        return None
    if not isinstance(result, TaskClaimResult):
        raise StoreContractError.unexpected("try_claim_task", result, "TaskClaimResult or None")
    for name, got, want in (
        ("task_id", result.task_id, task_id),
        ("attempt_id", result.attempt_id, expected_attempt_id),
        ("generation", result.generation, expected_generation),
    ):
        if got != want:
            raise StoreContractError.mismatch("try_claim_task", name, got, want)
    return result


def recover_task(
    store: DagStore, task_id: str, *, expected_attempt_id: str, expected_generation: int
) -> TaskRecoveryResult | None:
    """Replace an abandoned RUNNING attempt with a new queued one.

    The result records what the store committed; it does not authorise
    execution (the new attempt must win a claim). Recover only when repeating
    the attempt's external actions is known to be safe.
    """
    validate_attempt_request(task_id, expected_attempt_id, expected_generation)
    result = store.try_recover_task(
        task_id, expected_attempt_id=expected_attempt_id, expected_generation=expected_generation
    )
    if result is None:
        return None
    if not isinstance(result, TaskRecoveryResult):
        raise StoreContractError.unexpected(
            "try_recover_task", result, "TaskRecoveryResult or None"
        )
    for name, got, want in (
        ("task_id", result.task_id, task_id),
        ("abandoned_attempt_id", result.abandoned_attempt_id, expected_attempt_id),
        ("generation", result.generation, expected_generation),
    ):
        if got != want:
            raise StoreContractError.mismatch("try_recover_task", name, got, want)
    return result
