"""Contract tests: ``BatchQueueStore.complete_and_ack``, per request
``try_complete_task`` followed by ``ack`` when the completion did not raise.
The claim half and the shared fixtures are in
:mod:`dagwerk.testing.contract_batch`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import cast

import pytest

from dagwerk.budgets import Budget, BudgetExhaustedError, output_bytes
from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.execution import recover_task
from dagwerk.limits import Limits
from dagwerk.models import EmittedOutput, ResolvedOutput
from dagwerk.orchestrator import reconcile_run, start_run
from dagwerk.store import (
    ClaimedDelivery,
    CompletionRequest,
    DagBudgetStore,
    OutputPublicationError,
    UnitOfWorkStore,
)
from dagwerk.testing.contract_batch import (
    BatchContractStore,
    claim_batch,
    claimed_task,
    completed_result,
    completion_request,
    delivery_row_ids,
    node_with_priority,
)
from dagwerk.testing.contract_queue import FakeClock
from dagwerk.testing.helpers import (
    CallbackLog,
    chain,
    child,
    claim,
    emit,
    fingerprint,
    launch_of,
    new_run,
    only_task,
    root,
    task,
)

__all__ = [
    "test_bq_11_complete_and_ack_completes_and_acks_in_request_order",
    "test_bq_12_stale_completion_gives_none_and_its_row_is_still_acked",
    "test_bq_13_exact_repeat_returns_the_first_result",
    "test_bq_14_refused_outputs_fail_only_their_request",
    "test_bq_15_too_many_outputs_are_refused_per_request",
    "test_bq_16_completion_by_a_non_holder_applies_but_does_not_ack",
    "test_bq_17_empty_request_list_changes_nothing",
    "test_bq_18_batched_worker_cycle_runs_a_chain_to_completion",
    "test_bq_19_budget_refusal_fails_only_its_request_and_sees_earlier_charges",
    "test_bq_20_batches_spanning_runs_keep_lease_and_request_order",
    "test_bq_21_recently_committed_outputs_resolve_as_the_table_does",
    "test_bq_22_outputs_of_a_rolled_back_unit_are_not_remembered",
    "test_bq_23_an_output_id_an_earlier_call_took_fails_only_its_request",
]


def test_bq_11_complete_and_ack_completes_and_acks_in_request_order(
    bq_store: BatchContractStore,
) -> None:
    store = bq_store
    log = new_run(store, [root("a"), child("c", "a")])
    (entry,) = claim_batch(store)
    outputs = (
        EmittedOutput(id="a-1", fields={"k": 1}, data={"path": "/a/1"}),
        EmittedOutput(id="a-2", fields={"k": 2}, data={"path": "/a/2"}),
    )
    (outcome,) = store.complete_and_ack("w1", [completion_request(entry, outputs)])
    result = completed_result(outcome)
    row = entry.delivery
    assert (result.task_id, result.attempt_id, result.run_id) == (
        row.task_id,
        row.attempt_id,
        "run-1",
    )
    assert (result.node_index, result.generation, result.launch_complete) == (0, 0, True)
    assert task(store, row.task_id).status is TaskStatus.COMPLETED
    assert store.get_output_ids("run-1", 0) == ("a-1", "a-2")
    resolved = store.resolve_outputs("run-1", ("a-1", "a-2"))
    assert dict(resolved["a-2"].fields) == {"k": 2}
    assert dict(resolved["a-2"].data) == {"path": "/a/2"}
    launch = launch_of(store, "run-1", 0)
    assert launch is not None and launch.complete is True
    assert store.list_deliveries("run-1") == []

    # Two tasks of one launch in one call: the outcomes follow the request
    # order (here the reverse of the lease order), and only the second
    # completes the launch.
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    entries = claim_batch(store)
    assert len(entries) == 2 and all(e.task is not None for e in entries)
    requests = [
        completion_request(entries[1], emit("c-x")),
        completion_request(entries[0], emit("c-y")),
    ]
    results = [completed_result(o) for o in store.complete_and_ack("w1", requests)]
    assert [r.task_id for r in results] == [q.task_id for q in requests]
    assert [r.launch_complete for r in results] == [False, True]
    assert store.get_output_ids("run-1", 1) == ("c-x", "c-y")
    assert all(task(store, q.task_id).status is TaskStatus.COMPLETED for q in requests)
    child_launch = launch_of(store, "run-1", 1)
    assert child_launch is not None and child_launch.complete is True
    assert store.list_deliveries("run-1") == []


def test_bq_12_stale_completion_gives_none_and_its_row_is_still_acked(
    bq_store: BatchContractStore,
) -> None:
    store = bq_store
    new_run(store, [root("a")])
    (entry,) = claim_batch(store, "w1")
    recovered = recover_task(
        store,
        entry.delivery.task_id,
        expected_attempt_id=entry.delivery.attempt_id,
        expected_generation=0,
    )
    assert recovered is not None
    assert store.complete_and_ack("w1", [completion_request(entry, emit("late"))]) == [None]
    # Nothing was published and the task keeps its fresh attempt...
    current = task(store, entry.delivery.task_id)
    assert (current.status, current.attempt_id) == (
        TaskStatus.QUEUED,
        recovered.recovered_attempt_id,
    )
    assert store.get_output_ids("run-1", 0) == ()
    assert dict(store.resolve_outputs("run-1", ("late",))) == {}
    # ...but the completion did not raise, so the holder's old row is acked;
    # only the fresh attempt's row is left.
    (left,) = store.list_deliveries("run-1")
    assert left.delivery_id != entry.delivery.delivery_id
    assert left.attempt_id == recovered.recovered_attempt_id
    assert store.ack(entry.delivery.delivery_id, "w1") is False


def test_bq_13_exact_repeat_returns_the_first_result(bq_store: BatchContractStore) -> None:
    """FN-06: a repeated completion, in the same call or a later one."""
    store = bq_store
    new_run(store, [root("a")])
    (entry,) = claim_batch(store)
    request = completion_request(entry, emit("first"))
    first, repeat = store.complete_and_ack("w1", [request, request])
    assert repeat == completed_result(first)
    later = replace(request, outputs=emit("second"))
    assert store.complete_and_ack("w1", [later]) == [first]
    assert store.get_output_ids("run-1", 0) == ("first",)
    assert store.list_deliveries("run-1") == []


def test_bq_14_refused_outputs_fail_only_their_request(bq_store: BatchContractStore) -> None:
    store = bq_store
    new_run(store, [root("a"), root("b"), root("c"), root("d")])
    entries = claim_batch(store, "w1")
    assert [e.delivery.node_index for e in entries] == [0, 1, 2, 3]
    a, b, c, d = entries
    refused_before = [task(store, e.delivery.task_id) for e in (b, c)]
    outcomes = store.complete_and_ack(
        "w1",
        [
            completion_request(a, emit("a-1")),
            completion_request(b, emit("dup", "dup")),
            # The ID a's completion took a moment ago, in the same call.
            completion_request(c, emit("a-1")),
            completion_request(d, emit("d-1")),
        ],
    )
    assert len(outcomes) == 4
    assert completed_result(outcomes[0]).task_id == a.delivery.task_id
    assert completed_result(outcomes[3]).task_id == d.delivery.task_id
    assert isinstance(outcomes[1], OutputPublicationError)
    assert "duplicate output IDs" in str(outcomes[1])
    assert isinstance(outcomes[2], OutputPublicationError)
    assert "already exist" in str(outcomes[2])
    # Nothing of the refused requests was written, and their rows stay leased.
    assert [task(store, e.delivery.task_id) for e in (b, c)] == refused_before
    assert [store.get_output_ids("run-1", i) for i in range(4)] == [("a-1",), (), (), ("d-1",)]
    assert sorted(delivery_row_ids(store)) == sorted(
        [b.delivery.delivery_id, c.delivery.delivery_id]
    )
    assert store.dequeue("w2", limit=5, lease_seconds=30.0) == []
    # The holder can still complete them with acceptable outputs.
    again = store.complete_and_ack(
        "w1", [completion_request(b, emit("b-1")), completion_request(c, emit("c-1"))]
    )
    assert [completed_result(o).task_id for o in again] == [b.delivery.task_id, c.delivery.task_id]
    assert store.list_deliveries("run-1") == []


def test_bq_15_too_many_outputs_are_refused_per_request(
    make_store: Callable[..., BatchContractStore], bq_clock: FakeClock
) -> None:
    store = make_store(clock=bq_clock, limits=Limits().with_(max_outputs_per_task_completion=2))
    new_run(store, [root("a"), root("b")])
    big, small = claim_batch(store, "w1")
    outcomes = store.complete_and_ack(
        "w1",
        [
            completion_request(big, emit("a1", "a2", "a3")),
            completion_request(small, emit("b1", "b2")),
        ],
    )
    error = outcomes[0]
    assert isinstance(error, OutputPublicationError)
    assert error.limit == 2
    assert completed_result(outcomes[1]).launch_complete is True
    assert task(store, big.delivery.task_id).status is TaskStatus.RUNNING
    assert store.get_output_ids("run-1", 0) == ()
    assert store.get_output_ids("run-1", 1) == ("b1", "b2")
    assert delivery_row_ids(store) == [big.delivery.delivery_id]


def test_bq_16_completion_by_a_non_holder_applies_but_does_not_ack(
    bq_store: BatchContractStore,
) -> None:
    store = bq_store
    new_run(store, [root("a"), root("b")])
    (held,) = claim_batch(store, "w1", limit=1)
    # b is claimed without any lease: its row has no holder.
    unleased = only_task(store, "run-1", 1)
    claim(store, unleased)
    (unleased_row,) = [r for r in store.list_deliveries("run-1") if r.task_id == unleased.task_id]
    # As with ack: w2 does not hold w1's row.
    assert store.ack(held.delivery.delivery_id, "w2") is False
    outcomes = store.complete_and_ack(
        "w2",
        [
            completion_request(held, emit("a-1")),
            CompletionRequest(
                task_id=unleased.task_id,
                expected_attempt_id=unleased.attempt_id,
                outputs=emit("b-1"),
                delivery_id=unleased_row.delivery_id,
            ),
        ],
    )
    # The completions are fenced by attempt only, so they apply...
    assert [completed_result(o).task_id for o in outcomes] == [
        held.delivery.task_id,
        unleased.task_id,
    ]
    assert all(r.status is TaskStatus.COMPLETED for r in store.list_tasks("run-1"))
    assert store.get_output_ids("run-1", 0) == ("a-1",)
    # ...but neither row was removed: w2 holds neither lease.
    assert sorted(delivery_row_ids(store)) == sorted(
        [held.delivery.delivery_id, unleased_row.delivery_id]
    )
    assert store.ack(held.delivery.delivery_id, "w1") is True
    assert store.ack_delivery(unleased_row.delivery_id) is True
    assert store.list_deliveries("run-1") == []


def test_bq_17_empty_request_list_changes_nothing(bq_store: BatchContractStore) -> None:
    store = bq_store
    new_run(store, [root("a")])
    (entry,) = claim_batch(store, "w1")
    snapshot = fingerprint(store, "run-1")
    assert store.complete_and_ack("w1", []) == []
    assert fingerprint(store, "run-1") == snapshot
    assert task(store, entry.delivery.task_id).status is TaskStatus.RUNNING
    # The lease is untouched too.
    assert store.dequeue("w2", limit=1, lease_seconds=1.0) == []
    assert store.ack(entry.delivery.delivery_id, "w1") is True


def test_bq_18_batched_worker_cycle_runs_a_chain_to_completion(
    bq_store: BatchContractStore,
) -> None:
    store = bq_store
    log = new_run(store, chain(3))
    done: list[int] = []
    while entries := claim_batch(store, "w1", limit=2):
        requests = [completion_request(e, emit(f"out-{e.delivery.node_index}")) for e in entries]
        assert all(e.task is not None for e in entries)
        results = store.complete_and_ack("w1", requests)
        done += [completed_result(result).node_index for result in results]
        reconcile_run(store, "run-1", callbacks=log.callbacks)
    assert done == [0, 1, 2]
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert log.kinds() == ["completed"]
    assert store.list_deliveries() == []


def test_bq_19_budget_refusal_fails_only_its_request_and_sees_earlier_charges(
    bq_store: BatchContractStore,
) -> None:
    store = bq_store
    assert isinstance(store, DagBudgetStore)

    def sized(output_id: str, width: int) -> tuple[EmittedOutput, ...]:
        return (EmittedOutput(id=output_id, fields={}, data={"blob": "x" * width}),)

    first, middle, last = sized("a-1", 100), sized("b-1", 150), sized("c-1", 100)
    allowed = output_bytes(first) + output_bytes(last)
    # The middle batch fits the budget alone, but not after the first one.
    assert output_bytes(middle) <= allowed < output_bytes(first) + output_bytes(middle)
    new_run(store, [root("a"), root("b"), root("c")], start=False)
    assert store.try_set_run_budget("run-1", Budget(max_output_bytes=allowed))
    start_run(store, "run-1", callbacks=CallbackLog().callbacks)
    a, b, c = claim_batch(store, "w1")
    outcomes = store.complete_and_ack(
        "w1",
        [completion_request(a, first), completion_request(b, middle), completion_request(c, last)],
    )
    assert completed_result(outcomes[0]).task_id == a.delivery.task_id
    assert isinstance(outcomes[1], BudgetExhaustedError)
    assert completed_result(outcomes[2]).task_id == c.delivery.task_id
    (usage,) = store.get_run_budget("run-1")
    assert usage.used_output_bytes == allowed
    assert task(store, b.delivery.task_id).status is TaskStatus.RUNNING
    assert store.get_output_ids("run-1", 1) == ()
    assert delivery_row_ids(store) == [b.delivery.delivery_id]


def test_bq_20_batches_spanning_runs_keep_lease_and_request_order(
    bq_store: BatchContractStore,
) -> None:
    store = bq_store
    new_run(store, [node_with_priority("a", 5), node_with_priority("b", 1)], run_id="run-1")
    new_run(store, [node_with_priority("c", 3), node_with_priority("d", 0)], run_id="run-2")
    entries = claim_batch(store, "w1")
    # Lease order interleaves the runs; every claim is reported in place.
    assert [(e.delivery.run_id, e.delivery.node_index) for e in entries] == [
        ("run-1", 0),
        ("run-2", 0),
        ("run-1", 1),
        ("run-2", 1),
    ]
    for entry in entries:
        assert claimed_task(entry) == task(store, entry.delivery.task_id)
        assert entry.task is not None and entry.task.run_id == entry.delivery.run_id
    a, c, b, d = entries
    outcomes = store.complete_and_ack(
        "w1",
        [
            completion_request(d, emit("d-1")),
            completion_request(a, emit("x", "x")),
            completion_request(c, emit("c-1")),
            completion_request(b, emit("b-1")),
        ],
    )
    assert completed_result(outcomes[0]).task_id == d.delivery.task_id
    assert isinstance(outcomes[1], OutputPublicationError)
    assert completed_result(outcomes[2]).task_id == c.delivery.task_id
    assert completed_result(outcomes[3]).task_id == b.delivery.task_id
    assert delivery_row_ids(store, "run-1") == [a.delivery.delivery_id]
    assert store.list_deliveries("run-2") == []
    assert task(store, a.delivery.task_id).status is TaskStatus.RUNNING
    assert [store.get_output_ids("run-1", i) for i in (0, 1)] == [(), ("b-1",)]
    assert [store.get_output_ids("run-2", i) for i in (0, 1)] == [("c-1",), ("d-1",)]


def _recent_resolver(store: BatchContractStore) -> Callable[..., Mapping[str, ResolvedOutput]]:
    recent = StoreCapabilities.of(store).recent_outputs
    if recent is None:
        pytest.skip("the store keeps no recently committed outputs")
    return cast(Callable[..., Mapping[str, ResolvedOutput]], recent.resolve_recent_outputs)


def _texts(found: Mapping[str, ResolvedOutput]) -> list[tuple[str, object, object]]:
    return [(key, dict(value.fields), dict(value.data)) for key, value in found.items()]


def test_bq_21_recently_committed_outputs_resolve_as_the_table_does(
    bq_store: BatchContractStore,
) -> None:
    # A worker resolves the inputs of the tasks it claims through
    # resolve_recent_outputs: outputs the store committed itself may come
    # from memory, and must come out exactly as resolve_outputs reads them.
    store = bq_store
    recent = _recent_resolver(store)
    new_run(store, [root("a"), child("c", "a")])
    (entry,) = claim_batch(store)
    outputs = (
        EmittedOutput(id="a-1", fields={"k": 1}, data={"path": "/a/1", "n": [1, 2]}),
        EmittedOutput(id="a-2", fields={"k": 2}, data={}),
    )
    completed_result(store.complete_and_ack("w1", [completion_request(entry, outputs)])[0])
    for ids in (("a-2", "a-1"), ("a-1",), ("a-1", "a-1"), ("a-1", "missing"), ()):
        assert _texts(recent("run-1", ids)) == _texts(store.resolve_outputs("run-1", ids))
    found = recent("run-1", ("a-1",))["a-1"]
    assert found.id == "a-1" and dict(found.data) == {"path": "/a/1", "n": [1, 2]}
    # Each call parses afresh: what one plugin changes, the next never sees.
    cast(list[int], found.data["n"]).append(3)
    assert dict(recent("run-1", ("a-1",))["a-1"].data) == {"path": "/a/1", "n": [1, 2]}
    # Another run's outputs of the same IDs are not these.
    assert recent("run-2", ("a-1",)) == store.resolve_outputs("run-2", ("a-1",)) == {}


def test_bq_22_outputs_of_a_rolled_back_unit_are_not_remembered(
    bq_store: BatchContractStore,
) -> None:
    store = bq_store
    recent = _recent_resolver(store)
    if not isinstance(store, UnitOfWorkStore):
        pytest.skip("the store offers no units of work")
    new_run(store, [root("a"), child("c", "a")])
    (entry,) = claim_batch(store)
    request = completion_request(entry, emit("a-1"))
    try:
        with store.unit_of_work():
            completed_result(store.complete_and_ack("w1", [request])[0])
            raise LookupError("roll the unit back")
    except LookupError:
        pass
    assert store.resolve_outputs("run-1", ("a-1",)) == {}
    assert recent("run-1", ("a-1",)) == {}
    assert task(store, entry.delivery.task_id).status is TaskStatus.RUNNING
    with store.unit_of_work():
        completed_result(store.complete_and_ack("w1", [request])[0])
    assert _texts(recent("run-1", ("a-1",))) == _texts(store.resolve_outputs("run-1", ("a-1",)))
    assert list(recent("run-1", ("a-1",))) == ["a-1"]


def test_bq_23_an_output_id_an_earlier_call_took_fails_only_its_request(
    bq_store: BatchContractStore,
) -> None:
    # SQLite inserts outputs without first reading which IDs are taken and
    # decides the batch again when the insert meets one: alone, as the first
    # write of a unit of work and as a later one, the outcome is the same.
    store = bq_store
    new_run(store, [root(slug) for slug in "abcdefg"])
    a, b, c, d, e, f, g = claim_batch(store, "w1")
    completed_result(store.complete_and_ack("w1", [completion_request(a, emit("a-1"))])[0])

    def refuse_b_complete_c(taker: ClaimedDelivery, other: ClaimedDelivery) -> None:
        before = task(store, taker.delivery.task_id)
        taken, done = store.complete_and_ack(
            "w1",
            [
                completion_request(taker, emit("a-1")),
                completion_request(other, emit(f"ok-{other.delivery.node_index}")),
            ],
        )
        assert isinstance(taken, OutputPublicationError) and "already exist" in str(taken)
        assert completed_result(done).task_id == other.delivery.task_id
        assert task(store, taker.delivery.task_id) == before
        assert store.get_output_ids("run-1", taker.delivery.node_index) == ()
        assert taker.delivery.delivery_id in delivery_row_ids(store)
        assert other.delivery.delivery_id not in delivery_row_ids(store)

    refuse_b_complete_c(b, c)
    done = [2]
    if isinstance(store, UnitOfWorkStore):
        with store.unit_of_work():
            refuse_b_complete_c(d, e)  # the unit's first write
            refuse_b_complete_c(f, g)  # a later one
        done += [4, 6]
    assert [store.get_output_ids("run-1", i) for i in done] == [(f"ok-{i}",) for i in done]
    assert store.get_output_ids("run-1", 0) == ("a-1",)
