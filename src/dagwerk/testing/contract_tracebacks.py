"""Contract tests: the tracebacks of failed attempts
(:class:`~dagwerk.store_tracebacks.AttemptTracebackStore`), kept per attempt
and read back with ``list_attempts``."""

from __future__ import annotations

import pytest

from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.execution import claim_task
from dagwerk.orchestrator import on_task_failed
from dagwerk.store_tracebacks import (
    MAX_ATTEMPT_TRACEBACK_BYTES,
    AttemptTracebackError,
    AttemptTracebackStore,
)
from dagwerk.testing.contract_queue import QueueContractStore
from dagwerk.testing.helpers import CallbackLog, new_run, only_task, root, task

__all__ = [
    "test_tb_01_a_running_attempts_traceback_is_kept_through_its_retry",
    "test_tb_02_only_the_current_running_attempt_takes_one_and_the_first_stays",
    "test_tb_03_a_final_failure_keeps_the_traceback_on_its_attempt",
    "test_tb_04_malformed_or_oversized_requests_are_refused_naming_the_field",
]

_TEXT = 'Traceback (most recent call last):\n  File "p.py", line 1\nValueError: <b>boom</b> é'


def _tracebacks(store: object) -> AttemptTracebackStore:
    assert isinstance(store, AttemptTracebackStore), "the store keeps no tracebacks"
    return store


def _claimed(store: QueueContractStore, run_id: str = "run-1") -> tuple[str, str]:
    row = only_task(store, run_id, 0)
    (leased,) = store.dequeue("w1", limit=1, lease_seconds=30.0)
    assert claim_task(
        store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=row.generation
    )
    assert leased.task_id == row.task_id
    return row.task_id, row.attempt_id


def test_tb_01_a_running_attempts_traceback_is_kept_through_its_retry(
    qstore: QueueContractStore,
) -> None:
    tracebacks = _tracebacks(qstore)
    new_run(qstore, [root("a")])
    task_id, attempt_id = _claimed(qstore)
    assert tracebacks.record_attempt_traceback(task_id, attempt_id, _TEXT)
    (current,) = qstore.list_attempts(task_id)
    assert current.traceback == _TEXT
    assert qstore.try_fail_task_with_retry(
        task_id, "ValueError: boom", expected_attempt_id=attempt_id, available_at=0.0
    )
    old, new = qstore.list_attempts(task_id)
    assert (old.attempt_id, old.status, old.traceback) == (attempt_id, TaskStatus.FAILED, _TEXT)
    assert new.traceback is None


def test_tb_02_only_the_current_running_attempt_takes_one_and_the_first_stays(
    qstore: QueueContractStore,
) -> None:
    tracebacks = _tracebacks(qstore)
    new_run(qstore, [root("a")])
    queued = only_task(qstore, "run-1", 0)
    # A queued attempt has not run: it raised nothing.
    assert not tracebacks.record_attempt_traceback(queued.task_id, queued.attempt_id, _TEXT)
    assert not tracebacks.record_attempt_traceback("no-such-task", queued.attempt_id, _TEXT)
    task_id, attempt_id = _claimed(qstore)
    assert not tracebacks.record_attempt_traceback(task_id, "not-its-attempt", _TEXT)
    assert tracebacks.record_attempt_traceback(task_id, attempt_id, _TEXT)
    assert not tracebacks.record_attempt_traceback(task_id, attempt_id, "a second one")
    (only,) = qstore.list_attempts(task_id)
    assert only.traceback == _TEXT
    assert qstore.try_fail_task_with_retry(
        task_id, "boom", expected_attempt_id=attempt_id, available_at=0.0
    )
    # The replaced attempt is no longer current: a late traceback is refused.
    assert not tracebacks.record_attempt_traceback(task_id, attempt_id, "late")
    assert [a.traceback for a in qstore.list_attempts(task_id)] == [_TEXT, None]


def test_tb_03_a_final_failure_keeps_the_traceback_on_its_attempt(
    qstore: QueueContractStore,
) -> None:
    tracebacks = _tracebacks(qstore)
    new_run(qstore, [root("a")])
    task_id, attempt_id = _claimed(qstore)
    text = "x" * (MAX_ATTEMPT_TRACEBACK_BYTES - 2) + "é"  # exactly at the bound in UTF-8
    assert tracebacks.record_attempt_traceback(task_id, attempt_id, text)
    on_task_failed(
        qstore,
        task_id=task_id,
        expected_attempt_id=attempt_id,
        error_message="ValueError: boom",
        callbacks=CallbackLog().callbacks,
    )
    assert task(qstore, task_id).status is TaskStatus.FAILED
    assert qstore.get_run_status("run-1") is RunStatus.FAILED
    (only,) = qstore.list_attempts(task_id)
    assert (only.status, only.error, only.traceback) == (
        TaskStatus.FAILED,
        "ValueError: boom",
        text,
    )
    # A settled attempt takes none.
    assert not tracebacks.record_attempt_traceback(task_id, attempt_id, "late")


def test_tb_04_malformed_or_oversized_requests_are_refused_naming_the_field(
    qstore: QueueContractStore,
) -> None:
    tracebacks = _tracebacks(qstore)
    new_run(qstore, [root("a")])
    task_id, attempt_id = _claimed(qstore)
    over = "é" * (MAX_ATTEMPT_TRACEBACK_BYTES // 2 + 1)  # within the bound in characters only
    with pytest.raises(AttemptTracebackError) as raised:
        tracebacks.record_attempt_traceback(task_id, attempt_id, over)
    assert raised.value.field == "traceback" and raised.value.limit == MAX_ATTEMPT_TRACEBACK_BYTES
    bad: list[tuple[object, object, object, str]] = [
        ("", attempt_id, _TEXT, "task_id"),
        (task_id, None, _TEXT, "attempt_id"),
        (task_id, attempt_id, b"bytes", "traceback"),
    ]
    for task_arg, attempt_arg, text_arg, field in bad:
        with pytest.raises(AttemptTracebackError) as raised:
            tracebacks.record_attempt_traceback(task_arg, attempt_arg, text_arg)  # type: ignore[arg-type]
        assert raised.value.field == field
    # Nothing was stored by the refused requests.
    (only,) = qstore.list_attempts(task_id)
    assert only.traceback is None
