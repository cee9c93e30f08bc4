"""Contract tests: the plugin and run filters of a dequeue, and worker
presence (WP-01..WP-07) of ``DagQueueStore`` and ``WorkerPresenceStore``.

A worker leases only rows whose node's plugin it has, so a row no live
worker can serve keeps its delivery count until a worker that has the
plugin comes; workers record what they serve so the stall diagnosis can say
when none does. Uses the ``make_store`` fixture of ``contract_queue``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dagwerk.store import (
    WORKER_RECORDS_KEPT_SECONDS,
    BatchQueueStore,
    InvalidStoreValueError,
    QueueForecastStore,
    WorkerPresenceStore,
)
from dagwerk.testing.contract_queue import FakeClock, QueueContractStore
from dagwerk.testing.helpers import new_run, root

__all__ = [
    "test_wp_01_dequeue_leases_only_rows_of_the_given_plugins",
    "test_wp_02_claim_deliveries_filters_by_plugin_too",
    "test_wp_03_rows_of_the_preferred_run_come_first",
    "test_wp_04_invalid_filters_raise",
    "test_wp_05_worker_records_say_what_is_served_and_who_is_live",
    "test_wp_06_old_worker_records_are_pruned",
    "test_wp_07_expired_leases_are_listed_until_the_row_moves_on",
    "test_wp_08_next_delivery_in_forecasts_delayed_rows",
]


def _presence(store: object) -> WorkerPresenceStore:
    if not isinstance(store, WorkerPresenceStore):
        pytest.skip("the store does not implement WorkerPresenceStore")
    return store


def test_wp_01_dequeue_leases_only_rows_of_the_given_plugins(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock)
    new_run(store, [root("a", plugin="clean"), root("b", plugin="load")])
    assert store.dequeue("w1", limit=5, lease_seconds=5.0, plugins=[]) == []
    assert store.dequeue("w1", limit=5, lease_seconds=5.0, plugins=["other"]) == []
    (load,) = store.dequeue("w1", limit=5, lease_seconds=5.0, plugins={"load", "other"})
    assert load.node_index == 1
    # The row this worker could not serve was never leased: its count is intact.
    (clean,) = store.dequeue("w2", limit=5, lease_seconds=5.0, plugins=["clean"])
    assert (clean.node_index, clean.delivery_count) == (0, 1)
    queue_clock.advance(10.0)
    both = store.dequeue("w3", limit=5, lease_seconds=5.0, plugins=None)
    assert sorted(row.node_index for row in both) == [0, 1]


def test_wp_02_claim_deliveries_filters_by_plugin_too(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock)
    if not isinstance(store, BatchQueueStore):
        pytest.skip("the store does not implement BatchQueueStore")
    new_run(store, [root("a", plugin="clean"), root("b", plugin="load")])
    (claimed,) = store.claim_deliveries("w1", limit=5, lease_seconds=5.0, plugins=["load"])
    assert claimed.delivery.node_index == 1 and claimed.task is not None
    assert store.claim_deliveries("w1", limit=5, lease_seconds=5.0, plugins=["load"]) == []
    (other,) = store.claim_deliveries("w2", limit=5, lease_seconds=5.0, plugins=["clean"])
    assert other.delivery.node_index == 0 and other.delivery.delivery_count == 1


def test_wp_03_rows_of_the_preferred_run_come_first(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock)
    new_run(store, [root("a"), root("b")], "run-1")
    queue_clock.advance(1.0)
    new_run(store, [root("a"), root("b")], "run-2")
    first = store.dequeue("w1", limit=3, lease_seconds=5.0, prefer_run="run-2")
    assert [row.run_id for row in first] == ["run-2", "run-2", "run-1"]
    # A preference is not a filter: with nothing of its run left, others come.
    (rest,) = store.dequeue("w1", limit=3, lease_seconds=5.0, prefer_run="run-2")
    assert rest.run_id == "run-1"
    assert store.dequeue("w1", limit=3, lease_seconds=5.0, prefer_run="no-such-run") == []


def test_wp_04_invalid_filters_raise(qstore: QueueContractStore) -> None:
    new_run(qstore, [root("a")])
    bad: list[Callable[[], object]] = [
        lambda: qstore.dequeue("w", limit=1, lease_seconds=1.0, plugins="a"),
        lambda: qstore.dequeue("w", limit=1, lease_seconds=1.0, plugins=[""]),
        lambda: qstore.dequeue("w", limit=1, lease_seconds=1.0, prefer_run=""),
    ]
    for call in bad:
        with pytest.raises(InvalidStoreValueError):
            call()
    (row,) = qstore.dequeue("w", limit=1, lease_seconds=1.0)
    assert row.delivery_count == 1


def test_wp_05_worker_records_say_what_is_served_and_who_is_live(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = _presence(make_store(clock=queue_clock))
    assert store.list_workers() == []
    store.record_worker("w1", plugins=["load", "clean"], queues=None, ttl_seconds=10.0)
    queue_clock.advance(4.0)
    store.record_worker("w2", plugins=[], queues=["io"], ttl_seconds=10.0)
    w2, w1 = store.list_workers()
    assert (w1.worker_id, w1.plugins, w1.queues, w1.live) == ("w1", ("clean", "load"), None, True)
    assert w1.seen_seconds_ago == pytest.approx(4.0)
    assert (w2.worker_id, w2.plugins, w2.queues) == ("w2", (), ("io",))
    assert w1.serves("load", "default") and not w2.serves("load", "io")
    queue_clock.advance(7.0)
    w2, w1 = store.list_workers()
    assert not w1.live and w2.live and w1.seen_seconds_ago == pytest.approx(11.0)
    # A heartbeat replaces the record.
    store.record_worker("w1", plugins=["load"], queues=["cpu"], ttl_seconds=10.0)
    w1, w2 = store.list_workers()
    assert (w1.worker_id, w1.plugins, w1.queues, w1.live) == ("w1", ("load",), ("cpu",), True)
    # A clean stop retires the record: kept, no longer live.
    assert store.retire_worker("w1") and not store.retire_worker("w1")
    assert not store.retire_worker("nobody")
    w1, w2 = store.list_workers()
    assert (w1.worker_id, w1.live, w2.live) == ("w1", False, True)


def test_wp_06_old_worker_records_are_pruned(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = _presence(make_store(clock=queue_clock))
    store.record_worker("gone", plugins=["a"], queues=None, ttl_seconds=5.0)
    queue_clock.advance(WORKER_RECORDS_KEPT_SECONDS)
    store.record_worker("kept", plugins=["a"], queues=None, ttl_seconds=5.0)
    assert [w.worker_id for w in store.list_workers()] == ["kept", "gone"]
    queue_clock.advance(10.0)
    store.record_worker("new", plugins=["a"], queues=None, ttl_seconds=5.0)
    assert [w.worker_id for w in store.list_workers()] == ["new", "kept"]


def test_wp_07_expired_leases_are_listed_until_the_row_moves_on(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock)
    presence = _presence(store)
    new_run(store, [root("a"), root("b")])
    first, second = store.dequeue("w1", limit=2, lease_seconds=5.0)
    assert presence.list_expired_leases() == []
    assert store.extend_lease(second.delivery_id, "w1", 8.0)
    queue_clock.advance(9.0)
    older, newer = presence.list_expired_leases()
    assert (older.delivery_id, older.task_id, older.attempt_id) == (
        first.delivery_id,
        first.task_id,
        first.attempt_id,
    )
    assert (older.run_id, older.node_index, older.worker_id) == ("run-1", 0, "w1")
    assert older.expired_seconds_ago == pytest.approx(4.0)
    assert newer.delivery_id == second.delivery_id
    assert newer.expired_seconds_ago == pytest.approx(1.0)
    assert [e.delivery_id for e in presence.list_expired_leases("run-1")] == [
        first.delivery_id,
        second.delivery_id,
    ]
    assert presence.list_expired_leases("run-2") == []
    # Acked, or leased again by another worker: no longer an expired lease.
    assert store.ack(first.delivery_id, "w1")
    (again,) = store.dequeue("w2", limit=1, lease_seconds=5.0)
    assert again.delivery_id == second.delivery_id
    assert presence.list_expired_leases() == []


def test_wp_08_next_delivery_in_forecasts_delayed_rows(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock)
    if not isinstance(store, QueueForecastStore):
        pytest.skip("the store does not implement QueueForecastStore")
    assert store.next_delivery_in() is None
    new_run(store, [root("a", plugin="clean"), root("b", plugin="load")])
    assert store.next_delivery_in() == 0.0
    assert store.next_delivery_in(plugins=["other"]) is None
    assert store.next_delivery_in(queues=["cpu"]) is None
    clean, _ = store.dequeue("w1", limit=2, lease_seconds=30.0)
    # Rows under a live lease are another worker's: not forecast.
    assert store.next_delivery_in() is None
    assert store.next_delivery_in(worker_id="w2") is None
    # To the worker that holds them they are due when the lease ends.
    assert store.next_delivery_in(worker_id="w1") == pytest.approx(30.0)
    assert store.next_delivery_in(worker_id="w1", plugins=["other"]) is None
    assert store.nack(clean.delivery_id, "w1", delay=7.0)
    assert store.next_delivery_in() == pytest.approx(7.0)
    assert store.next_delivery_in(plugins=["load"]) is None
    queue_clock.advance(30.0)
    # The lease of the other row expired: deliverable now.
    assert store.next_delivery_in(plugins=["load"]) == 0.0
    assert store.next_delivery_in(plugins=["clean"]) == 0.0
