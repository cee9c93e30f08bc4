"""The stall diagnosis with worker presence: a queued task no live worker
serves, and a task RUNNING on a dead worker's expired lease."""

from __future__ import annotations

from dagwerk.backends.memory import MemoryStore
from dagwerk.runtime.backstop import diagnose_stored_run
from dagwerk.stall import NodeState
from dagwerk.testing.contract_queue import FakeClock
from dagwerk.testing.helpers import new_run, root


def _node(store: MemoryStore) -> tuple[NodeState, str, bool]:
    diagnosis = diagnose_stored_run(store, "run-1")
    assert diagnosis is not None
    (node,) = diagnosis.nodes
    return node.state, node.reason, diagnosis.stalled


def test_a_queued_task_needs_a_live_worker_with_its_plugin_and_queue() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    new_run(store, [root("a", plugin="clean_order")])
    # No worker ever recorded itself: nothing is known, the task counts as served.
    assert _node(store) == (NodeState.QUEUED, "queued for a worker", False)
    store.record_worker("w1", plugins=["clean_order"], queues=["io"], ttl_seconds=30.0)
    assert _node(store) == (
        NodeState.HELD,
        "no live worker has plugin 'clean_order' in queue 'default' "
        "(1 live worker serves other plugins or queues)",
        True,
    )
    store.record_worker("w2", plugins=["clean_order"], queues=None, ttl_seconds=30.0)
    assert _node(store) == (NodeState.QUEUED, "queued for a worker", False)
    # A clean stop retires a record: "last seen" stays known.
    assert store.retire_worker("w2")
    clock.advance(45.0)
    assert _node(store) == (
        NodeState.HELD,
        "no live worker has plugin 'clean_order' (no worker seen for 45s)",
        True,
    )


def test_a_task_on_an_expired_lease_is_named_and_held_without_a_live_worker() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    new_run(store, [root("a", plugin="clean_order")])
    store.record_worker("dead", plugins=["clean_order"], queues=None, ttl_seconds=30.0)
    store.record_worker("alive", plugins=["clean_order"], queues=None, ttl_seconds=60.0)
    (claimed,) = store.claim_deliveries("dead", limit=1, lease_seconds=5.0)
    assert _node(store) == (NodeState.RUNNING, "running", False)
    clock.advance(10.0)
    expired = f"task {claimed.delivery.task_id} is RUNNING on a lease of worker dead that expired"
    state, reason, stalled = _node(store)
    assert (state, stalled) == (NodeState.RUNNING, False)
    assert reason == f"{expired} 5s ago; a live worker will recover it"
    clock.advance(60.0)
    state, reason, stalled = _node(store)
    assert (state, stalled) == (NodeState.HELD, True)
    assert reason == (
        f"{expired} 65s ago; no live worker has plugin 'clean_order' (no worker seen for 70s)"
    )
