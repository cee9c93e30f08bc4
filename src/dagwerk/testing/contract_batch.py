"""Contract tests: the batched worker operations of ``BatchQueueStore``.

``claim_deliveries`` is ``dequeue`` followed by one ``try_claim_task`` per
leased row; ``complete_and_ack`` is, per request, ``try_complete_task``
followed by ``ack`` when the completion did not raise. These tests pin that
equivalence on every backend: the records each call returns, the task
states it leaves, and which queue rows it leases, keeps or removes.

Stores come from the backend's ``make_store`` fixture with a fake clock
(see :mod:`dagwerk.testing.contract_queue`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

import pytest

from dagwerk.constants import TaskStatus
from dagwerk.execution import recover_task
from dagwerk.models import DagNode, EmittedOutput
from dagwerk.store import (
    BatchQueueStore,
    ClaimedDelivery,
    CompletionOutcome,
    CompletionRequest,
    DagQueueStore,
    InvalidStoreValueError,
    TaskAttemptRef,
    TaskCompletionResult,
    TaskRecord,
)
from dagwerk.testing.contract_queue import FakeClock
from dagwerk.testing.helpers import (
    ContractStore,
    claim,
    emit,
    fingerprint,
    new_run,
    only_task,
    root,
    task,
)
from dagwerk.waiting import wait_task

__all__ = [
    "BatchContractStore",
    "bq_clock",
    "bq_store",
    "test_bq_01_claim_deliveries_leases_and_claims_up_to_limit",
    "test_bq_02_entries_follow_priority_then_creation_order",
    "test_bq_03_entries_follow_availability_and_count_leases_like_dequeue",
    "test_bq_04_claim_refused_for_a_task_not_queued_keeps_the_lease_and_changes_nothing",
    "test_bq_05_rows_of_stale_attempts_are_leased_but_not_claimed",
    "test_bq_06_rows_of_a_cancelled_run_are_not_leased",
    "test_bq_07_row_past_max_deliveries_is_dead_lettered_not_returned",
    "test_bq_08_nothing_deliverable_returns_empty_at_once",
    "test_bq_09_invalid_requests_raise_typed_errors_and_change_nothing",
    "test_bq_10_claim_deliveries_equals_dequeue_then_try_claim_task",
]


class BatchContractStore(ContractStore, DagQueueStore, BatchQueueStore, Protocol):
    """A contract-suite store with the durable queue and the batched operations."""


@pytest.fixture
def bq_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def bq_store(
    make_store: Callable[..., BatchContractStore], bq_clock: FakeClock
) -> BatchContractStore:
    store = make_store(clock=bq_clock)
    assert isinstance(store, BatchQueueStore), "every shipped store offers the batched operations"
    return store


# --- helpers ------------------------------------------------------------------


def claim_batch(
    store: BatchContractStore,
    worker: str = "w1",
    *,
    limit: int = 10,
    lease_seconds: float = 30.0,
    queues: Sequence[str] | None = None,
) -> list[ClaimedDelivery]:
    return store.claim_deliveries(worker, limit=limit, lease_seconds=lease_seconds, queues=queues)


def completion_request(
    entry: ClaimedDelivery, outputs: tuple[EmittedOutput, ...]
) -> CompletionRequest:
    """Complete the attempt the entry's row offers, acking that row."""
    row = entry.delivery
    return CompletionRequest(
        task_id=row.task_id,
        expected_attempt_id=row.attempt_id,
        outputs=outputs,
        delivery_id=row.delivery_id,
    )


def completed_result(outcome: CompletionOutcome) -> TaskCompletionResult:
    assert isinstance(outcome, TaskCompletionResult), f"expected a completion, got {outcome!r}"
    return outcome


def claimed_task(entry: ClaimedDelivery) -> TaskRecord:
    assert entry.task is not None, f"claim of {entry.delivery.task_id} was refused"
    return entry.task


def node_with_priority(slug: str, priority: int) -> DagNode:
    return DagNode(slug=slug, plugin=slug, priority=priority)


def delivery_row_ids(store: BatchContractStore, run_id: str = "run-1") -> list[str]:
    return [row.delivery_id for row in store.list_deliveries(run_id)]


def _states(store: BatchContractStore, run_id: str) -> list[tuple[object, ...]]:
    """Task states by node, free of the store-generated IDs."""
    return sorted(
        (
            record.node_index,
            record.status,
            record.generation,
            record.attempt_number,
            record.error,
            record.active_wait_id,
            tuple(
                (a.number, a.status, a.error, a.worker_id)
                for a in store.list_attempts(record.task_id)
            ),
        )
        for record in store.list_tasks(run_id, include_invalidated=True)
    )


# --- claim_deliveries -------------------------------------------------------------


def test_bq_01_claim_deliveries_leases_and_claims_up_to_limit(
    bq_store: BatchContractStore, bq_clock: FakeClock
) -> None:
    store = bq_store
    new_run(store, [root("a"), root("b"), root("c")])
    before = {record.task_id: record for record in store.list_tasks("run-1")}
    first = claim_batch(store, "w1", limit=2)
    assert len(first) == 2
    for entry in first:
        row = entry.delivery
        assert (row.worker_id, row.delivery_count) == ("w1", 1)
        assert row.lease_expires_at == bq_clock.now + 30.0
        claimed = claimed_task(entry)
        # The record is the task as the claim left it: RUNNING under the
        # row's attempt, started at the store's time, nothing else changed
        # (FN-01).
        assert claimed == task(store, row.task_id)
        assert claimed == replace(
            before[row.task_id], status=TaskStatus.RUNNING, started_at=bq_clock.now
        )
        assert (claimed.attempt_id, claimed.generation) == (row.attempt_id, row.generation)
        assert store.list_attempts(row.task_id)[-1].worker_id == "w1"
    second = claim_batch(store, "w2", limit=5)
    assert len(second) == 1
    assert claimed_task(second[0]).status is TaskStatus.RUNNING
    leased = {e.delivery.task_id for e in first + second}
    assert leased == set(before)
    assert len({e.delivery.delivery_id for e in first + second}) == 3
    assert claim_batch(store, "w3") == []
    # Claiming acknowledges nothing: the rows stay until acked.
    assert len(store.list_deliveries("run-1")) == 3
    assert all(r.status is TaskStatus.RUNNING for r in store.list_tasks("run-1"))


def test_bq_02_entries_follow_priority_then_creation_order(bq_store: BatchContractStore) -> None:
    store = bq_store
    new_run(
        store,
        [
            node_with_priority("low", 0),
            node_with_priority("high", 9),
            node_with_priority("mid", 5),
            node_with_priority("low2", 0),
        ],
    )
    first = claim_batch(store, limit=3)
    assert [e.delivery.node_index for e in first] == [1, 2, 0]
    assert [e.delivery.priority for e in first] == [9, 5, 0]
    assert all(claimed_task(e).node_index == e.delivery.node_index for e in first)
    (last,) = claim_batch(store, limit=3)
    assert last.delivery.node_index == 3
    assert claimed_task(last).status is TaskStatus.RUNNING


def test_bq_03_entries_follow_availability_and_count_leases_like_dequeue(
    bq_store: BatchContractStore, bq_clock: FakeClock
) -> None:
    store = bq_store
    new_run(store, [root("a"), root("b"), root("c")])
    order = [row.delivery_id for row in store.dequeue("w1", limit=3, lease_seconds=30.0)]
    # Give the first row back later than the others.
    bq_clock.advance(1.0)
    for delivery_id in order[1:]:
        assert store.nack(delivery_id, "w1")
    bq_clock.advance(1.0)
    assert store.nack(order[0], "w1")
    entries = claim_batch(store, "w2", limit=3, lease_seconds=12.5)
    assert [e.delivery.delivery_id for e in entries] == order[1:] + order[:1]
    for entry in entries:
        assert entry.delivery.delivery_count == 2
        assert entry.delivery.worker_id == "w2"
        assert entry.delivery.lease_expires_at == bq_clock.now + 12.5
        assert claimed_task(entry).status is TaskStatus.RUNNING


def test_bq_04_claim_refused_for_a_task_not_queued_keeps_the_lease_and_changes_nothing(
    bq_store: BatchContractStore,
) -> None:
    store = bq_store
    new_run(store, [root("a"), root("b")])
    running = only_task(store, "run-1", 0)
    waiting = only_task(store, "run-1", 1)
    # Claimed without a lease (RUNNING) and parked (WAITING): both rows stay
    # deliverable, as after a worker that never acked.
    claim(store, running)
    claim(store, waiting)
    assert wait_task(
        store,
        waiting.task_id,
        "w-b",
        expected_attempt_id=waiting.attempt_id,
        expected_generation=waiting.generation,
    )
    snapshot = fingerprint(store, "run-1")
    entries = claim_batch(store, "w1")
    assert [(e.delivery.task_id, e.delivery.attempt_id, e.task) for e in entries] == [
        (running.task_id, running.attempt_id, None),
        (waiting.task_id, waiting.attempt_id, None),
    ]
    assert fingerprint(store, "run-1") == snapshot
    assert task(store, running.task_id).status is TaskStatus.RUNNING
    assert task(store, waiting.task_id).status is TaskStatus.WAITING
    # The rows are still leased to w1: hidden from others, ackable by w1 only.
    assert store.dequeue("w2", limit=5, lease_seconds=30.0) == []
    assert claim_batch(store, "w2") == []
    assert store.ack(entries[0].delivery.delivery_id, "w2") is False
    assert all(store.ack(e.delivery.delivery_id, "w1") for e in entries)
    assert store.list_deliveries("run-1") == []


def test_bq_05_rows_of_stale_attempts_are_leased_but_not_claimed(
    bq_store: BatchContractStore, bq_clock: FakeClock
) -> None:
    store = bq_store
    new_run(store, [root("a"), root("b")])
    lost = only_task(store, "run-1", 0)
    flaky = only_task(store, "run-1", 1)
    claim(store, lost)
    claim(store, flaky)
    recovered = recover_task(
        store, lost.task_id, expected_attempt_id=lost.attempt_id, expected_generation=0
    )
    assert recovered is not None
    retried = store.try_fail_task_with_retry(
        flaky.task_id, "flaky", expected_attempt_id=flaky.attempt_id, available_at=bq_clock.now
    )
    assert retried is not None
    fresh = {lost.task_id: recovered.recovered_attempt_id, flaky.task_id: retried}
    entries = claim_batch(store, "w1")
    # The old rows are older, so they come first; the new ones win the claims.
    assert [e.delivery.attempt_id for e in entries] == [
        lost.attempt_id,
        flaky.attempt_id,
        recovered.recovered_attempt_id,
        retried,
    ]
    assert [e.task is None for e in entries] == [True, True, False, False]
    for entry in entries[2:]:
        claimed = claimed_task(entry)
        assert claimed == task(store, entry.delivery.task_id)
        assert claimed.status is TaskStatus.RUNNING
        assert claimed.attempt_id == fresh[claimed.task_id]
    # The stale attempts cannot run, and their rows stay with w1.
    for old in (lost, flaky):
        assert (
            store.try_claim_task(
                old.task_id, expected_attempt_id=old.attempt_id, expected_generation=0
            )
            is None
        )
    assert store.dequeue("w2", limit=5, lease_seconds=30.0) == []
    assert store.ack(entries[0].delivery.delivery_id, "w2") is False
    assert store.ack(entries[0].delivery.delivery_id, "w1") is True
    assert store.ack(entries[1].delivery.delivery_id, "w1") is True
    assert sorted(delivery_row_ids(store)) == sorted(e.delivery.delivery_id for e in entries[2:])


def test_bq_06_rows_of_a_cancelled_run_are_not_leased(bq_store: BatchContractStore) -> None:
    store = bq_store
    new_run(store, [root("a"), root("b")])
    new_run(store, [root("c")], run_id="run-2")
    assert store.try_cancel_run("run-1") is True
    snapshot = fingerprint(store, "run-1")
    (entry,) = claim_batch(store, "w1")
    assert entry.delivery.run_id == "run-2"
    assert claimed_task(entry).run_id == "run-2"
    assert fingerprint(store, "run-1") == snapshot
    assert all(r.status is TaskStatus.CANCELLED for r in store.list_tasks("run-1"))


def test_bq_07_row_past_max_deliveries_is_dead_lettered_not_returned(
    make_store: Callable[..., BatchContractStore], bq_clock: FakeClock
) -> None:
    store = make_store(clock=bq_clock, max_deliveries=1)
    new_run(store, [root("a"), root("b")])
    (first,) = store.dequeue("w1", limit=1, lease_seconds=1.0)
    doomed = task(store, first.task_id)
    # Given back at once, the used-up row is again the first candidate; once
    # buried it does not count towards the limit.
    assert store.nack(first.delivery_id, "w1")
    (entry,) = store.claim_deliveries("w2", limit=1, lease_seconds=30.0)
    assert entry.delivery.task_id != doomed.task_id
    assert claimed_task(entry).status is TaskStatus.RUNNING
    (letter,) = store.list_dead_letters()
    assert letter.reason == "max_deliveries"
    assert letter.delivery_id == first.delivery_id
    assert (letter.task_id, letter.attempt_id) == (doomed.task_id, doomed.attempt_id)
    crashed = task(store, doomed.task_id)
    assert crashed.status is TaskStatus.CRASHED
    assert crashed.error == "dead-lettered: max_deliveries"
    assert store.take_dead_lettered() == [TaskAttemptRef(doomed.task_id, doomed.attempt_id)]
    assert store.take_dead_lettered() == []
    assert delivery_row_ids(store) == [entry.delivery.delivery_id]


def test_bq_08_nothing_deliverable_returns_empty_at_once(bq_store: BatchContractStore) -> None:
    store = bq_store
    started = time.monotonic()
    assert store.claim_deliveries("w1", limit=5, lease_seconds=5.0, wait_seconds=0) == []
    new_run(store, [root("a")])
    # Work in another queue, or in no queue at all, is not deliverable here.
    assert claim_batch(store, "w1", queues=["elsewhere"]) == []
    assert claim_batch(store, "w1", queues=[]) == []
    (entry,) = store.claim_deliveries("w1", limit=5, lease_seconds=5.0, wait_seconds=0.0)
    assert entry.delivery.delivery_count == 1
    assert store.claim_deliveries("w2", limit=5, lease_seconds=5.0, wait_seconds=0.0) == []
    # The calls that found nothing returned without waiting (a generous
    # bound: each takes milliseconds).
    assert time.monotonic() - started < 2.0


def test_bq_09_invalid_requests_raise_typed_errors_and_change_nothing(
    bq_store: BatchContractStore,
) -> None:
    store = bq_store
    new_run(store, [root("a")])
    snapshot = fingerprint(store, "run-1")
    bad: list[Callable[[], object]] = [
        lambda: store.claim_deliveries("", limit=1, lease_seconds=1.0),
        lambda: store.claim_deliveries("w", limit=0, lease_seconds=1.0),
        lambda: store.claim_deliveries("w", limit=True, lease_seconds=1.0),
        lambda: store.claim_deliveries("w", limit=1, lease_seconds=0.0),
        lambda: store.claim_deliveries("w", limit=1, lease_seconds=-1.0),
        lambda: store.claim_deliveries("w", limit=1, lease_seconds=float("nan")),
        lambda: store.claim_deliveries("w", limit=1, lease_seconds=1.0, queues="default"),
        lambda: store.claim_deliveries("w", limit=1, lease_seconds=1.0, wait_seconds=-1.0),
    ]
    for call in bad:
        with pytest.raises(InvalidStoreValueError):
            call()
    assert fingerprint(store, "run-1") == snapshot
    # Nothing was leased or claimed by the refused calls.
    (entry,) = claim_batch(store, "w")
    assert entry.delivery.delivery_count == 1
    assert claimed_task(entry).status is TaskStatus.RUNNING
    # A completion batch from an invalid worker ID is refused as a whole.
    claimed = fingerprint(store, "run-1")
    with pytest.raises(InvalidStoreValueError):
        store.complete_and_ack("", [completion_request(entry, emit("a-1"))])
    assert fingerprint(store, "run-1") == claimed


def test_bq_10_claim_deliveries_equals_dequeue_then_try_claim_task(
    make_store: Callable[..., BatchContractStore],
) -> None:
    def prepare() -> BatchContractStore:
        store = make_store(clock=FakeClock())
        new_run(
            store,
            [
                node_with_priority("a", 0),
                node_with_priority("b", 3),
                node_with_priority("c", 0),
                node_with_priority("d", 0),
                node_with_priority("e", 1),
            ],
        )
        # c is RUNNING with its row still deliverable; d lost its worker.
        claim(store, only_task(store, "run-1", 2))
        lost = only_task(store, "run-1", 3)
        claim(store, lost)
        assert recover_task(
            store, lost.task_id, expected_attempt_id=lost.attempt_id, expected_generation=0
        )
        return store

    batched, single = prepare(), prepare()
    entries = batched.claim_deliveries("w1", limit=10, lease_seconds=20.0)
    rows = single.dequeue("w1", limit=10, lease_seconds=20.0)
    claims = [
        single.try_claim_task(
            row.task_id, expected_attempt_id=row.attempt_id, expected_generation=row.generation
        )
        for row in rows
    ]
    assert len(entries) == 6  # five roots and the recovered attempt of d
    assert [
        (e.delivery.node_index, e.delivery.priority, e.delivery.delivery_count, e.task is not None)
        for e in entries
    ] == [
        (row.node_index, row.priority, row.delivery_count, won is not None)
        for row, won in zip(rows, claims, strict=True)
    ]
    assert [e.delivery.lease_expires_at for e in entries] == [r.lease_expires_at for r in rows]
    assert [e.task is None for e in entries].count(True) == 2
    assert _states(batched, "run-1") == _states(single, "run-1")
    for entry in entries:
        if entry.task is not None:
            assert entry.task == task(batched, entry.delivery.task_id)
    # Both stores leave the same rows, all leased.
    assert [(d.node_index, d.generation) for d in batched.list_deliveries("run-1")] == [
        (d.node_index, d.generation) for d in single.list_deliveries("run-1")
    ]
    assert batched.dequeue("w2", limit=5, lease_seconds=1.0) == []
    assert single.dequeue("w2", limit=5, lease_seconds=1.0) == []


# --- complete_and_ack --------------------------------------------------------------
