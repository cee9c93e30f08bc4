"""Launches that insert their tasks claimed for the claim ahead of their unit
of work (SQLite; ``backends/sql/_ahead.py``).

A worker announces its claim ahead (``expect_claim``) at the start of its
completion unit; a launch in that unit then writes the tasks the claim would
take first already claimed and leased. These tests hold that to what the
claim would have done: the same rows in the end, the queue's order and the
worker's queues honoured, nothing handed over that a later write of the unit
undid, and no announcement outliving its unit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import pytest

from dagwerk.backends.memory.store import MemoryStore
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import TaskStatus
from dagwerk.frontier import reconcile_after_completion
from dagwerk.models import EmittedOutput
from dagwerk.orchestrator import cancel_run
from dagwerk.store import (
    ClaimedDelivery,
    CompletionRequest,
    LeasedDelivery,
    TaskCompletionResult,
    TaskRecord,
)
from dagwerk.testing.helpers import CallbackLog, chain, new_run

_NOW = 1_000.0
_CHILD = "run-1:1:0:0"


def _store(tmp_path: Path, name: str) -> SqliteStore:
    return SqliteStore(f"sqlite:///{tmp_path / name}", clock=lambda: _NOW)


def _root_completed(store: SqliteStore, run_id: str = "run-1") -> CallbackLog:
    """A chain of three as ``run_id`` whose root a worker ``w0`` took from the
    queue and completed (not yet reconciled: node 1 is not launched)."""
    log = new_run(store, chain(3), run_id)
    (claim,) = store.claim_deliveries("w0", limit=1, lease_seconds=30.0)
    row = claim.delivery
    output = EmittedOutput(id="o0", fields={"n": 0})
    request = CompletionRequest(row.task_id, row.attempt_id, (output,), row.delivery_id)
    (done,) = store.complete_and_ack("w0", [request])
    assert isinstance(done, TaskCompletionResult)
    return log


def _unit(
    store: SqliteStore,
    log: CallbackLog,
    *,
    expect: bool = True,
    limit: int = 4,
    queues: list[str] | None = None,
    runs: tuple[str, ...] = ("run-1",),
) -> list[ClaimedDelivery]:
    """One unit: announce the claim (with ``expect``), reconcile each of
    ``runs`` after its root (launching its node 1), claim ahead. ``log``
    collects the callbacks."""
    with store.unit_of_work():
        if expect:
            assert store.expect_claim("w1", limit=limit, lease_seconds=30.0, queues=queues)
        for run_id in runs:
            reconcile_after_completion(store, run_id, [0], callbacks=log.callbacks)
        return store.claim_deliveries("w1", limit=limit, lease_seconds=30.0, queues=queues)


def _rows(store: SqliteStore, task_id: str) -> tuple[dict[str, object], dict[str, object]]:
    """The stored task and delivery rows of ``task_id``, without their random IDs."""
    drop = {"attempt_id", "delivery_id", "seq"}
    with store._sqlite.read() as tx:
        found = [
            tx._conn.execute(f"SELECT * FROM {table} WHERE task_id = ?", (task_id,)).fetchall()
            for table in ("dagwerk_tasks", "dagwerk_deliveries")
        ]
    (task,), (delivery,) = found
    # (A sqlite3.Row iterates its values: its columns come from keys().)
    return (
        {k: task[k] for k in task.keys() if k not in drop},  # noqa: SIM118
        {k: delivery[k] for k in delivery.keys() if k not in drop},  # noqa: SIM118
    )


class _Outcome(NamedTuple):
    rows: tuple[dict[str, object], dict[str, object]]
    lease: LeasedDelivery
    claimed: TaskRecord
    stored: TaskRecord
    statements: Counter[str]


def test_a_claimed_launch_leaves_the_rows_and_claims_a_claim_would(
    tmp_path: Path, statements: Counter[str]
) -> None:
    found: dict[bool, _Outcome] = {}
    for expect in (False, True):
        store = _store(tmp_path, f"rows-{expect}.db")
        try:
            log = _root_completed(store)
            statements.clear()
            (claim,) = _unit(store, log, expect=expect)
            stored = store.get_task(_CHILD)
            assert claim.task is not None and stored is not None
            found[expect] = _Outcome(
                _rows(store, _CHILD),
                replace(claim.delivery, delivery_id="", attempt_id=""),
                replace(claim.task, attempt_id=""),
                replace(stored, attempt_id=""),
                Counter(statements),
            )
        finally:
            store.close()
    plain, claimed = found[False], found[True]
    assert claimed[:4] == plain[:4]  # rows, lease, record as claimed, record as stored
    task_row, delivery_row = claimed.rows
    assert task_row["status"] == TaskStatus.RUNNING.value and task_row["worker_id"] == "w1"
    assert delivery_row["lease_owner"] == "w1" and delivery_row["delivery_count"] == 1
    assert delivery_row["available_at"] == delivery_row["lease_expires_at"] == _NOW + 30.0
    # Two updates fewer, one look at the queue in place of the claim's.
    assert plain.statements["queue_lease"] == plain.statements["task_claim"] == 1
    assert claimed.statements["queue_lease"] == claimed.statements["task_claim"] == 0
    assert claimed.statements["queue_candidates"] == plain.statements["queue_candidates"] == 1


def test_an_older_row_the_claim_would_take_first_keeps_the_launch_queued(
    tmp_path: Path,
) -> None:
    # run-2's root was queued before node 1 of run-1 is launched: a claim of
    # one takes run-2's root, so the launch must not take its task.
    with _store(tmp_path, "order.db") as store:
        log = _root_completed(store)
        new_run(store, chain(1), "run-2")
        (claim,) = _unit(store, log, limit=1)
        assert claim.delivery.run_id == "run-2" and claim.task is not None
        assert store.get_task(_CHILD).status is TaskStatus.QUEUED  # type: ignore[union-attr]


def test_with_room_for_both_the_launch_claims_and_the_claim_reads_the_rest(
    tmp_path: Path, statements: Counter[str]
) -> None:
    with _store(tmp_path, "room.db") as store:
        log = _root_completed(store)
        new_run(store, chain(1), "run-2")
        statements.clear()
        claims = _unit(store, log, limit=2)
        assert sorted(c.delivery.run_id for c in claims) == ["run-1", "run-2"]
        assert all(c.task is not None for c in claims)
        # The launch's look saw run-2's root, so the claim read the queue.
        assert statements["queue_candidates"] == 2 and statements["queue_lease"] == 1
        assert statements["task_insert_claimed"] == 1


def test_a_launch_outside_the_workers_queues_is_not_claimed(tmp_path: Path) -> None:
    with _store(tmp_path, "queues.db") as store:
        log = _root_completed(store)
        assert _unit(store, log, queues=["elsewhere"]) == []
        assert store.get_task(_CHILD).status is TaskStatus.QUEUED  # type: ignore[union-attr]


def test_a_launch_too_large_for_the_room_left_is_not_claimed(tmp_path: Path) -> None:
    # chain(3) launches one task per node; a claim of 0 rows cannot exist,
    # so the room is used up by a first launch of another run instead.
    with _store(tmp_path, "full.db") as store:
        log = _root_completed(store)
        _root_completed(store, "run-2")
        claims = _unit(store, log, limit=1, runs=("run-2", "run-1"))
        assert [c.delivery.run_id for c in claims] == ["run-2"]
        assert store.get_task(_CHILD).status is TaskStatus.QUEUED  # type: ignore[union-attr]


def test_once_waiting_rows_fill_the_room_later_launches_do_not_look(
    tmp_path: Path, statements: Counter[str]
) -> None:
    # Many runs' roots waiting (as with many small runs): the first launch
    # sees them fill the claim's room; the unit's later launches need no look.
    with _store(tmp_path, "crowded.db") as store:
        log = _root_completed(store)
        _root_completed(store, "run-2")
        new_run(store, chain(1), "run-3")
        statements.clear()
        claims = _unit(store, log, limit=1, runs=("run-1", "run-2"))
        assert [c.delivery.run_id for c in claims] == ["run-3"]
        assert statements["queue_candidates"] == 2  # the first launch's look, the claim's
        assert statements["task_insert_claimed"] == 0


def _claims_after_a_write(
    store: SqliteStore, log: CallbackLog, statements: Counter[str], write: Callable[[], object]
) -> list[ClaimedDelivery]:
    """One unit: announce, launch node 1 of run-1 claimed, ``write``, claim."""
    with store.unit_of_work():
        assert store.expect_claim("w1", limit=4, lease_seconds=30.0)
        reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
        assert write()
        statements.clear()
        return store.claim_deliveries("w1", limit=4, lease_seconds=30.0)


def test_a_write_after_the_launch_that_ends_the_run_refuses_the_claim(
    tmp_path: Path, statements: Counter[str]
) -> None:
    with _store(tmp_path, "cancel.db") as store:
        log = _root_completed(store)
        claims = _claims_after_a_write(store, log, statements, lambda: cancel_run(store, "run-1"))
        # Read again (the unit wrote since), and refused: the task is no
        # longer RUNNING in a RUNNING run.
        assert [(c.delivery.task_id, c.task) for c in claims] == [(_CHILD, None)]
        assert statements["tasks_claimable_many"] == 1


def test_a_write_after_the_launch_that_leaves_the_task_keeps_the_claim(
    tmp_path: Path, statements: Counter[str]
) -> None:
    with _store(tmp_path, "other-write.db") as store:
        log = _root_completed(store)
        claims = _claims_after_a_write(
            store, log, statements, lambda: store.create_run("run-9", chain(1))
        )
        (claim,) = claims
        assert claim.task == store.get_task(_CHILD)
        assert statements["tasks_claimable_many"] == 1  # read again once


def test_an_announcement_ends_with_its_unit(tmp_path: Path) -> None:
    with _store(tmp_path, "rollback.db") as store:
        log = _root_completed(store)
        with pytest.raises(RuntimeError, match="undone"), store.unit_of_work():
            assert store.expect_claim("w1", limit=4, lease_seconds=30.0)
            assert store.create_run("run-9", chain(1))
            raise RuntimeError("undone")
        # The next unit announces nothing: its launch stays QUEUED.
        assert _unit(store, log, expect=False) != []
        with store._sqlite.read() as tx:
            task = tx.one("task_get_owned", {"task_id": _CHILD})
        assert task is not None and task["worker_id"] == "w1"  # by the claim's update
        # Nor is anything announced outside a unit.
        assert not store.expect_claim("w1", limit=4, lease_seconds=30.0)
        assert store._claim_intents == {}
    assert not hasattr(MemoryStore(), "expect_claim")


def test_a_claim_for_another_worker_takes_nothing_claimed(tmp_path: Path) -> None:
    with _store(tmp_path, "other-worker.db") as store:
        log = _root_completed(store)
        with store.unit_of_work():
            assert store.expect_claim("w1", limit=4, lease_seconds=30.0)
            reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
            assert store.claim_deliveries("w2", limit=4, lease_seconds=30.0) == []
        # Claimed for w1 as announced: its lease runs out, then it is
        # delivered again (the sweep recovers the attempt).
        _, delivery = _rows(store, _CHILD)
        assert delivery["lease_owner"] == "w1"


def test_postgres_announces_for_the_threads_next_claim(postgres_url: str, pg_schema: str) -> None:
    # No unit of work there: the announcement lasts until the thread's next
    # claim, which ends it whether or not a launch claimed anything for it
    # (test_postgres_roundtrips.py follows a launch that does).
    from dagwerk.backends.postgres import PostgresStore

    with PostgresStore(postgres_url, schema=pg_schema) as store:
        assert store.expect_claim("w1", limit=4, lease_seconds=30.0)
        assert len(store._claim_intents) == 1
        assert store.claim_deliveries("w1", limit=4, lease_seconds=30.0) == []
        assert store._claim_intents == {}
