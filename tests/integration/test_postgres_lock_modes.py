"""The three run-row lock modes of the PostgreSQL store (``queries.sql``, Locking).

Batch claims share the run row (FOR KEY SHARE) with each other and with
completions (FOR NO KEY UPDATE), so workers claiming a run's tasks no longer
queue behind every completion of that run; every other transition locks the
run exclusively (FOR UPDATE) and so still waits for, and shuts out, both. Two
claims of one task serialise on the task's row. A transaction never moves to a
stronger mode (the gateway refuses). Each test runs real transactions against
the server and observes lock waits in ``pg_stat_activity``.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from pg_locks import until_waiting_for_a_lock

from dagwerk._store_extensions import CompletionOutcome
from dagwerk.backends.postgres import PostgresStore
from dagwerk.backends.postgres._statements import RUN_LOCK_MODES, run_lock_mode
from dagwerk.backends.postgres.gateway import QUERIES
from dagwerk.constants import TaskStatus
from dagwerk.orchestrator import reconcile_run
from dagwerk.store import ClaimedDelivery, CompletionRequest, LeasedDelivery, TaskCompletionResult
from dagwerk.testing.helpers import child, emit, new_run, root, tasks_of

RUN_ID = "run-1"
CLAIM, COMPLETION, EXCLUSIVE = (RUN_LOCK_MODES[m] for m in ("KEY SHARE", "NO KEY UPDATE", "UPDATE"))


@pytest.fixture
def label() -> str:
    return f"dagwerk-modes-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def store(postgres_url: str, pg_schema: str, label: str) -> Iterator[PostgresStore]:
    """Two root nodes: one task RUNNING (claimed), one QUEUED with its queue row."""
    store = PostgresStore(postgres_url, schema=pg_schema, application_name=label, pool_size=4)
    new_run(store, [root("a"), root("b")], RUN_ID)
    (first,) = store.claim_deliveries("w1", limit=1, lease_seconds=60.0)
    assert first.task is not None
    yield store
    store.close()


T = TypeVar("T")


def _task_in(store: PostgresStore, status: TaskStatus) -> str:
    (task_id,) = [
        t.task_id for n in (0, 1) for t in tasks_of(store, RUN_ID, n) if t.status is status
    ]
    return task_id


def _in_thread(work: Callable[[], T]) -> tuple[threading.Thread, list[T | Exception]]:
    outcome: list[T | Exception] = []

    def body() -> None:
        try:
            outcome.append(work())
        except Exception as exc:  # reported to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


def _claim(store: PostgresStore) -> Callable[[], list[ClaimedDelivery]]:
    return lambda: store.claim_deliveries("w2", limit=4, lease_seconds=60.0)


def test_the_blocks_lock_runs_in_their_modes() -> None:
    modes = {name: q.run_lock for name, q in QUERIES.items() if q.run_lock}
    assert modes.pop("tasks_claimable_many") == CLAIM
    assert modes.pop("tasks_get_owned_many") == COMPLETION
    assert modes.pop("task_get_completing") == COMPLETION
    # Everything else that locks a run is exclusive.
    assert modes and set(modes.values()) == {EXCLUSIVE}, modes
    assert {"run_get", "run_head", "task_get_owned", "gated_run_lock"} <= set(modes)


def test_the_exclusive_form_of_each_block_locks_its_run_for_update() -> None:
    """What a unit of work's first locking block sends (``PostgresGateway.unit``):
    the run row in exclusive mode, a lineage's root as exclusive blocks lock it."""
    root_mode = "FOR NO KEY UPDATE"
    for name, statement in QUERIES.items():
        if not statement.run_lock:
            continue
        exclusive = [p.decode() for p in statement.exclusive_preludes]
        assert run_lock_mode([*exclusive, statement.main.decode()]) == EXCLUSIVE, name
        for given, sent in zip(statement.preludes, exclusive, strict=True):
            if "root_run_id" in sent and run_lock_mode([sent]):
                assert sent.endswith(root_mode) or given.decode() == sent, name
        if statement.run_lock == EXCLUSIVE:
            assert exclusive == [p.decode() for p in statement.preludes], name


def test_a_claim_does_not_wait_for_a_completion_of_its_run(
    store: PostgresStore, postgres_url: str, label: str
) -> None:
    running = _task_in(store, TaskStatus.RUNNING)
    queued = _task_in(store, TaskStatus.QUEUED)
    with store._gw.write() as tx:
        # A completion's first read: it holds the run row until it commits.
        tx.all("tasks_get_owned_many", {"ids": json.dumps([running]), "first": running})
        thread, outcome = _in_thread(_claim(store))
        thread.join(20)
        assert not thread.is_alive(), "the claim waited for the completion"
    assert isinstance(outcome[0], list), outcome
    (claimed,) = outcome[0]
    assert claimed.task is not None and claimed.task.task_id == queued


def test_an_exclusive_transition_shuts_claims_out_until_it_commits(
    store: PostgresStore, postgres_url: str, label: str
) -> None:
    queued = _task_in(store, TaskStatus.QUEUED)
    with store._gw.write() as tx:
        tx.one("run_get", {"run_id": RUN_ID})  # e.g. the first read of a cancel
        thread, outcome = _in_thread(_claim(store))
        until_waiting_for_a_lock(postgres_url, label, "the claim")
        assert thread.is_alive() and outcome == []
    thread.join(20)
    assert not thread.is_alive()
    assert isinstance(outcome[0], list), outcome
    (claimed,) = outcome[0]
    assert claimed.task is not None and claimed.task.task_id == queued


def test_two_claims_of_one_task_serialise_on_its_row(
    store: PostgresStore, postgres_url: str, label: str
) -> None:
    queued = tasks_of(store, RUN_ID, 1)[0]
    assert queued.status is TaskStatus.QUEUED
    # Two queue rows for one attempt (a redelivery racing the first).
    leased = [
        LeasedDelivery(
            delivery_id=f"d{i}",
            task_id=queued.task_id,
            attempt_id=queued.attempt_id,
            generation=queued.generation,
            run_id=RUN_ID,
            node_index=1,
            launch_id="l",
            queue="default",
            priority=0,
            delivery_count=1,
            worker_id=f"w{i}",
            lease_expires_at=0.0,
        )
        for i in (1, 2)
    ]
    with store._gw.write() as first:
        assert store._claim_many(first, leased[:1]) != [None]

        def second() -> object:
            with store._gw.write() as tx:
                return store._claim_many(tx, leased[1:])

        thread, outcome = _in_thread(second)
        until_waiting_for_a_lock(postgres_url, label, "the claim")
    thread.join(20)
    assert not thread.is_alive()
    # The later claim saw the earlier one's commit: not claimed twice.
    assert outcome == [[None]]
    assert tasks_of(store, RUN_ID, 1)[0].status is TaskStatus.RUNNING


def test_a_transaction_never_takes_a_stronger_run_lock(store: PostgresStore) -> None:
    running = _task_in(store, TaskStatus.RUNNING)
    with store._gw.write() as tx:
        tx.all("tasks_get_owned_many", {"ids": json.dumps([running]), "first": running})
        tx.one("run_get_locked", {"run_id": RUN_ID})  # no prelude: allowed
        tx.one("task_get_completing", {"task_id": running})  # same mode: allowed
        with pytest.raises(AssertionError, match="upgrade"):
            tx.one("run_get", {"run_id": RUN_ID})
    with store._gw.write() as tx:
        tx.one("run_get", {"run_id": RUN_ID})
        # A weaker mode after a stronger one holds nothing new.
        tx.all("tasks_get_owned_many", {"ids": json.dumps([running]), "first": running})


def test_a_completion_counts_its_launch_from_the_counter_it_read_under_the_lock(
    store: PostgresStore, postgres_url: str, label: str
) -> None:
    """A batch of completions learns whether it completed a launch from the
    counter read with its tasks, after its run lock was granted: a completion
    of the same launch that held the lock meanwhile has moved the counter by
    then, so exactly one completion of the launch reports it complete."""
    log = new_run(store, [root("a"), child("c", "a")], "run-2")
    (entry,) = [
        e
        for e in store.claim_deliveries("w1", limit=4, lease_seconds=60.0)
        if e.delivery.run_id == "run-2"
    ]
    (completed,) = _complete_all(store, [entry], "a")
    assert isinstance(completed, TaskCompletionResult) and completed.launch_complete
    reconcile_run(store, "run-2", callbacks=log.callbacks)
    entries = [
        e
        for e in store.claim_deliveries("w1", limit=8, lease_seconds=60.0)
        if e.delivery.run_id == "run-2"
    ]
    assert len(entries) == 3  # one launch of three tasks
    first, *rest = entries
    with store._gw.write() as tx:
        # A completion of the launch's first task, not yet committed: it holds
        # the run in completion mode and has moved the counter.
        done = store._complete(tx, first.delivery.task_id, emit("c-0"), first.delivery.attempt_id)
        assert done is not None and not done.launch_complete
        thread, outcome = _in_thread(lambda: _complete_all(store, rest, "c"))
        until_waiting_for_a_lock(postgres_url, label, "the batch of completions")
        assert thread.is_alive() and outcome == []
    thread.join(20)
    assert not thread.is_alive()
    (results,) = outcome
    assert isinstance(results, list), results
    finished = [r for r in results if isinstance(r, TaskCompletionResult)]
    assert len(finished) == len(results), results
    assert [r.launch_complete for r in finished] == [False, True]


def _complete_all(
    store: PostgresStore, entries: list[ClaimedDelivery], prefix: str
) -> list[CompletionOutcome]:
    return list(
        store.complete_and_ack(
            "w1",
            [
                CompletionRequest(
                    task_id=e.delivery.task_id,
                    expected_attempt_id=e.delivery.attempt_id,
                    outputs=emit(*(f"{prefix}-{e.delivery.task_id}-{k}" for k in range(3))),
                    delivery_id=e.delivery.delivery_id,
                )
                for e in entries
            ],
        )
    )
