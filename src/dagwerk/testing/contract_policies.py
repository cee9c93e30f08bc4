"""Contract tests: failure policies (decisions.md) and ``cancel_run``."""

from __future__ import annotations

import pytest

from dagwerk.constants import FailurePolicy, InputMode, NodeDisposition, RunStatus, TaskStatus
from dagwerk.models import DagNode
from dagwerk.orchestrator import cancel_run, on_task_complete, on_task_failed
from dagwerk.retry import retry_run
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    Crash,
    Fail,
    FakeWorker,
    Hold,
    Wait,
    child,
    claim,
    emit,
    launch_of,
    new_run,
    only_task,
    root,
    run_record,
    task,
)
from dagwerk.waiting import resume_task


def _two_branches() -> list[DagNode]:
    """a(0) -> c(2), b(1) -> d(3): two independent branches."""
    return [
        root("a"),
        root("b"),
        child("c", "a", mode=InputMode.ALL),
        child("d", "b", mode=InputMode.ALL),
    ]


# --- policy recording ---------------------------------------------------------------


def test_policy_is_recorded_at_creation(store: ContractStore) -> None:
    store.create_run("default", [root("a")])
    store.create_run("named", [root("a")], failure_policy="continue_others")
    assert run_record(store, "default").failure_policy is FailurePolicy.FAIL_FAST
    assert run_record(store, "named").failure_policy is FailurePolicy.CONTINUE_OTHERS
    with pytest.raises(ValueError):
        store.create_run("bad", [root("a")], failure_policy="sometimes")
    assert store.get_run("bad") is None


# --- fail_fast -------------------------------------------------------------------------


def test_policy_fail_fast_finalises_on_the_first_failure(store: ContractStore) -> None:
    log = new_run(store, _two_branches())
    worker = FakeWorker(store, log, handlers={"a": lambda i: Fail("boom"), "b": lambda i: Hold()})
    worker.drain()
    record = run_record(store, "run-1")
    assert (record.status, record.error) == (RunStatus.FAILED, "boom")
    # b was still running: cancelled by the terminal transition.
    assert only_task(store, "run-1", 1).status is TaskStatus.CANCELLED
    assert launch_of(store, "run-1", 2) is None
    assert launch_of(store, "run-1", 3) is None
    assert log.kinds() == ["failed"]


def test_policy_fail_fast_crash_finalises_crashed(store: ContractStore) -> None:
    log = new_run(store, _two_branches())
    FakeWorker(store, log, handlers={"a": lambda i: Crash("lost")}).drain()
    record = run_record(store, "run-1")
    assert (record.status, record.error) == (RunStatus.CRASHED, "lost")
    assert log.kinds() == ["crashed"]


# --- stop_on_first_failure ------------------------------------------------------------


def test_policy_stop_on_first_failure_lets_running_tasks_finish(store: ContractStore) -> None:
    log = new_run(store, _two_branches(), failure_policy=FailurePolicy.STOP_ON_FIRST_FAILURE)
    failing, running = only_task(store, "run-1", 0), only_task(store, "run-1", 1)
    claim(store, failing)
    claim(store, running)
    on_task_failed(
        store,
        task_id=failing.task_id,
        expected_attempt_id=failing.attempt_id,
        error_message="boom",
        callbacks=log.callbacks,
    )
    # The running task finishes before the run is closed.
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert task(store, running.task_id).status is TaskStatus.RUNNING
    on_task_complete(
        store,
        task_id=running.task_id,
        expected_attempt_id=running.attempt_id,
        outputs=emit("b-out"),
        callbacks=log.callbacks,
    )
    assert task(store, running.task_id).status is TaskStatus.COMPLETED
    assert store.get_output_ids("run-1", 1) == ("b-out",)
    # ... but nothing new was launched after the failure.
    assert launch_of(store, "run-1", 3) is None
    assert launch_of(store, "run-1", 2) is None
    record = run_record(store, "run-1")
    assert (record.status, record.error) == (RunStatus.FAILED, "boom")
    assert log.kinds() == ["failed"]


def test_policy_stop_on_first_failure_finalises_when_nothing_runs(store: ContractStore) -> None:
    log = new_run(store, [root("a")], failure_policy=FailurePolicy.STOP_ON_FIRST_FAILURE)
    FakeWorker(store, log, handlers={"a": lambda i: Fail("boom")}).drain()
    assert store.get_run_status("run-1") is RunStatus.FAILED
    assert log.kinds() == ["failed"]


def test_policy_stop_on_first_failure_cancels_waiting_tasks(store: ContractStore) -> None:
    log = new_run(store, _two_branches(), failure_policy=FailurePolicy.STOP_ON_FIRST_FAILURE)
    worker = FakeWorker(store, log, handlers={"a": lambda i: Wait("w"), "b": lambda i: Fail("x")})
    worker.drain()
    waiting = only_task(store, "run-1", 0)
    assert store.get_run_status("run-1") is RunStatus.FAILED
    assert waiting.status is TaskStatus.CANCELLED
    assert (
        resume_task(
            store,
            waiting.task_id,
            "w",
            expected_attempt_id=waiting.attempt_id,
            expected_generation=waiting.generation,
        )
        is None
    )


# --- continue_others ----------------------------------------------------------------------


def test_policy_continue_others_runs_independent_branches(store: ContractStore) -> None:
    log = new_run(store, _two_branches(), failure_policy=FailurePolicy.CONTINUE_OTHERS)
    worker = FakeWorker(store, log, handlers={"a": lambda i: Fail("boom")})
    worker.drain()
    blocked = launch_of(store, "run-1", 2)
    assert blocked is not None
    assert blocked.disposition is NodeDisposition.UPSTREAM_FAILED
    assert blocked.task_ids == ()
    # The independent branch ran to the end.
    assert only_task(store, "run-1", 3).status is TaskStatus.COMPLETED
    record = run_record(store, "run-1")
    assert record.status is RunStatus.FAILED
    assert record.error == "boom"
    assert log.kinds() == ["failed"]


def test_policy_continue_others_waits_until_nothing_can_progress(store: ContractStore) -> None:
    log = new_run(store, _two_branches(), failure_policy=FailurePolicy.CONTINUE_OTHERS)
    failing, other = only_task(store, "run-1", 0), only_task(store, "run-1", 1)
    claim(store, failing)
    claim(store, other)
    on_task_failed(
        store,
        task_id=failing.task_id,
        expected_attempt_id=failing.attempt_id,
        error_message="boom",
        callbacks=log.callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    on_task_complete(
        store,
        task_id=other.task_id,
        expected_attempt_id=other.attempt_id,
        outputs=emit("b-out"),
        callbacks=log.callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert len(store.list_deliveries("run-1")) >= 1  # d was launched
    FakeWorker(store, log).drain()
    assert store.get_run_status("run-1") is RunStatus.FAILED
    assert log.kinds() == ["failed"]


def test_policy_continue_others_descendants_of_a_join_are_upstream_failed(
    store: ContractStore,
) -> None:
    nodes = [
        root("a"),
        root("b"),
        child("j", "a", "b", mode=InputMode.ALL),
        child("k", "j", mode=InputMode.ALL),
    ]
    log = new_run(store, nodes, failure_policy=FailurePolicy.CONTINUE_OTHERS)
    FakeWorker(store, log, handlers={"b": lambda i: Fail("boom")}).drain()
    for index in (2, 3):
        launch = launch_of(store, "run-1", index)
        assert launch is not None
        assert launch.disposition is NodeDisposition.UPSTREAM_FAILED
    assert only_task(store, "run-1", 0).status is TaskStatus.COMPLETED
    assert store.get_run_status("run-1") is RunStatus.FAILED
    # The failed node and its descendants are retryable as usual.
    result = retry_run(store, "run-1")
    assert result.affected_nodes == (1, 2, 3)


def test_policy_continue_others_completes_when_nothing_failed(store: ContractStore) -> None:
    log = new_run(store, _two_branches(), failure_policy=FailurePolicy.CONTINUE_OTHERS)
    FakeWorker(store, log).drain()
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert log.kinds() == ["completed"]


# --- cancel_run --------------------------------------------------------------------------


def test_cancel_run_cancels_a_pending_run(store: ContractStore) -> None:
    log = new_run(store, [root("a")], start=False)
    assert cancel_run(store, "run-1", callbacks=log.callbacks) is True
    assert store.get_run_status("run-1") is RunStatus.CANCELLED
    assert log.kinds() == ["cancelled"]


def test_cancel_run_cancels_unfinished_work_in_one_commit(store: ContractStore) -> None:
    log = new_run(store, [root("a"), root("b"), root("c"), root("d")])
    worker = FakeWorker(
        store,
        log,
        handlers={"a": lambda i: Wait("w"), "b": lambda i: Hold(), "d": lambda i: Hold()},
    )
    # Drain only a, b and c; d stays QUEUED.
    for delivery in store.list_deliveries("run-1"):
        if delivery.node_index != 3:
            worker.process(delivery)
    statuses = [only_task(store, "run-1", i).status for i in range(4)]
    assert statuses == [
        TaskStatus.WAITING,
        TaskStatus.RUNNING,
        TaskStatus.COMPLETED,
        TaskStatus.QUEUED,
    ]
    assert cancel_run(store, "run-1", callbacks=log.callbacks, reason="user") is True
    record = run_record(store, "run-1")
    assert (record.status, record.error) == (RunStatus.CANCELLED, "user")
    statuses = [only_task(store, "run-1", i).status for i in range(4)]
    assert statuses == [
        TaskStatus.CANCELLED,
        TaskStatus.CANCELLED,
        TaskStatus.COMPLETED,
        TaskStatus.CANCELLED,
    ]
    assert store.list_deliveries("run-1") == []
    waiting = only_task(store, "run-1", 0)
    assert waiting.active_wait_id is None
    assert (
        resume_task(
            store,
            waiting.task_id,
            "w",
            expected_attempt_id=waiting.attempt_id,
            expected_generation=waiting.generation,
        )
        is None
    )
    assert record.settled_nodes == 1
    assert log.kinds() == ["cancelled"]


def test_cancel_run_reports_only_the_transition_it_made(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    assert cancel_run(store, "run-1", callbacks=log.callbacks)
    assert cancel_run(store, "run-1", callbacks=log.callbacks) is False
    assert cancel_run(store, "missing", callbacks=log.callbacks) is False
    assert log.kinds() == ["cancelled"]
    done = CallbackLog()
    new_run(store, [root("a")], "run-2", log=done)
    FakeWorker(store, done).drain("run-2")
    assert cancel_run(store, "run-2", callbacks=done.callbacks) is False
    assert store.get_run_status("run-2") is RunStatus.COMPLETED
    # callbacks are optional
    new_run(store, [root("a")], "run-3")
    assert cancel_run(store, "run-3") is True
    assert done.kinds() == ["completed"]
