"""Contract tests: attempts, retry reservations, lost deliveries, dead-letter
crashes, wait responses, node re-runs, run listing and per-node routing.

Like the queue contract these tests build stores through the backend's
``make_store(**settings)`` fixture (``clock``, ``max_deliveries``, ...) and
use the fake ``queue_clock`` of :mod:`dagwerk.testing.contract_queue`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from dagwerk.constants import MAX_PIPELINE_NAME_LENGTH, FailurePolicy, RunStatus, TaskStatus
from dagwerk.errors import DagwerkError
from dagwerk.execution import claim_task
from dagwerk.json import FrozenDict
from dagwerk.models import DagNode, RetryPolicySpec
from dagwerk.orchestrator import on_task_complete, reconcile_run, settle_crashed_task
from dagwerk.retry import RetryRejectedError, rerun_nodes
from dagwerk.store import (
    InvalidStoreValueError,
    LeasedDelivery,
    RerunRefusedError,
    TaskAttemptRef,
)
from dagwerk.testing.contract_queue import FakeClock, QueueContractStore
from dagwerk.testing.helpers import CallbackLog, chain, emit, new_run, only_task, root, task
from dagwerk.waiting import resume_task, wait_task

__all__ = [
    "test_at_01_attempt_numbers_and_history",
    "test_at_02_failure_with_retry_is_one_commit_with_delayed_delivery",
    "test_at_03_failure_with_retry_is_fenced",
    "test_at_04_recovery_carries_lost_deliveries_to_the_dead_letter_queue",
    "test_at_05_dead_letter_crash_follows_fail_fast",
    "test_at_06_dead_letter_crash_under_continue_others_and_reinject",
    "test_at_07_resume_stores_the_response_once",
    "test_at_08_rerun_reopens_a_completed_run_from_the_named_nodes",
    "test_at_09_rerun_refused_while_an_affected_task_runs",
    "test_at_10_rerun_rejects_bad_requests",
    "test_at_11_list_runs_newest_first_with_times",
    "test_at_12_node_queue_and_priority_route_deliveries",
    "test_at_13_dequeue_waits_and_wakes_on_enqueue",
    "test_at_14_a_run_records_its_pipeline_name",
    "test_at_15_attempts_record_when_they_started_and_settled",
]


def _lease(store: QueueContractStore, worker: str = "w1", **kw: object) -> list[LeasedDelivery]:
    kw.setdefault("lease_seconds", 30.0)
    return store.dequeue(worker, limit=10, **kw)  # type: ignore[arg-type]


def _take_and_claim(store: QueueContractStore, worker: str = "w1") -> LeasedDelivery:
    (row,) = _lease(store, worker)
    assert claim_task(
        store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=row.generation
    )
    return row


def test_at_01_attempt_numbers_and_history(qstore: QueueContractStore) -> None:
    new_run(qstore, [root("a")])
    first = only_task(qstore, "run-1", 0)
    assert first.attempt_number == 1
    (only,) = qstore.list_attempts(first.task_id)
    assert (only.attempt_id, only.number, only.status) == (first.attempt_id, 1, None)
    _take_and_claim(qstore, "w1")
    new_attempt = qstore.try_fail_task_with_retry(
        first.task_id, "boom", expected_attempt_id=first.attempt_id, available_at=0.0
    )
    assert new_attempt is not None
    second = task(qstore, first.task_id)
    assert (second.attempt_id, second.attempt_number) == (new_attempt, 2)
    old, current = qstore.list_attempts(first.task_id)
    assert (old.number, old.status, old.error, old.worker_id) == (
        1,
        TaskStatus.FAILED,
        "boom",
        "w1",
    )
    assert (current.attempt_id, current.number, current.status) == (new_attempt, 2, None)
    assert qstore.list_attempts("no-such-task") == []


def test_at_02_failure_with_retry_is_one_commit_with_delayed_delivery(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    log = new_run(qstore, [root("a")])
    row = _take_and_claim(qstore)
    new_attempt = qstore.try_fail_task_with_retry(
        row.task_id, "flaky", expected_attempt_id=row.attempt_id, available_at=queue_clock.now + 5
    )
    assert new_attempt is not None
    # The run never saw a FAILED task: a finaliser has nothing to close.
    reconcile_run(qstore, "run-1", callbacks=log.callbacks)
    assert qstore.get_run_status("run-1") is RunStatus.RUNNING
    assert task(qstore, row.task_id).status is TaskStatus.QUEUED
    assert qstore.get_run_activity("run-1").failed_tasks == ()  # type: ignore[attr-defined]
    # The old lease holder acks its row; the new attempt's row waits for its time.
    qstore.ack(row.delivery_id, "w1")
    assert _lease(qstore) == []
    queue_clock.advance(5.0)
    (retry_row,) = _lease(qstore)
    assert retry_row.attempt_id == new_attempt
    # Exactly one reservation: a repeat by the old attempt changes nothing.
    assert (
        qstore.try_fail_task_with_retry(
            row.task_id, "flaky", expected_attempt_id=row.attempt_id, available_at=0.0
        )
        is None
    )
    assert task(qstore, row.task_id).attempt_id == new_attempt


def test_at_03_failure_with_retry_is_fenced(qstore: QueueContractStore) -> None:
    new_run(qstore, [root("a")])
    record = only_task(qstore, "run-1", 0)
    # Not RUNNING yet: refused.
    assert (
        qstore.try_fail_task_with_retry(
            record.task_id, "x", expected_attempt_id=record.attempt_id, available_at=0.0
        )
        is None
    )
    row = _take_and_claim(qstore)
    assert (
        qstore.try_fail_task_with_retry(
            row.task_id, "x", expected_attempt_id="other", available_at=0.0
        )
        is None
    )
    with pytest.raises(InvalidStoreValueError):
        qstore.try_fail_task_with_retry(
            row.task_id, "x", expected_attempt_id=row.attempt_id, available_at=float("nan")
        )
    assert qstore.try_cancel_run("run-1")
    # After cancellation the reservation is rejected and the attempt unchanged (WK-14).
    assert (
        qstore.try_fail_task_with_retry(
            row.task_id, "x", expected_attempt_id=row.attempt_id, available_at=0.0
        )
        is None
    )
    after = task(qstore, row.task_id)
    assert (after.attempt_id, after.status) == (row.attempt_id, TaskStatus.CANCELLED)


def test_at_04_recovery_carries_lost_deliveries_to_the_dead_letter_queue(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock, max_deliveries=2)
    new_run(store, [root("a")])
    executions = 0
    for _ in range(5):
        rows = _lease(store, lease_seconds=1.0)
        if not rows:
            break
        (row,) = rows
        current = task(store, row.task_id)
        if current.status is TaskStatus.RUNNING and current.attempt_id == row.attempt_id:
            # The previous holder died: the new lease holder recovers.
            recovered = store.try_recover_task(
                row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0
            )
            assert recovered is not None
            store.ack(row.delivery_id, "w1")
            continue
        assert claim_task(
            store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0
        )
        executions += 1
        queue_clock.advance(1.0)  # the worker dies; its lease runs out
    # Two executions (max_deliveries), then the dead-letter queue.
    assert executions == 2
    (letter,) = store.list_dead_letters("run-1")
    assert letter.reason == "max_deliveries"
    crashed = only_task(store, "run-1", 0)
    assert crashed.status is TaskStatus.CRASHED
    assert crashed.attempt_number == 2
    assert store.take_dead_lettered() == [TaskAttemptRef(crashed.task_id, crashed.attempt_id)]
    assert [a.status for a in store.list_attempts(crashed.task_id)] == [
        TaskStatus.CRASHED,
        TaskStatus.CRASHED,
    ]


def _dead_letter_first_root(
    make_store: Callable[..., QueueContractStore],
    clock: FakeClock,
    policy: FailurePolicy,
) -> tuple[QueueContractStore, CallbackLog]:
    store = make_store(clock=clock, max_deliveries=1)
    log = new_run(store, [root("a"), root("b")], failure_policy=policy)
    rows = _lease(store, lease_seconds=1.0)
    # Node b completes; node a's worker dies after claiming.
    for row in rows:
        assert claim_task(
            store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0
        )
        if row.node_index == 1:
            on_task_complete(
                store,
                task_id=row.task_id,
                expected_attempt_id=row.attempt_id,
                outputs=emit("b-1"),
                callbacks=log.callbacks,
            )
            store.ack(row.delivery_id, "w1")
    clock.advance(1.0)
    assert _lease(store) == []
    return store, log


def test_at_05_dead_letter_crash_follows_fail_fast(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store, log = _dead_letter_first_root(make_store, queue_clock, FailurePolicy.FAIL_FAST)
    (ref,) = store.take_dead_lettered()
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert settle_crashed_task(store, ref.task_id, callbacks=log.callbacks) is True
    assert store.get_run_status("run-1") is RunStatus.CRASHED
    assert "dead-lettered: max_deliveries" in (store.get_run("run-1").error or "")  # type: ignore[union-attr]
    # Repeats and unknown tasks change nothing.
    assert settle_crashed_task(store, ref.task_id, callbacks=log.callbacks) is False
    assert settle_crashed_task(store, "nope", callbacks=log.callbacks) is False


def test_at_06_dead_letter_crash_under_continue_others_and_reinject(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store, log = _dead_letter_first_root(make_store, queue_clock, FailurePolicy.CONTINUE_OTHERS)
    (ref,) = store.take_dead_lettered()
    (letter,) = store.list_dead_letters()
    # Re-injection from CRASHED gives a fresh attempt with a fresh delivery budget.
    new_attempt = store.reinject_dead_letter(letter.dead_letter_id)
    assert new_attempt is not None
    fresh = task(store, ref.task_id)
    assert (fresh.status, fresh.attempt_number) == (TaskStatus.QUEUED, 2)
    row = _take_and_claim(store)
    assert row.attempt_id == new_attempt and row.delivery_count == 1
    on_task_complete(
        store,
        task_id=row.task_id,
        expected_attempt_id=row.attempt_id,
        outputs=emit("a-1"),
        callbacks=log.callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    # A settle for a task that is no longer CRASHED does nothing.
    assert settle_crashed_task(store, ref.task_id, callbacks=log.callbacks) is False


def test_at_07_resume_stores_the_response_once(qstore: QueueContractStore) -> None:
    new_run(qstore, [root("a")])
    row = _take_and_claim(qstore)
    assert wait_task(
        qstore, row.task_id, "approve", expected_attempt_id=row.attempt_id, expected_generation=0
    )
    assert qstore.get_wait_response(row.task_id, "approve") is None
    resumed = resume_task(
        qstore,
        row.task_id,
        "approve",
        expected_attempt_id=row.attempt_id,
        expected_generation=0,
        response={"ok": True, "by": ["ann"]},
    )
    assert resumed is not None
    stored = qstore.get_wait_response(row.task_id, "approve")
    assert stored == FrozenDict({"ok": True, "by": ("ann",)})
    again = qstore.try_resume_task(
        row.task_id,
        "approve",
        expected_attempt_id=row.attempt_id,
        expected_generation=0,
        response={"ok": False},
    )
    assert again == resumed
    assert qstore.get_wait_response(row.task_id, "approve") == stored
    assert qstore.get_wait_response(row.task_id, "other") is None
    current = task(qstore, row.task_id)
    assert (current.attempt_number, current.resumed_from_wait_id) == (2, "approve")
    first, _ = qstore.list_attempts(row.task_id)
    assert first.status is TaskStatus.WAITING


def _complete_all(store: QueueContractStore, log: CallbackLog) -> None:
    for _ in range(20):
        rows = _lease(store)
        if not rows:
            return
        for row in rows:
            assert claim_task(
                store,
                row.task_id,
                expected_attempt_id=row.attempt_id,
                expected_generation=row.generation,
            )
            on_task_complete(
                store,
                task_id=row.task_id,
                expected_attempt_id=row.attempt_id,
                outputs=emit(f"{row.task_id}:{row.attempt_id}"),
                callbacks=log.callbacks,
            )
            store.ack(row.delivery_id, "w1")


def test_at_08_rerun_reopens_a_completed_run_from_the_named_nodes(
    qstore: QueueContractStore,
) -> None:
    log = new_run(qstore, chain(3))
    _complete_all(qstore, log)
    before = qstore.get_run("run-1")
    assert before is not None and before.status is RunStatus.COMPLETED
    assert before.finished_at is not None
    kept = qstore.get_output_ids("run-1", 0)
    result = rerun_nodes(qstore, "run-1", [1])
    assert result.affected_nodes == (1, 2)
    assert dict(result.generations) == {1: 1, 2: 1}
    assert result.retry_count == 1
    after = qstore.get_run("run-1")
    assert after is not None and after.status is RunStatus.RUNNING and after.finished_at is None
    assert qstore.get_output_ids("run-1", 0) == kept
    assert qstore.get_output_ids("run-1", 1) == ()
    reconcile_run(qstore, "run-1", callbacks=log.callbacks)
    _complete_all(qstore, log)
    assert qstore.get_run_status("run-1") is RunStatus.COMPLETED
    assert only_task(qstore, "run-1", 2).generation == 1


def test_at_09_rerun_refused_while_an_affected_task_runs(qstore: QueueContractStore) -> None:
    new_run(qstore, chain(2))
    _take_and_claim(qstore)
    with pytest.raises(RerunRefusedError) as caught:
        qstore.try_rerun_nodes("run-1", (0,))
    assert caught.value.code == "rerun_running"
    assert only_task(qstore, "run-1", 0).status is TaskStatus.RUNNING
    assert qstore.get_run("run-1").retry_count == 0  # type: ignore[union-attr]


def test_at_10_rerun_rejects_bad_requests(qstore: QueueContractStore) -> None:
    new_run(qstore, chain(2))
    assert qstore.try_rerun_nodes("run-1", ()) is None
    assert qstore.try_rerun_nodes("run-1", (5,)) is None
    assert qstore.try_rerun_nodes("missing", (0,)) is None
    new_run(qstore, chain(2), "pending-run", start=False)
    assert qstore.try_rerun_nodes("pending-run", (0,)) is None
    with pytest.raises(RetryRejectedError):
        rerun_nodes(qstore, "run-1", [7])
    with pytest.raises(InvalidStoreValueError):
        rerun_nodes(qstore, "run-1", [])
    # A queued (not running) task may be reset while the run is RUNNING.
    result = rerun_nodes(qstore, "run-1", [0])
    assert result.affected_nodes == (0, 1)
    assert qstore.get_run_status("run-1") is RunStatus.RUNNING


def test_at_11_list_runs_newest_first_with_times(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock)
    for n in range(3):
        new_run(store, [root("a")], f"run-{n}")
        queue_clock.advance(1.0)
    assert store.try_cancel_run("run-1")
    runs = store.list_runs()
    assert [r.run_id for r in runs] == ["run-2", "run-1", "run-0"]
    assert [r.created_at for r in runs] == [1002.0, 1001.0, 1000.0]
    assert runs[1].finished_at == queue_clock.now and runs[0].finished_at is None
    assert [r.run_id for r in store.list_runs(status=RunStatus.CANCELLED)] == ["run-1"]
    assert [r.run_id for r in store.list_runs(limit=2)] == ["run-2", "run-1"]
    with pytest.raises(InvalidStoreValueError):
        store.list_runs(limit=0)


def test_at_12_node_queue_and_priority_route_deliveries(qstore: QueueContractStore) -> None:
    nodes = [
        root("plain"),
        DagNode(slug="gpu", plugin="gpu", queue="gpu", priority=3),
        DagNode(slug="urgent", plugin="urgent", priority=9),
    ]
    new_run(qstore, nodes)
    (gpu,) = qstore.dequeue("w1", limit=10, lease_seconds=5.0, queues=["gpu"])
    assert (gpu.node_index, gpu.queue, gpu.priority) == (1, "gpu", 3)
    first, second = qstore.dequeue("w1", limit=10, lease_seconds=5.0, queues=["default"])
    assert (first.node_index, first.priority) == (2, 9)
    assert (second.node_index, second.priority) == (0, 0)
    # Node settings are stored with the run and survive a read-back.
    stored = qstore.get_run_nodes("run-1")
    assert stored is not None and stored[1].queue == "gpu"
    spec = RetryPolicySpec(max_attempts=3, retry_on=("TimeoutError",))
    with_retry = DagNode(slug="r", plugin="r", retry=spec, timeout_seconds=2.5)
    assert qstore.create_run("run-2", [with_retry])
    (read_back,) = qstore.get_run_nodes("run-2") or []
    assert read_back.retry == spec and read_back.timeout_seconds == 2.5


def test_at_13_dequeue_waits_and_wakes_on_enqueue(qstore: QueueContractStore) -> None:
    with pytest.raises(DagwerkError):
        qstore.dequeue("w1", limit=1, lease_seconds=5.0, wait_seconds=-1.0)
    started = time.monotonic()
    assert qstore.dequeue("w1", limit=1, lease_seconds=5.0, wait_seconds=0.05) == []
    assert time.monotonic() - started >= 0.04
    got: list[LeasedDelivery] = []
    waiting = threading.Event()

    def consume() -> None:
        waiting.set()
        got.extend(qstore.dequeue("w1", limit=1, lease_seconds=5.0, wait_seconds=10.0))

    thread = threading.Thread(target=consume)
    thread.start()
    assert waiting.wait(5.0)
    began = time.monotonic()
    new_run(qstore, [root("a")])
    thread.join(10.0)
    assert not thread.is_alive()
    assert len(got) == 1
    # Woken by the enqueue, long before the 10 s patience ran out.
    assert time.monotonic() - began < 5.0


def test_at_14_a_run_records_its_pipeline_name(qstore: QueueContractStore) -> None:
    assert qstore.create_run("run-named", [root("a")], pipeline="orders nightly")
    assert qstore.create_run("run-bare", [root("a")])
    named = qstore.get_run("run-named")
    bare = qstore.get_run("run-bare")
    assert named is not None and named.pipeline == "orders nightly"
    assert bare is not None and bare.pipeline is None
    listed = {r.run_id: r.pipeline for r in qstore.list_runs()}
    assert listed == {"run-named": "orders nightly", "run-bare": None}
    for bad in (7, "x" * (MAX_PIPELINE_NAME_LENGTH + 1), "a\x00b"):
        with pytest.raises(InvalidStoreValueError):
            qstore.create_run("run-bad", [root("a")], pipeline=bad)  # type: ignore[arg-type]
    assert qstore.get_run("run-bad") is None


def _times(store: QueueContractStore, task_id: str) -> list[tuple[float | None, float | None]]:
    return [(a.started_at, a.finished_at) for a in store.list_attempts(task_id)]


def test_at_15_attempts_record_when_they_started_and_settled(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    """An attempt's ``started_at`` is the store time of its claim and its
    ``finished_at`` the time it settled; each attempt keeps its own across a
    retry, and the task's record shows its current attempt's."""
    new_run(qstore, [root("a"), root("b"), root("c"), root("d"), root("e")])
    ids = {slug: only_task(qstore, "run-1", index).task_id for index, slug in enumerate("abcde")}
    for task_id in ids.values():
        record = task(qstore, task_id)
        assert (record.started_at, record.finished_at) == (None, None)
        assert _times(qstore, task_id) == [(None, None)]
    rows = {row.task_id: row for row in _lease(qstore)}
    assert set(rows) == set(ids.values())

    def claim(slug: str) -> None:
        row = rows[ids[slug]]
        assert claim_task(
            qstore, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0
        )

    queue_clock.advance(10.0)  # 1010: a's first attempt starts
    claim("a")
    record = task(qstore, ids["a"])
    assert (record.started_at, record.finished_at) == (1010.0, None)
    assert _times(qstore, ids["a"]) == [(1010.0, None)]
    queue_clock.advance(5.0)  # 1015: it fails and a retry is reserved
    first = rows[ids["a"]].attempt_id
    retry = qstore.try_fail_task_with_retry(
        ids["a"], "flaky", expected_attempt_id=first, available_at=queue_clock.now
    )
    assert retry is not None
    record = task(qstore, ids["a"])
    assert (record.started_at, record.finished_at) == (None, None)
    assert _times(qstore, ids["a"]) == [(1010.0, 1015.0), (None, None)]

    queue_clock.advance(1.0)  # 1016: b starts, and waits at 1017
    claim("b")
    queue_clock.advance(1.0)
    assert wait_task(
        qstore,
        ids["b"],
        "approve",
        expected_attempt_id=rows[ids["b"]].attempt_id,
        expected_generation=0,
    )
    record = task(qstore, ids["b"])
    assert (record.status, record.started_at, record.finished_at) == (
        TaskStatus.WAITING,
        1016.0,
        1017.0,
    )

    queue_clock.advance(1.0)  # 1018: d starts, and crashes at 1019
    claim("d")
    queue_clock.advance(1.0)
    assert qstore.mark_task_crashed(
        ids["d"], "worker died", expected_attempt_id=rows[ids["d"]].attempt_id
    )
    assert _times(qstore, ids["d"]) == [(1018.0, 1019.0)]

    claim("e")  # 1019: e starts; its worker is lost and it is recovered at 1019.5
    queue_clock.advance(0.5)
    assert qstore.try_recover_task(
        ids["e"], expected_attempt_id=rows[ids["e"]].attempt_id, expected_generation=0
    )
    assert _times(qstore, ids["e"]) == [(1019.0, 1019.5), (None, None)]
    qstore.ack(rows[ids["e"]].delivery_id, "w1")

    queue_clock.advance(0.5)  # 1020: a's second attempt starts, completes at 1022
    again = {row.task_id: row for row in _lease(qstore)}[ids["a"]]
    assert again.attempt_id == retry
    assert claim_task(qstore, ids["a"], expected_attempt_id=retry, expected_generation=0)
    queue_clock.advance(2.0)
    assert qstore.try_complete_task(ids["a"], (), expected_attempt_id=retry) is not None
    record = task(qstore, ids["a"])
    assert (record.status, record.started_at, record.finished_at) == (
        TaskStatus.COMPLETED,
        1020.0,
        1022.0,
    )
    attempts = qstore.list_attempts(ids["a"])
    assert [(a.attempt_id, a.status) for a in attempts] == [
        (first, TaskStatus.FAILED),
        (retry, TaskStatus.COMPLETED),
    ]
    assert _times(qstore, ids["a"]) == [(1010.0, 1015.0), (1020.0, 1022.0)]

    queue_clock.advance(8.0)  # 1030: cancelling the run settles c, never started
    assert qstore.try_cancel_run("run-1")
    record = task(qstore, ids["c"])
    assert (record.status, record.started_at, record.finished_at) == (
        TaskStatus.CANCELLED,
        None,
        1030.0,
    )
    # A waiting attempt had settled already: cancelling keeps its time.
    record = task(qstore, ids["b"])
    assert (record.status, record.started_at, record.finished_at) == (
        TaskStatus.CANCELLED,
        1016.0,
        1017.0,
    )
    # Finished tasks keep theirs; the recovered attempt's replacement never ran.
    assert _times(qstore, ids["a"]) == [(1010.0, 1015.0), (1020.0, 1022.0)]
    assert _times(qstore, ids["d"]) == [(1018.0, 1019.0)]
    assert _times(qstore, ids["e"]) == [(1019.0, 1019.5), (None, 1030.0)]
