"""Waiting and resumption: the wrappers around :class:`~dagwerk.store.DagWaitStore`.

Both validate the request and the wait ID (``ValueError``) and check the
returned record (:class:`~dagwerk.store.StoreContractError`). They open no
surrounding transaction: call them inside the application transaction that
stores the checkpoint (wait) or the response (resume).
"""

from __future__ import annotations

from dagwerk._protocols import implements
from dagwerk.execution import validate_attempt_request
from dagwerk.store import (
    DagWaitStore,
    InvalidStoreValueError,
    StoreContractError,
    TaskResumeResult,
    TaskWaitResult,
    WaitResponseStore,
    validate_wait_id,
)

__all__ = ["resume_task", "wait_task"]


def wait_task(
    store: DagWaitStore,
    task_id: str,
    wait_id: str,
    *,
    expected_attempt_id: str,
    expected_generation: int,
) -> TaskWaitResult | None:
    """Release the worker of the current RUNNING attempt under ``wait_id``.

    No new delivery is promised. An exact repeat returns the original result;
    ``None`` means the attempt may not wait (stale, not running, reused key).
    """
    validate_attempt_request(task_id, expected_attempt_id, expected_generation)
    validate_wait_id(wait_id)
    result = store.try_wait_task(
        task_id,
        wait_id,
        expected_attempt_id=expected_attempt_id,
        expected_generation=expected_generation,
    )
    if result is None:
        return None
    if not isinstance(result, TaskWaitResult):
        raise StoreContractError.unexpected("try_wait_task", result, "TaskWaitResult or None")
    for name, got, want in (
        ("task_id", result.task_id, task_id),
        ("attempt_id", result.attempt_id, expected_attempt_id),
        ("generation", result.generation, expected_generation),
        ("wait_id", result.wait_id, wait_id),
    ):
        if got != want:
            raise StoreContractError.mismatch("try_wait_task", name, got, want)
    return result


def resume_task(
    store: DagWaitStore,
    task_id: str,
    wait_id: str,
    *,
    expected_attempt_id: str,
    expected_generation: int,
    response: object = None,
) -> TaskResumeResult | None:
    """Resolve an active wait with exactly one replacement attempt and its delivery.

    ``response`` (JSON) is stored with the wait in the same commit; the
    resumed attempt reads it with ``get_wait_response`` (the worker hands it
    over as ``ctx.wait_response``). Only a :class:`~dagwerk.store.WaitResponseStore`
    keeps a response: for a store with the seed's ``DagWaitStore`` alone a
    response raises :class:`~dagwerk.store.InvalidStoreValueError` before the
    store is called. The result is not permission to run: the
    new attempt must win a claim. An exact repeat returns the first result;
    a wait invalidated before it was resolved gives ``None``.
    """
    validate_attempt_request(task_id, expected_attempt_id, expected_generation)
    validate_wait_id(wait_id)
    if response is None:
        # The seed's call: every DagWaitStore takes it.
        result = store.try_resume_task(
            task_id,
            wait_id,
            expected_attempt_id=expected_attempt_id,
            expected_generation=expected_generation,
        )
    else:
        if not implements(store, WaitResponseStore):
            raise InvalidStoreValueError(
                "this store keeps no wait responses (it does not implement"
                " WaitResponseStore); resume without a response",
                field="response",
            )
        result = store.try_resume_task(
            task_id,
            wait_id,
            expected_attempt_id=expected_attempt_id,
            expected_generation=expected_generation,
            response=response,
        )
    if result is None:
        return None
    if not isinstance(result, TaskResumeResult):
        raise StoreContractError.unexpected("try_resume_task", result, "TaskResumeResult or None")
    for name, got, want in (
        ("task_id", result.task_id, task_id),
        ("waiting_attempt_id", result.waiting_attempt_id, expected_attempt_id),
        ("generation", result.generation, expected_generation),
        ("wait_id", result.wait_id, wait_id),
    ):
        if got != want:
            raise StoreContractError.mismatch("try_resume_task", name, got, want)
    return result
