"""Contract tests: run and task state machines (SM-01..SM-05)."""

from __future__ import annotations

import pytest

from dagwerk.constants import (
    RUN_RETRYABLE_STATUSES,
    RUN_TERMINAL_STATUSES,
    TASK_TERMINAL_STATUSES,
    RunStatus,
    TaskStatus,
)
from dagwerk.execution import recover_task
from dagwerk.orchestrator import RunStartRejectedError, abort_run, start_run
from dagwerk.retry import RetryRejectedError, retry_run, retry_task
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    Fail,
    FakeWorker,
    chain,
    claim,
    deliveries_for,
    emit,
    new_run,
    only_task,
    root,
    run_record,
    task,
)
from dagwerk.waiting import resume_task, wait_task


def test_sm_01_run_statuses_and_a_created_run_is_pending(store: ContractStore) -> None:
    assert [s.value for s in RunStatus] == [
        "pending",
        "running",
        "completed",
        "failed",
        "crashed",
        "cancelled",
    ]
    assert {
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.CRASHED,
        RunStatus.CANCELLED,
    } == RUN_TERMINAL_STATUSES
    assert RUN_TERMINAL_STATUSES - {RunStatus.COMPLETED} == RUN_RETRYABLE_STATUSES
    new_run(store, [root("a")], start=False)
    assert store.get_run_status("run-1") is RunStatus.PENDING
    assert run_record(store, "run-1").status is RunStatus.PENDING
    assert store.get_run_status("missing") is None
    assert store.get_run("missing") is None


def test_sm_01_create_run_is_not_repeated_for_an_existing_id(store: ContractStore) -> None:
    new_run(store, [root("a")], start=False)
    assert store.create_run("run-1", [root("other")]) is False
    nodes = store.get_run_nodes("run-1")
    assert nodes is not None
    assert [n.slug for n in nodes] == ["a"]


def test_sm_02_start_moves_pending_to_running_and_repeats_report_success(
    store: ContractStore,
) -> None:
    new_run(store, [root("a")], start=False)
    assert store.try_start_run("run-1") is True
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert store.try_start_run("run-1") is True
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert store.try_start_run("missing") is False
    # try_start_run creates no launches: that is reconcile's job.
    assert dict(store.list_node_launches("run-1")) == {}


def test_sm_02_terminal_runs_cannot_start_and_completed_is_final(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    FakeWorker(store, log).drain()
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert store.try_start_run("run-1") is False
    with pytest.raises(RunStartRejectedError):
        start_run(store, "run-1", callbacks=log.callbacks)
    assert abort_run(store, run_id="run-1", reason="late", callbacks=log.callbacks) is False
    with pytest.raises(RetryRejectedError):
        retry_run(store, "run-1")
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert log.kinds() == ["completed"]


def test_sm_02_pending_run_can_be_cancelled(store: ContractStore) -> None:
    log = new_run(store, [root("a")], start=False)
    assert abort_run(
        store,
        run_id="run-1",
        reason="user",
        callbacks=log.callbacks,
        status=RunStatus.CANCELLED,
    )
    assert store.get_run_status("run-1") is RunStatus.CANCELLED
    assert store.try_start_run("run-1") is False
    assert log.kinds() == ["cancelled"]


def test_sm_02_failed_run_returns_to_running_through_run_retry(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    FakeWorker(store, log, handlers={"a": lambda item: Fail("boom")}).drain()
    assert store.get_run_status("run-1") is RunStatus.FAILED
    retry_run(store, "run-1")
    assert store.get_run_status("run-1") is RunStatus.RUNNING


def test_sm_03_task_statuses_and_waiting_is_not_terminal() -> None:
    assert [s.value for s in TaskStatus] == [
        "pending",
        "queued",
        "running",
        "waiting",
        "completed",
        "failed",
        "crashed",
        "cancelled",
    ]
    assert {
        TaskStatus.COMPLETED,
        TaskStatus.FAILED,
        TaskStatus.CRASHED,
        TaskStatus.CANCELLED,
    } == TASK_TERMINAL_STATUSES
    assert TaskStatus.WAITING not in TASK_TERMINAL_STATUSES


def test_sm_04_task_walks_every_allowed_transition(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    created = only_task(store, "run-1", 0)
    # created as QUEUED, with an attempt and an outbox row
    assert created.status is TaskStatus.QUEUED
    assert [d.attempt_id for d in deliveries_for(store, created.task_id)] == [created.attempt_id]

    claimed = claim(store, created)  # QUEUED -> RUNNING, same attempt
    assert claimed.attempt_id == created.attempt_id
    assert task(store, created.task_id).status is TaskStatus.RUNNING

    waited = wait_task(
        store,
        created.task_id,
        "w1",
        expected_attempt_id=created.attempt_id,
        expected_generation=created.generation,
    )  # RUNNING -> WAITING, same attempt
    assert waited is not None
    assert task(store, created.task_id).status is TaskStatus.WAITING
    assert task(store, created.task_id).attempt_id == created.attempt_id

    resumed = resume_task(
        store,
        created.task_id,
        "w1",
        expected_attempt_id=created.attempt_id,
        expected_generation=created.generation,
    )  # WAITING -> QUEUED, new attempt
    assert resumed is not None
    after_resume = task(store, created.task_id)
    assert after_resume.status is TaskStatus.QUEUED
    assert after_resume.attempt_id == resumed.resumed_attempt_id != created.attempt_id

    claim(store, after_resume)
    recovered = recover_task(
        store,
        created.task_id,
        expected_attempt_id=after_resume.attempt_id,
        expected_generation=after_resume.generation,
    )  # RUNNING -> QUEUED, new attempt
    assert recovered is not None
    after_recover = task(store, created.task_id)
    assert after_recover.status is TaskStatus.QUEUED
    assert after_recover.attempt_id == recovered.recovered_attempt_id != after_resume.attempt_id

    claim(store, after_recover)
    crashed = store.mark_task_crashed(
        created.task_id, "lost", expected_attempt_id=after_recover.attempt_id
    )  # RUNNING -> CRASHED (no run finalisation at the store level)
    assert crashed is not None
    assert crashed.status is TaskStatus.CRASHED
    assert task(store, created.task_id).status is TaskStatus.CRASHED

    retried = retry_task(store, created.task_id, expected_attempt_id=after_recover.attempt_id)
    assert retried is not None  # CRASHED -> QUEUED, new attempt
    after_retry = task(store, created.task_id)
    assert after_retry.status is TaskStatus.QUEUED
    assert after_retry.attempt_id == retried != after_recover.attempt_id

    claim(store, after_retry)
    done = store.try_complete_task(
        created.task_id, emit("out-1"), expected_attempt_id=after_retry.attempt_id
    )  # RUNNING -> COMPLETED
    assert done is not None
    assert task(store, created.task_id).status is TaskStatus.COMPLETED
    assert log.kinds() == []


@pytest.mark.parametrize("via", ["queued", "running", "waiting"])
def test_sm_04_unfinished_task_is_cancelled_when_its_run_is_finalised(
    store: ContractStore, via: str
) -> None:
    log = new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)
    if via in ("running", "waiting"):
        claim(store, record)
    if via == "waiting":
        assert (
            wait_task(
                store,
                record.task_id,
                "w",
                expected_attempt_id=record.attempt_id,
                expected_generation=record.generation,
            )
            is not None
        )
    assert abort_run(store, run_id="run-1", reason="stop", callbacks=log.callbacks)
    assert task(store, record.task_id).status is TaskStatus.CANCELLED
    assert store.get_run_status("run-1") is RunStatus.FAILED
    assert log.kinds() == ["failed"]


def test_sm_04_terminal_tasks_do_not_move(store: ContractStore) -> None:
    log = new_run(store, chain(2))
    first = only_task(store, "run-1", 0)
    claim(store, first)
    assert store.try_complete_task(first.task_id, emit("x"), expected_attempt_id=first.attempt_id)
    for attempt in (
        lambda: store.mark_task_failed(first.task_id, "e", expected_attempt_id=first.attempt_id),
        lambda: store.mark_task_crashed(first.task_id, "e", expected_attempt_id=first.attempt_id),
        lambda: store.try_create_task_retry(first.task_id, expected_attempt_id=first.attempt_id),
        lambda: store.try_recover_task(
            first.task_id,
            expected_attempt_id=first.attempt_id,
            expected_generation=first.generation,
        ),
        lambda: store.try_wait_task(
            first.task_id,
            "w",
            expected_attempt_id=first.attempt_id,
            expected_generation=first.generation,
        ),
    ):
        assert attempt() is None
        assert task(store, first.task_id).status is TaskStatus.COMPLETED
    assert log.kinds() == []


def test_sm_05_only_the_current_attempt_changes_the_task(store: ContractStore) -> None:
    log = CallbackLog()
    new_run(store, [root("a")], log=log)
    first = only_task(store, "run-1", 0)
    claim(store, first)
    recovered = recover_task(
        store,
        first.task_id,
        expected_attempt_id=first.attempt_id,
        expected_generation=first.generation,
    )
    assert recovered is not None
    # The task is the same logical task; only the attempt changed.
    current = task(store, first.task_id)
    assert current.task_id == first.task_id
    assert current.plan == first.plan
    assert current.attempt_id != first.attempt_id
    assert (
        store.try_complete_task(first.task_id, emit("old"), expected_attempt_id=first.attempt_id)
        is None
    )
    claim(store, current)
    assert store.try_complete_task(
        first.task_id, emit("new"), expected_attempt_id=current.attempt_id
    )
    assert store.get_output_ids("run-1", 0) == ("new",)
