"""Contract tests: the backstop operations of ``BackstopStore`` (gated dispatch,
GD-09/GD-12): named leases, repair of lost deliveries, persisted stalls,
wait ages, and the scrape-time gauges.

Stores are built through the backend's ``make_store(**settings)`` fixture with
the fake ``queue_clock`` of :mod:`dagwerk.testing.contract_queue`.
"""

from __future__ import annotations

from typing import Protocol

import pytest

from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.execution import claim_task
from dagwerk.orchestrator import cancel_run, reconcile_run
from dagwerk.runtime.backstop import diagnose_stored_run
from dagwerk.stall import NodeState
from dagwerk.store import BackstopStore, LeasedDelivery
from dagwerk.testing.contract_queue import FakeClock, QueueContractStore
from dagwerk.testing.helpers import (
    CallbackLog,
    child,
    claim,
    deliveries_for,
    emit,
    new_run,
    only_task,
    root,
    task,
    tasks_of,
)
from dagwerk.waiting import resume_task, wait_task

__all__ = [
    "test_gd_c01_named_lease_is_exclusive_until_it_expires",
    "test_gd_c02_lease_release_only_by_its_holder",
    "test_gd_c03_repair_recreates_a_lost_delivery_once",
    "test_gd_c04_repair_leaves_dead_letters_and_closed_runs_alone",
    "test_gd_c05_stall_is_recorded_once_per_stall",
    "test_gd_c06_wait_ages_count_from_when_the_wait_began",
    "test_gd_c07_queue_stats_and_run_status_counts",
    "test_gd_c08_the_live_node_probe_agrees_with_the_stall_diagnosis",
]


class BackstopContractStore(QueueContractStore, BackstopStore, Protocol):
    """A contract-suite store with the durable queue and the backstop operations."""


def _store(qstore: QueueContractStore) -> BackstopContractStore:
    assert isinstance(qstore, BackstopStore)
    return qstore


def _lease_one(store: QueueContractStore, worker: str = "w1") -> LeasedDelivery:
    (row,) = store.dequeue(worker, limit=10, lease_seconds=30.0)
    return row


def test_gd_c01_named_lease_is_exclusive_until_it_expires(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    """GD-09: passes never overlap: one holder at a time, across processes."""
    store = _store(qstore)
    assert store.try_acquire_lease("backstop", "a", 10.0) is True
    assert store.try_acquire_lease("backstop", "b", 10.0) is False
    assert store.try_acquire_lease("other", "b", 10.0) is True  # names are independent
    queue_clock.advance(9.0)
    assert store.try_acquire_lease("backstop", "a", 10.0) is True  # renewal
    queue_clock.advance(9.0)
    assert store.try_acquire_lease("backstop", "b", 10.0) is False  # renewed: still live
    queue_clock.advance(1.5)
    assert store.try_acquire_lease("backstop", "b", 10.0) is True  # expired: taken over
    assert store.try_acquire_lease("backstop", "a", 10.0) is False


def test_gd_c02_lease_release_only_by_its_holder(qstore: QueueContractStore) -> None:
    store = _store(qstore)
    assert store.try_acquire_lease("backstop", "a", 10.0)
    assert store.release_lease("backstop", "b") is False
    assert store.try_acquire_lease("backstop", "b", 10.0) is False
    assert store.release_lease("backstop", "a") is True
    assert store.release_lease("backstop", "a") is False
    assert store.try_acquire_lease("backstop", "b", 10.0) is True


def test_gd_c03_repair_recreates_a_lost_delivery_once(qstore: QueueContractStore) -> None:
    """A QUEUED task whose delivery row is missing gets its row back, same attempt."""
    store = _store(qstore)
    new_run(store, [root("a"), root("b")])
    lost = only_task(store, "run-1", 0)
    kept = only_task(store, "run-1", 1)
    (row,) = [d for d in store.list_deliveries("run-1") if d.task_id == lost.task_id]
    assert store.ack_delivery(row.delivery_id) is True
    assert store.repair_missing_deliveries("run-1") == [lost.task_id]
    rows = [d for d in store.list_deliveries("run-1") if d.task_id == lost.task_id]
    assert [(d.attempt_id, d.generation) for d in rows] == [(lost.attempt_id, 0)]
    assert task(store, lost.task_id).attempt_id == lost.attempt_id
    assert len([d for d in store.list_deliveries("run-1") if d.task_id == kept.task_id]) == 1
    assert store.repair_missing_deliveries("run-1") == []  # exact repeat repairs nothing
    assert store.repair_missing_deliveries("missing") == []
    # The repaired row is an ordinary delivery: a worker leases and claims it.
    leased = store.dequeue("w1", limit=10, lease_seconds=30.0)
    mine = [d for d in leased if d.task_id == lost.task_id]
    assert mine and claim_task(
        store, lost.task_id, expected_attempt_id=lost.attempt_id, expected_generation=0
    )


def test_gd_c04_repair_leaves_dead_letters_and_closed_runs_alone(
    qstore: QueueContractStore,
) -> None:
    store = _store(qstore)
    new_run(store, [root("a")])
    row = _lease_one(store)
    assert store.nack(row.delivery_id, "w1", poison=True, reason="poison")
    assert task(store, row.task_id).status is TaskStatus.QUEUED
    # A parked attempt is not a lost one: the dead-letter queue owns it.
    assert store.repair_missing_deliveries("run-1") == []
    new_run(store, [root("b")], run_id="run-2")
    other = only_task(store, "run-2", 0)
    (row2,) = [d for d in store.list_deliveries("run-2")]
    assert store.ack_delivery(row2.delivery_id)
    assert cancel_run(store, "run-2", callbacks=CallbackLog().callbacks)
    assert store.repair_missing_deliveries("run-2") == []
    assert task(store, other.task_id).status is TaskStatus.CANCELLED


def test_gd_c05_stall_is_recorded_once_per_stall(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    """GD-12: the stall event is edge-triggered; a persistent stall is one stall."""
    store = _store(qstore)
    new_run(store, [root("a"), root("b")])
    assert store.try_record_stall("run-1", "a: held", (1, 0, 1)) is True
    queue_clock.advance(5.0)
    assert store.try_record_stall("run-1", "a: still held", (0,)) is False
    (record,) = store.list_stalls()
    assert (record.run_id, record.reason, record.held_nodes) == ("run-1", "a: still held", (0,))
    assert record.detected_at == 1_000.0  # the first detection is kept
    assert store.try_record_stall("missing", "x", ()) is False
    assert [s.run_id for s in store.list_stalls()] == ["run-1"]
    assert store.clear_stall("run-1") is True
    assert store.clear_stall("run-1") is False
    assert store.list_stalls() == []
    assert store.try_record_stall("run-1", "again", (0,)) is True  # a new stall


def test_gd_c06_wait_ages_count_from_when_the_wait_began(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    """GD-12 wait timeout: a wait's age is measured from the store time that
    ``try_wait_task`` committed with it, not from when anything first looked."""
    store = _store(qstore)
    new_run(store, [root("a")])
    assert store.wait_ages("run-1") == {}
    row = _lease_one(store)
    assert claim_task(store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0)
    assert wait_task(
        store, row.task_id, "approve", expected_attempt_id=row.attempt_id, expected_generation=0
    )
    # Nobody read the ages while 42 s passed: the first read already sees them.
    queue_clock.advance(42.0)
    assert dict(store.wait_ages("run-1")) == {row.task_id: 42.0}
    queue_clock.advance(8.0)
    assert dict(store.wait_ages("run-1")) == {row.task_id: 50.0}  # reading records nothing
    assert resume_task(
        store, row.task_id, "approve", expected_attempt_id=row.attempt_id, expected_generation=0
    )
    assert store.wait_ages("run-1") == {}
    assert store.wait_ages("missing") == {}


def test_gd_c07_queue_stats_and_run_status_counts(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    store = _store(qstore)
    assert store.queue_stats() == []
    new_run(store, [root("a"), root("b")])
    new_run(store, [root("c")], run_id="run-2", start=False)
    (stats,) = store.queue_stats()
    assert (stats.queue, stats.depth, stats.oldest_available_at) == ("default", 2, 1_000.0)
    queue_clock.advance(3.0)
    store.dequeue("w1", limit=1, lease_seconds=30.0)
    (stats,) = store.queue_stats()
    assert (stats.depth, stats.oldest_available_at) == (1, 1_000.0)
    counts = store.run_status_counts()
    assert dict(counts) == {RunStatus.RUNNING: 1, RunStatus.PENDING: 1}


def test_gd_c08_the_live_node_probe_agrees_with_the_stall_diagnosis(
    qstore: QueueContractStore,
) -> None:
    """``has_live_node`` (the backstop's shortcut) is True exactly when the
    diagnosis finds a node RUNNING or QUEUED from its tasks."""
    store = _store(qstore)
    live = StoreCapabilities.of(store).live_nodes
    if live is None:
        pytest.skip("this store offers no live-node probe")
    probe = live.has_live_node

    def check(expected: bool) -> None:
        diagnosis = diagnose_stored_run(store, "run-1")
        assert diagnosis is not None
        live = {NodeState.RUNNING, NodeState.QUEUED}
        assert any(node.state in live for node in diagnosis.nodes) is expected
        assert probe("run-1") is expected

    new_run(store, [root("src"), child("fan", "src")])
    check(True)  # the root's task is QUEUED with its row
    src = only_task(store, "run-1", 0)
    (row,) = deliveries_for(store, src.task_id)
    assert store.ack_delivery(row.delivery_id)
    check(False)  # QUEUED without a row: held, not live
    assert store.repair_missing_deliveries("run-1") == [src.task_id]
    claim(store, src)
    check(True)  # RUNNING
    assert store.try_complete_task(
        src.task_id, emit("o1", "o2"), expected_attempt_id=src.attempt_id
    )
    check(False)  # settled; the fan-out is ready but has no task yet
    reconcile_run(store, "run-1", callbacks=CallbackLog().callbacks)
    first, _ = tasks_of(store, "run-1", 1)
    check(True)
    claim(store, first)
    assert store.mark_task_failed(first.task_id, "boom", expected_attempt_id=first.attempt_id)
    check(False)  # a FAILED task makes the node FAILED; its QUEUED sibling does not count
    assert probe("missing") is False
