"""Contract tests: the durable queue (QU-01..QU-14) of ``DagQueueStore``.

Time matters here (leases, delays), so these tests build their stores
through a ``make_store`` fixture that the backend's test module provides:
``make_store(**settings)`` returns a fresh, empty store implementing the
contract-suite protocols and ``DagQueueStore``, constructed with the given
keyword settings (``clock``, ``max_deliveries``, ``default_queue``,
``default_priority``). A fake clock replaces sleeping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import pytest

from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.execution import claim_task
from dagwerk.orchestrator import on_task_complete
from dagwerk.store import DagQueueStore, InvalidStoreValueError, LeasedDelivery, TaskAttemptRef
from dagwerk.testing.helpers import (
    ContractStore,
    chain,
    emit,
    new_run,
    only_task,
    root,
    task,
)

__all__ = [
    "FakeClock",
    "QueueContractStore",
    "qstore",
    "queue_clock",
    "test_qu_01_dequeue_leases_up_to_limit_and_hides_leased_rows",
    "test_qu_02_expired_lease_makes_the_row_deliverable_again",
    "test_qu_03_only_the_lease_holder_acks",
    "test_qu_04_nack_delays_redelivery_and_keeps_the_count",
    "test_qu_05_extend_lease_only_by_the_live_lease_holder",
    "test_qu_06_row_over_max_deliveries_is_dead_lettered_not_delivered",
    "test_qu_07_poison_nack_dead_letters_with_reason",
    "test_qu_08_reinject_creates_one_fresh_attempt",
    "test_qu_09_reinject_refused_when_the_run_is_over",
    "test_qu_10_queue_names_filter_and_store_defaults",
    "test_qu_11_rows_are_taken_in_availability_order",
    "test_qu_12_invalid_queue_requests_raise",
    "test_qu_13_worker_cycle_runs_a_chain_to_completion",
    "test_qu_14_cancelled_run_leaves_nothing_to_dequeue",
    "test_qu_15_running_tasks_without_a_row_are_the_sweeps_candidates",
]


class QueueContractStore(ContractStore, DagQueueStore, Protocol):
    """A contract-suite store that also implements the durable queue."""


class FakeClock:
    """A settable clock: ``clock()`` returns the current fake time."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def queue_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def qstore(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> QueueContractStore:
    return make_store(clock=queue_clock)


def _lease(store: QueueContractStore, worker: str = "w1", **kw: object) -> list[LeasedDelivery]:
    limit = kw.pop("limit", 10)
    lease = kw.pop("lease_seconds", 30.0)
    assert not kw
    return store.dequeue(worker, limit=limit, lease_seconds=lease)  # type: ignore[arg-type]


def test_qu_01_dequeue_leases_up_to_limit_and_hides_leased_rows(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    new_run(qstore, [root("a"), root("b"), root("c")])
    first = _lease(qstore, "w1", limit=2)
    assert len(first) == 2
    assert all(row.delivery_count == 1 and row.worker_id == "w1" for row in first)
    assert all(row.lease_expires_at == queue_clock.now + 30.0 for row in first)
    second = _lease(qstore, "w2", limit=5)
    assert len(second) == 1
    assert {r.delivery_id for r in first}.isdisjoint({r.delivery_id for r in second})
    assert _lease(qstore, "w3") == []
    # Leased rows are still outbox rows until acked.
    assert len(qstore.list_deliveries("run-1")) == 3
    by_task = {r.task_id: r for r in first + second}
    for record in qstore.list_tasks("run-1"):
        assert by_task[record.task_id].attempt_id == record.attempt_id


def test_qu_02_expired_lease_makes_the_row_deliverable_again(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    new_run(qstore, [root("a")])
    (row,) = _lease(qstore, "w1", lease_seconds=10.0)
    queue_clock.advance(9.9)
    assert _lease(qstore, "w2") == []
    queue_clock.advance(0.1)
    (again,) = _lease(qstore, "w2")
    assert again.delivery_id == row.delivery_id
    assert again.delivery_count == 2
    assert again.worker_id == "w2"


def test_qu_03_only_the_lease_holder_acks(qstore: QueueContractStore) -> None:
    new_run(qstore, [root("a")])
    (row,) = _lease(qstore, "w1")
    assert qstore.ack(row.delivery_id, "w2") is False
    assert qstore.ack(row.delivery_id, "w1") is True
    assert qstore.ack(row.delivery_id, "w1") is False
    assert qstore.list_deliveries("run-1") == []
    assert qstore.ack("no-such-delivery", "w1") is False


def test_qu_04_nack_delays_redelivery_and_keeps_the_count(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    new_run(qstore, [root("a")])
    (row,) = _lease(qstore, "w1")
    assert qstore.nack(row.delivery_id, "w2", delay=5.0) is False
    assert qstore.nack(row.delivery_id, "w1", delay=5.0) is True
    assert _lease(qstore, "w1") == []
    queue_clock.advance(5.0)
    (again,) = _lease(qstore, "w2")
    assert again.delivery_id == row.delivery_id
    assert again.delivery_count == 2
    # An immediate nack makes the row deliverable at once.
    assert qstore.nack(again.delivery_id, "w2") is True
    assert [r.delivery_id for r in _lease(qstore, "w3")] == [row.delivery_id]


def test_qu_05_extend_lease_only_by_the_live_lease_holder(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    new_run(qstore, [root("a")])
    (row,) = _lease(qstore, "w1", lease_seconds=10.0)
    assert qstore.extend_lease(row.delivery_id, "w2", 60.0) is False
    queue_clock.advance(8.0)
    assert qstore.extend_lease(row.delivery_id, "w1", 60.0) is True
    queue_clock.advance(30.0)  # past the original lease, inside the extension
    assert _lease(qstore, "w2") == []
    queue_clock.advance(31.0)  # the extension has run out
    assert qstore.extend_lease(row.delivery_id, "w1", 60.0) is False
    (taken,) = _lease(qstore, "w2")
    assert taken.delivery_id == row.delivery_id
    # The old holder lost the row: it can neither ack nor nack it.
    assert qstore.ack(row.delivery_id, "w1") is False
    assert qstore.nack(row.delivery_id, "w1") is False


def test_qu_06_row_over_max_deliveries_is_dead_lettered_not_delivered(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock, max_deliveries=2)
    new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)
    for count in (1, 2):
        (row,) = _lease(store, "w1", lease_seconds=1.0)
        assert row.delivery_count == count
        queue_clock.advance(1.0)
    assert store.list_dead_letters() == []
    assert _lease(store, "w1") == []
    (letter,) = store.list_dead_letters()
    assert letter.reason == "max_deliveries"
    assert letter.delivery_id == row.delivery_id
    assert (letter.task_id, letter.attempt_id) == (record.task_id, record.attempt_id)
    assert letter.delivery_count == 2
    assert letter.dead_at == queue_clock.now
    assert letter.reinjected_attempt_id is None
    assert store.list_deliveries("run-1") == []
    assert store.list_dead_letters("run-1") == [letter]
    assert store.list_dead_letters("other-run") == []
    # The same commit crashed the task; the caller settles the run by policy.
    crashed = task(store, record.task_id)
    assert crashed.status is TaskStatus.CRASHED
    assert crashed.error == "dead-lettered: max_deliveries"
    assert store.take_dead_lettered() == [TaskAttemptRef(record.task_id, record.attempt_id)]
    assert store.take_dead_lettered() == []


def test_qu_07_poison_nack_dead_letters_with_reason(qstore: QueueContractStore) -> None:
    new_run(qstore, [root("a")])
    (row,) = _lease(qstore, "w1")
    assert qstore.nack(row.delivery_id, "w2", poison=True, reason="bad") is False
    assert qstore.nack(row.delivery_id, "w1", poison=True, reason="unparseable input") is True
    (letter,) = qstore.list_dead_letters()
    assert letter.reason == "unparseable input"
    assert letter.delivery_count == 1
    assert _lease(qstore, "w1") == []
    assert qstore.list_deliveries() == []


def test_qu_08_reinject_creates_one_fresh_attempt(qstore: QueueContractStore) -> None:
    new_run(qstore, [root("a")])
    record = only_task(qstore, "run-1", 0)
    (row,) = _lease(qstore, "w1")
    # The worker claimed, then found the input poisonous.
    assert claim_task(
        qstore, record.task_id, expected_attempt_id=record.attempt_id, expected_generation=0
    )
    assert qstore.nack(row.delivery_id, "w1", poison=True, reason="poison")
    (letter,) = qstore.list_dead_letters()
    new_attempt = qstore.reinject_dead_letter(letter.dead_letter_id)
    assert new_attempt is not None and new_attempt != record.attempt_id
    # Guarded: a second (racing or repeated) re-injection does nothing.
    assert qstore.reinject_dead_letter(letter.dead_letter_id) is None
    assert qstore.reinject_dead_letter("no-such-letter") is None
    (marked,) = qstore.list_dead_letters()
    assert marked.reinjected_attempt_id == new_attempt
    current = task(qstore, record.task_id)
    assert (current.status, current.attempt_id) == (TaskStatus.QUEUED, new_attempt)
    (fresh,) = _lease(qstore, "w2")
    assert (fresh.attempt_id, fresh.delivery_count) == (new_attempt, 1)
    assert (
        claim_task(
            qstore, record.task_id, expected_attempt_id=record.attempt_id, expected_generation=0
        )
        is None
    )
    assert claim_task(
        qstore, record.task_id, expected_attempt_id=new_attempt, expected_generation=0
    )


def test_qu_09_reinject_refused_when_the_run_is_over(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock, max_deliveries=1)
    new_run(store, [root("a")])
    _lease(store, "w1", lease_seconds=1.0)
    queue_clock.advance(1.0)
    assert _lease(store, "w1") == []
    (letter,) = store.list_dead_letters()
    assert store.try_cancel_run("run-1") is True
    assert store.reinject_dead_letter(letter.dead_letter_id) is None
    assert store.list_dead_letters()[0].reinjected_attempt_id is None
    assert store.list_deliveries() == []


def test_qu_10_queue_names_filter_and_store_defaults(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock, default_queue="io", default_priority=7)
    new_run(store, [root("a")])
    assert store.dequeue("w1", limit=5, lease_seconds=5.0, queues=["cpu"]) == []
    assert store.dequeue("w1", limit=5, lease_seconds=5.0, queues=[]) == []
    (row,) = store.dequeue("w1", limit=5, lease_seconds=5.0, queues=["cpu", "io"])
    assert (row.queue, row.priority) == ("io", 7)


def test_qu_11_rows_are_taken_in_availability_order(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    new_run(qstore, [root("a"), root("b"), root("c")])
    order = [r.delivery_id for r in _lease(qstore, "w1", limit=3)]
    # Give the first row back later than the others become available again.
    queue_clock.advance(1.0)
    for delivery_id in order[1:]:
        assert qstore.nack(delivery_id, "w1")
    queue_clock.advance(1.0)
    assert qstore.nack(order[0], "w1")
    assert [r.delivery_id for r in _lease(qstore, "w2", limit=3)] == order[1:] + order[:1]


def test_qu_12_invalid_queue_requests_raise(qstore: QueueContractStore) -> None:
    new_run(qstore, [root("a")])
    bad: list[Callable[[], object]] = [
        lambda: qstore.dequeue("", limit=1, lease_seconds=1.0),
        lambda: qstore.dequeue("w", limit=0, lease_seconds=1.0),
        lambda: qstore.dequeue("w", limit=True, lease_seconds=1.0),
        lambda: qstore.dequeue("w", limit=1, lease_seconds=0.0),
        lambda: qstore.dequeue("w", limit=1, lease_seconds=float("nan")),
        lambda: qstore.dequeue("w", limit=1, lease_seconds=1.0, queues="default"),
        lambda: qstore.nack("d", "w", delay=-1.0),
        lambda: qstore.extend_lease("d", "w", 0.0),
    ]
    for call in bad:
        with pytest.raises(InvalidStoreValueError):
            call()
    # Nothing was leased by the refused calls.
    assert len(_lease(qstore, "w")) == 1


def test_qu_13_worker_cycle_runs_a_chain_to_completion(qstore: QueueContractStore) -> None:
    log = new_run(qstore, chain(3))
    done = 0
    while rows := _lease(qstore, "w1", limit=2):
        for row in rows:
            claimed = claim_task(
                qstore,
                row.task_id,
                expected_attempt_id=row.attempt_id,
                expected_generation=row.generation,
            )
            assert claimed is not None
            on_task_complete(
                qstore,
                task_id=row.task_id,
                expected_attempt_id=row.attempt_id,
                outputs=emit(f"out-{row.node_index}"),
                callbacks=log.callbacks,
            )
            # Finalising the run drops its rows, so the last ack may find none.
            acked = qstore.ack(row.delivery_id, "w1")
            assert acked or qstore.get_run_status("run-1") is RunStatus.COMPLETED
            done += 1
    assert done == 3
    assert qstore.get_run_status("run-1") is RunStatus.COMPLETED
    assert qstore.list_deliveries() == []


def test_qu_14_cancelled_run_leaves_nothing_to_dequeue(qstore: QueueContractStore) -> None:
    new_run(qstore, [root("a"), root("b")])
    new_run(qstore, [root("c")], run_id="run-2")
    assert qstore.try_cancel_run("run-1") is True
    rows = _lease(qstore, "w1")
    assert [r.run_id for r in rows] == ["run-2"]


def test_qu_15_running_tasks_without_a_row_are_the_sweeps_candidates(
    qstore: QueueContractStore,
) -> None:
    """``running_without_delivery`` (the idle sweep's read): RUNNING tasks
    whose current attempt has no queue row, in creation order; a leased row
    still reaches its task by redelivery, so such a task is not listed."""
    running = StoreCapabilities.of(qstore).running_tasks
    if running is None:
        pytest.skip("this store offers no such read")
    finder = running.running_without_delivery
    new_run(qstore, [root("a"), root("b"), root("c")])
    rows = {row.task_id: row for row in _lease(qstore)}
    tasks = sorted(rows.values(), key=lambda row: row.task_id)
    for row in tasks:
        assert claim_task(
            qstore, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0
        )
    assert finder("run-1") == []  # every RUNNING task still has its (leased) row
    order = [t.task_id for t in qstore.list_tasks("run-1")]
    first, _, last = (rows[task_id] for task_id in order)
    for row in (last, first):
        assert qstore.ack(row.delivery_id, "w1")
    assert finder("run-1") == [(first.task_id, first.attempt_id), (last.task_id, last.attempt_id)]
    assert qstore.try_complete_task(first.task_id, (), expected_attempt_id=first.attempt_id)
    assert finder("run-1") == [(last.task_id, last.attempt_id)]  # no longer RUNNING
    assert finder("missing") == []
