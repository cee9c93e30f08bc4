"""Round trips of the PostgreSQL gateway, and the guarantees pipelining keeps.

The gateway sends a transaction's ``BEGIN`` with its first statement, lock
preludes with their statement, and :meth:`send`/:meth:`many` statements
with the next flight; a read sends its ``COMMIT`` without waiting and parks
its connection for the next transaction. These tests count round trips
through a local proxy that delays the server's bytes (a round trip is a
burst of server bytes after client bytes; the delay keeps a pipelined
flight from being split by an early answer), and check that each
transaction still runs at its isolation level, holds its row locks,
commits before it returns, maps errors to the same typed errors and
survives (or reports) lost connections as an unpipelined one does.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from dagwerk.backends.errors import StoreUnavailableError
from dagwerk.backends.postgres import PostgresStore
from dagwerk.backends.postgres import gateway as pg_gateway
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.frontier import reconcile_after_completion
from dagwerk.models import EmittedOutput
from dagwerk.orchestrator import reconcile_run
from dagwerk.store import (
    CompletionRequest,
    InvalidStoreValueError,
    StoreContractError,
    TaskCompletionResult,
)
from dagwerk.testing.contract_queue import FakeClock
from dagwerk.testing.helpers import (
    assert_queued_tasks_deliverable,
    chain,
    emit,
    new_run,
    root,
    tasks_of,
)
from dagwerk.testing.pg_proxy import DelayProxy

# Long enough that a preempted client on a loaded machine still finishes a
# flight before the first answer of the flight reaches it.
DELAY = 0.02


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = f"rt_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[DelayProxy]:
    found = DelayProxy(postgres_url, DELAY)
    yield found
    found.stop()


def _label() -> str:
    return f"dagwerk-rt-{uuid.uuid4().hex[:8]}"


def _admin(url: str, schema: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, options=f"-c search_path={schema}")


def _kill(url: str, label: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (label,),
        ).fetchall()
    return len(rows)


# -- round trips ------------------------------------------------------------------------


def test_a_write_costs_one_round_trip_per_result_plus_its_commit(
    proxy: DelayProxy, schema: str
) -> None:
    """BEGIN rides the first flight and lock preludes ride their statement:
    a write with one locked read (two preludes) and one update costs three
    round trips (it cost six before: BEGIN, three statements, UPDATE,
    COMMIT)."""
    with PostgresStore(proxy.url, schema=schema) as store:
        new_run(store, chain(2))
        gateway = store._pg
        with proxy.count() as total, gateway.write() as tx:
            with proxy.count() as first:
                row = tx.one("run_status", {"run_id": "run-1"})
            with proxy.count() as second:
                changed = tx.run(
                    "run_set_status", {"run_id": "run-1", "old": "running", "new": "running"}
                )
        assert row is not None and row["status"] == "running"
        assert changed == 1
        assert (first, second, total) == ([1], [1], [3])


def test_a_read_costs_one_round_trip(proxy: DelayProxy, schema: str) -> None:
    """A read waits only for its statement; its COMMIT goes out without a
    wait and the next transaction collects the acknowledgement."""
    with PostgresStore(proxy.url, schema=schema) as store:
        new_run(store, chain(2))
        for _ in range(3):
            with proxy.count() as trips:
                assert store.get_run_status("run-1") is RunStatus.RUNNING
            assert trips == [1]
        with proxy.count() as trips, store._pg.read() as tx:
            tx.one("run_status", {"run_id": "run-1"})
            tx.all("tasks_of_run", {"run_id": "run-1", "all": 1})
        assert trips == [2]


def test_a_lone_read_sends_its_statement_alone(
    proxy: DelayProxy, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-statement read (``read_one``, e.g. the run's status before a
    task runs) sends no BEGIN and no COMMIT; its connection is parked and
    the transactions after it, reads and writes, run as before."""
    sent: list[bytes] = []
    execute = psycopg.Connection.execute

    def recording(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(query if isinstance(query, bytes) else str(query).encode())
        return execute(self, query, *args, **kwargs)

    with PostgresStore(proxy.url, schema=schema) as store:
        new_run(store, chain(2))
        monkeypatch.setattr(psycopg.Connection, "execute", recording)
        for _ in range(2):
            sent.clear()
            with proxy.count() as trips:
                assert store.get_run_status("run-1") is RunStatus.RUNNING
            assert trips == [1]
            assert [q.split()[0] for q in sent] == [b"SELECT"], sent
        with proxy.count() as trips, store._pg.write() as tx:
            tx.run("run_set_status", {"run_id": "run-1", "old": "running", "new": "pending"})
        assert trips == [2]  # the statement with its preludes, the COMMIT
        assert store.get_run_status("run-1") is RunStatus.PENDING


def test_deferred_statements_ride_the_next_flight(proxy: DelayProxy, schema: str) -> None:
    with PostgresStore(proxy.url, schema=schema) as store:
        new_run(store, chain(2))
        with proxy.count() as trips, store._pg.write() as tx:
            tx.one("run_status", {"run_id": "run-1"})  # 1
            with proxy.count() as sent:
                tx.send("run_set_status", {"run_id": "run-1", "old": "x", "new": "y"})
                tx.send("run_set_status", {"run_id": "run-1", "old": "y", "new": "x"})
            tx.one("run_get", {"run_id": "run-1"})  # 2, with both sends
        assert sent == [0]
        assert trips == [3]  # and the COMMIT


def test_an_empty_transaction_sends_nothing(proxy: DelayProxy, schema: str) -> None:
    with PostgresStore(proxy.url, schema=schema) as store:
        with proxy.count() as trips:
            with store._pg.write():
                pass
            with store._pg.read():
                pass
        assert trips == [0]


def test_store_operations_wait_only_for_the_results_they_use(
    proxy: DelayProxy, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For every operation of a worker's cycle: round trips = statements whose
    result the store reads + 1 for a write's COMMIT (0 for a read's)."""
    waited: list[int] = []
    writes: list[bool] = []
    original = pg_gateway.PostgresTx._call

    def counting(self: Any, kind: str, *args: Any) -> Any:
        if kind in ("one", "all", "run"):
            waited.append(1)
        if self._write and not writes:
            writes.append(True)
        return original(self, kind, *args)

    monkeypatch.setattr(pg_gateway.PostgresTx, "_call", counting)
    with PostgresStore(proxy.url, schema=schema) as store:
        new_run(store, chain(2))

        @contextmanager
        def expect(name: str) -> Iterator[None]:
            waited.clear()
            writes.clear()
            with proxy.count() as trips:
                yield
            expected = len(waited) + (1 if writes else 0)
            assert trips == [expected], (name, trips, len(waited), bool(writes))

        with expect("dequeue"):
            (row,) = store.dequeue("w", limit=1, lease_seconds=60.0)
        with expect("get_run_status"):
            store.get_run_status("run-1")
        with expect("try_claim_task"):
            assert store.try_claim_task(
                row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0
            )
        with expect("try_complete_task"):
            assert store.try_complete_task(row.task_id, (), expected_attempt_id=row.attempt_id)
        with expect("ack"):
            assert store.ack(row.delivery_id, "w")


def test_several_reads_share_one_flight(proxy: DelayProxy, schema: str) -> None:
    """``all_of`` sends its reads (each with its lock preludes) together."""
    with PostgresStore(proxy.url, schema=schema) as store:
        new_run(store, chain(2))
        queries: list[tuple[str, dict[str, object]]] = [
            ("run_status", {"run_id": "run-1"}),
            ("tasks_of_run", {"run_id": "run-1", "all": 1}),
        ]
        with store._pg.write() as tx:
            apart = [tx.all(name, params) for name, params in queries]
        for kind in ("write", "read"):
            with proxy.count() as trips, getattr(store._pg, kind)() as tx:
                together = tx.all_of(queries)
            assert together == apart
            assert trips == [2 if kind == "write" else 1]  # a write's COMMIT waits


def test_a_batch_of_completions_costs_three_round_trips(proxy: DelayProxy, schema: str) -> None:
    """A ``complete_and_ack`` of one run's tasks: the read that groups them by
    run, then in the write the tasks with their taken output IDs and their
    launches' counters, and every write with the COMMIT. (It cost seven
    before: the taken IDs, the counter update, the counter's read and the
    run's budget accounts were round trips of their own; the accounts are
    still read once per run, by its first completion.)"""
    with PostgresStore(proxy.url, schema=schema) as store:
        new_run(store, [root("a"), root("b"), root("c")])
        claimed = store.claim_deliveries("w", limit=3, lease_seconds=60.0)
        requests = []
        for row in claimed:
            assert row.task is not None
            requests.append(
                CompletionRequest(
                    delivery_id=row.delivery.delivery_id,
                    task_id=row.task.task_id,
                    expected_attempt_id=row.task.attempt_id,
                    outputs=emit(f"out-{row.task.node_index}", k=1),
                )
            )
        trips = []
        outcomes: list[object] = []
        for request in requests:  # each root node is a launch of its own
            with proxy.count() as each:
                outcomes += store.complete_and_ack("w", [request])
            trips += each
        assert all(isinstance(o, TaskCompletionResult) for o in outcomes), outcomes
        assert trips == [4, 3, 3]


def test_a_batch_that_names_its_runs_costs_two_round_trips(proxy: DelayProxy, schema: str) -> None:
    """As a worker sends it, each request naming its task's run: no read
    groups them (the run's budget accounts are still read by its first
    completion)."""
    with PostgresStore(proxy.url, schema=schema) as store:
        new_run(store, [root("a"), root("b"), root("c")])
        claimed = store.claim_deliveries("w", limit=3, lease_seconds=60.0)
        trips = []
        for entry in claimed:
            row = entry.delivery
            request = CompletionRequest(
                row.task_id,
                row.attempt_id,
                emit(f"out-{row.node_index}"),
                row.delivery_id,
                row.run_id,
            )
            with proxy.count() as each:
                (outcome,) = store.complete_and_ack("w", [request])
            assert isinstance(outcome, TaskCompletionResult), outcome
            trips += each
        assert trips == [3, 2, 2]


def _root_completed(
    store: PostgresStore,
    outputs: tuple[EmittedOutput, ...],
    run_id: str | None = "run-1",
    *,
    announce: bool = False,
) -> Any:
    """A two-node chain whose root was claimed by ``w`` and completed with
    ``outputs`` (``run_id``: the run the completion names); its log. With
    ``announce``, ``w`` announces its next claim (one task) after claiming
    the root, before completing it, as a worker does."""
    log = new_run(store, chain(2))
    (entry,) = store.claim_deliveries("w", limit=1, lease_seconds=60.0)
    if announce:
        assert store.expect_claim("w", limit=1, lease_seconds=60.0)
    request = CompletionRequest(
        delivery_id=entry.delivery.delivery_id,
        task_id=entry.delivery.task_id,
        expected_attempt_id=entry.delivery.attempt_id,
        outputs=outputs,
        run_id=run_id,
    )
    (outcome,) = store.complete_and_ack("w", [request])
    assert isinstance(outcome, TaskCompletionResult) and outcome.launch_complete
    return log


def _launch_recorded(
    proxy: DelayProxy,
    schema: str,
    monkeypatch: pytest.MonkeyPatch,
    outputs: tuple[EmittedOutput, ...],
    then: Callable[[PostgresStore], None] = lambda store: None,
) -> tuple[list[int], list[tuple[str, str]]]:
    """Complete the root of a two-node chain with ``outputs`` and reconcile:
    the round trips of the child's launch and its calls (kind, block);
    ``then(store)`` runs before the store closes."""
    calls: list[tuple[str, str]] = []
    original = pg_gateway.PostgresTx._call

    def recording(self: Any, kind: str, name: str, *args: Any) -> Any:
        calls.append((kind, name))
        return original(self, kind, name, *args)

    monkeypatch.setattr(pg_gateway.PostgresTx, "_call", recording)
    launched: list[tuple[list[int], list[tuple[str, str]]]] = []
    with PostgresStore(proxy.url, schema=schema) as store:
        log = _root_completed(store, outputs, run_id=None)
        launch = store.try_create_node_launch

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.clear()
            with proxy.count() as trips:
                result = launch(*args, **kwargs)
            launched.append((trips, list(calls)))
            return result

        monkeypatch.setattr(store, "try_create_node_launch", counted)
        reconcile_run(store, "run-1", callbacks=log.callbacks)
        then(store)
    ((trips, made),) = launched
    return trips, made


def _waited(made: list[tuple[str, str]]) -> list[str]:
    return [name for kind, name in made if kind in ("one", "all", "all_of", "run")]


def test_a_launch_waits_only_for_its_reads_and_its_commit(
    proxy: DelayProxy, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launch row, its tasks and deliveries and the node's revision are
    sent without waiting and ride the COMMIT: a launch costs the round trips
    of the reads it uses plus one (the launch row and the revision each
    waited for a round trip of their own before)."""
    trips, made = _launch_recorded(proxy, schema, monkeypatch, emit("out-0", k=1))
    waited = _waited(made)
    assert ("launch_insert" in waited, "node_bump" in waited) == (False, False), made
    assert trips == [len(waited) + 1], made


def test_a_large_launch_sends_its_rows_in_slices_without_waiting_for_them(
    proxy: DelayProxy, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch's task and delivery rows go in slices of 250 (tasks, then
    their deliveries, slice after slice): the server inserts one slice while
    the next is built and encoded. No slice waits for a round trip, and
    every task gets its delivery."""

    def launched(store: PostgresStore) -> None:
        assert len(tasks_of(store, "run-1", 1)) == 600
        assert_queued_tasks_deliverable(store, "run-1")

    outputs = emit(*(f"out-{n}" for n in range(600)), k=1)
    # The proxy counts a round trip whenever the server's answer to a slice
    # comes back before the client sent the next one; a client slowed down
    # by a loaded machine can make that happen without waiting for it, so
    # the count can only come out too high. A launch that waited would be
    # too high every time: up to three launches, each in a schema of its own.
    extra: list[int] = []
    for attempt in range(3):
        name = f"{schema}_{attempt}"
        try:
            trips, made = _launch_recorded(proxy, name, monkeypatch, outputs, launched)
        finally:
            monkeypatch.undo()
            with _admin(proxy.url, "public") as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        # Each slice's writes go together, as one statement (many_of).
        parts = [
            part.removesuffix(" (set)")
            for kind, label in made
            for part in (label.split(" + ") if kind == "together" else [label])
        ]
        inserts = [name for name in parts if name in ("task_insert", "delivery_insert")]
        assert inserts == ["task_insert", "delivery_insert"] * 3, made
        assert [kind for kind, label in made if "task_insert" in label] == ["together"] * 3
        extra.append(trips[0] - (len(_waited(made)) + 1))
        if extra[-1] == 0:
            break
    assert 0 in extra, extra


def test_the_reconcile_after_a_chain_step_costs_four_round_trips(
    proxy: DelayProxy, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a chain step completes, the reads of each store call go in one
    flight: the frontier (the run and the nodes), the child's planning
    snapshot (the run, the sources' launches, the token's nodes and the
    sources' outputs) and the launch's reads (the run under its lock, the
    token's nodes, the node's launch and the outputs the plans name); the
    launch's writes ride its COMMIT. Four round trips in all (twelve when
    each read waited for its own)."""
    with PostgresStore(proxy.url, schema=schema) as store:
        log = _root_completed(store, emit("out-0", k=1))
        counted: dict[str, list[int]] = {}

        def counting(name: str) -> None:
            call = getattr(store, name)

            def wrapped(*args: Any, **kwargs: Any) -> Any:
                with proxy.count() as trips:
                    result = call(*args, **kwargs)
                counted.setdefault(name, []).extend(trips)
                return result

            monkeypatch.setattr(store, name, wrapped)

        for name in ("get_run_frontier", "get_planning_snapshot", "try_create_node_launch"):
            counting(name)
        with proxy.count() as total:
            reconcile_after_completion(store, "run-1", {0}, callbacks=log.callbacks)
        assert counted == {
            "get_run_frontier": [1],
            "get_planning_snapshot": [1],
            "try_create_node_launch": [2],
        }
        assert total == [4]
        (child,) = tasks_of(store, "run-1", 1)
        assert child.status is TaskStatus.QUEUED
        assert_queued_tasks_deliverable(store, "run-1")


def test_a_launch_claims_its_task_for_the_claim_its_thread_announced(
    proxy: DelayProxy, schema: str
) -> None:
    """A worker announces its next claim before its completions; the
    launch its reconcile makes inserts the child already claimed for it and
    leased to it, committed with the launch, and the claim hands it over
    with no round trip (a lease and a claim, two commits, before). Another
    worker finds nothing to lease, and the child completes the run."""
    with (
        PostgresStore(proxy.url, schema=schema) as store,
        PostgresStore(proxy.url, schema=schema) as other,
    ):
        log = _root_completed(store, emit("out-0", k=1), announce=True)
        reconcile_after_completion(store, "run-1", {0}, callbacks=log.callbacks)
        assert other.claim_deliveries("x", limit=5, lease_seconds=60.0) == []
        with proxy.count() as trips:
            (child,) = store.claim_deliveries("w", limit=1, lease_seconds=60.0)
        assert trips == [0]
        assert child.delivery.node_index == 1 and child.delivery.delivery_count == 1
        assert child.delivery.worker_id == "w"
        assert child.task is not None and child.task.status is TaskStatus.RUNNING
        (stored,) = tasks_of(other, "run-1", 1)
        assert stored.status is TaskStatus.RUNNING and stored.attempt_id == child.task.attempt_id
        done = CompletionRequest(
            delivery_id=child.delivery.delivery_id,
            task_id=child.delivery.task_id,
            expected_attempt_id=child.delivery.attempt_id,
            outputs=(),
            run_id="run-1",
        )
        (outcome,) = store.complete_and_ack("w", [done])
        assert isinstance(outcome, TaskCompletionResult) and outcome.launch_complete
        reconcile_after_completion(store, "run-1", {1}, callbacks=log.callbacks)
        assert store.get_run_status("run-1") is RunStatus.COMPLETED
        assert store.claim_deliveries("w", limit=1, lease_seconds=60.0) == []


def test_a_batch_claims_lease_is_one_round_trip_with_its_commit(
    proxy: DelayProxy, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch claim's lease picks, leases and commits in one statement sent
    with its COMMIT: one round trip (two before: the candidates, then the
    leases with the COMMIT), and an empty queue's look costs one too."""
    with PostgresStore(proxy.url, schema=schema) as store:
        new_run(store, [root("a"), root("b")])
        counted: list[tuple[list[int], int]] = []
        lease = store._lease

        def counting(*args: Any, **kwargs: Any) -> Any:
            with proxy.count() as trips:
                found = lease(*args, **kwargs)
            counted.append((trips, len(found)))
            return found

        monkeypatch.setattr(store, "_lease", counting)
        entries = store.claim_deliveries("w", limit=8, lease_seconds=60.0)
        assert len(entries) == 2 and all(entry.task is not None for entry in entries)
        assert store.claim_deliveries("w", limit=8, lease_seconds=60.0) == []
    assert counted == [([1], 2), ([1], 0)]


def test_the_leases_of_a_first_round_survive_a_failed_second_round(
    postgres_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch claim that meets a used-up row takes a second round to reach
    past it. The first round's leases are committed: if the second round
    fails they still reach the caller (else they would wait out their lease)."""
    clock = FakeClock()
    with PostgresStore(postgres_url, schema=schema, clock=clock, max_deliveries=1) as store:
        new_run(store, [root("a"), root("b"), root("c")])
        (used,) = store.dequeue("w", limit=1, lease_seconds=60.0)
        assert store.nack(used.delivery_id, "w")  # first in line again, used up
        write = store._pg.write
        rounds = 0

        def second_round_fails() -> Any:
            nonlocal rounds
            rounds += 1
            if rounds == 2:
                raise StoreUnavailableError("the second round's connection was lost")
            return write()

        monkeypatch.setattr(store._pg, "write", second_round_fails)
        entries = store.claim_deliveries("w2", limit=2, lease_seconds=60.0)
        monkeypatch.undo()
        assert rounds >= 2
        (entry,) = entries
        assert entry.delivery.task_id not in (used.task_id,)
        assert entry.task is not None and entry.task.status is TaskStatus.RUNNING
        (letter,) = store.list_dead_letters()
        assert letter.delivery_id == used.delivery_id


def test_a_statement_sent_with_its_commit_commits_with_it_or_not_at_all(
    postgres_url: str, schema: str
) -> None:
    """``all_committing``: the rows come back committed (another connection
    sees them before the transaction's block ends); a failing statement
    commits nothing and leaves the store usable."""
    with PostgresStore(postgres_url, schema=schema) as store:
        new_run(store, [root("a")])
        params: dict[str, object] = {
            "now": 1e12,
            "queues": None,
            "plugins": None,
            "run_id": None,
            "worker_id": "w",
            "expires": 2e12,
            "max_deliveries": 10,
        }
        with _admin(postgres_url, schema) as admin:

            def owners() -> list[object]:
                rows = admin.execute("SELECT lease_owner FROM dagwerk_deliveries").fetchall()
                return [row[0] for row in rows]

            with pytest.raises(InvalidStoreValueError), store._pg.write() as tx:
                tx.all_committing("queue_lease_next", {**params, "limit": -1})
            assert owners() == [None]
            with store._pg.write() as tx:
                (row,) = tx.all_committing("queue_lease_next", {**params, "limit": 5})
                assert row["leased"] and row["lease_owner"] is None  # as it was
                assert owners() == ["w"]  # committed already
                with pytest.raises(AssertionError):
                    tx.all_committing("queue_lease_next", {**params, "limit": 5})
            assert owners() == ["w"]
            # The store goes on after the failed statement: the lease holds.
            assert store.dequeue("other", limit=5, lease_seconds=60.0) == []


# -- guarantees ---------------------------------------------------------------------------


def test_isolation_levels_and_snapshots_are_kept(postgres_url: str, schema: str) -> None:
    with (
        PostgresStore(postgres_url, schema=schema) as store,
        PostgresStore(postgres_url, schema=schema) as other,
    ):
        new_run(store, chain(2))
        with store._pg.write() as tx:
            tx.one("run_status", {"run_id": "run-1"})
            level = tx._conn.execute("SHOW transaction_isolation").fetchone()
            assert level == {"transaction_isolation": "read committed"}
        with store._pg.read() as tx:
            first = tx.one("run_status", {"run_id": "run-1"})
            level = tx._conn.execute("SHOW transaction_isolation").fetchone()
            read_only = tx._conn.execute("SHOW transaction_read_only").fetchone()
            assert level == {"transaction_isolation": "repeatable read"}
            assert read_only == {"transaction_read_only": "on"}
            # A change committed meanwhile stays invisible to the snapshot.
            assert other.try_cancel_run("run-1")
            assert tx.one("run_status", {"run_id": "run-1"}) == first
        assert store.get_run_status("run-1") is RunStatus.CANCELLED


def test_lock_preludes_hold_their_row_locks(postgres_url: str, schema: str) -> None:
    with PostgresStore(postgres_url, schema=schema) as store, _admin(postgres_url, schema) as admin:
        new_run(store, chain(2))
        nowait = "SELECT 1 FROM dagwerk_runs WHERE run_id = 'run-1' FOR UPDATE NOWAIT"
        with store._pg.write() as tx:
            tx.one("run_status", {"run_id": "run-1"})
            with pytest.raises(psycopg.errors.LockNotAvailable):
                admin.execute(nowait)
        with store._pg.write() as tx:
            # A deferred block's preludes lock too, by its next flight.
            tx.send("run_status", {"run_id": "run-1"})
            tx.one("tasks_of_run", {"run_id": "run-1", "all": 1})
            with pytest.raises(psycopg.errors.LockNotAvailable):
                admin.execute(nowait)
        assert admin.execute(nowait).fetchone() == (1,)


def test_a_write_is_committed_when_it_returns(postgres_url: str, schema: str) -> None:
    with PostgresStore(postgres_url, schema=schema) as store, _admin(postgres_url, schema) as admin:
        new_run(store, chain(2))
        for old, new in (("running", "pending"), ("pending", "running")):
            with store._pg.write() as tx:
                tx.send("run_set_status", {"run_id": "run-1", "old": old, "new": new})
            status = admin.execute("SELECT status FROM dagwerk_runs WHERE run_id = 'run-1'")
            assert status.fetchone() == (new,)


def test_a_read_ends_its_snapshot_without_another_call(postgres_url: str, schema: str) -> None:
    """The parked connection's COMMIT and Sync are on the wire: the server
    ends the snapshot and goes idle with no further client action."""
    label = _label()
    with (
        PostgresStore(postgres_url, schema=schema, application_name=label) as store,
        psycopg.connect(postgres_url, autocommit=True) as admin,
    ):
        new_run(store, chain(2))
        assert store.get_run_status("run-1") is RunStatus.RUNNING
        deadline = time.monotonic() + 10
        while True:
            rows = admin.execute(
                "SELECT state, backend_xmin, xact_start FROM pg_stat_activity "
                "WHERE application_name = %s",
                (label,),
            ).fetchall()
            if all(row == ("idle", None, None) for row in rows) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert rows and all(row == ("idle", None, None) for row in rows)


def test_a_deferred_error_fails_the_transaction_with_its_own_type(
    postgres_url: str, schema: str
) -> None:
    with PostgresStore(postgres_url, schema=schema) as store:
        new_run(store, chain(2))
        # The node rows exist: the insert violates their primary key, at
        # the commit, and the status change before it is rolled back.
        with (
            pytest.raises(StoreContractError, match="node_insert") as caught,
            store._pg.write() as tx,
        ):
            tx.run("run_set_status", {"run_id": "run-1", "old": "running", "new": "pending"})
            tx.many("node_insert", [{"run_id": "run-1", "node_index": 0}])
        assert "constraint" in str(caught.value)
        assert store.get_run_status("run-1") is RunStatus.RUNNING
        # Raised by the next call that waits, naming the deferred block.
        with pytest.raises(StoreContractError, match="node_insert"), store._pg.write() as tx:
            tx.one("run_status", {"run_id": "run-1"})
            tx.send("node_insert", {"run_id": "run-1", "node_index": 1})
            tx.one("run_get", {"run_id": "run-1"})
        # The connection is usable afterwards.
        assert store.get_run_status("run-1") is RunStatus.RUNNING


def test_parked_and_pooled_connections_lost_between_calls_are_replaced(
    postgres_url: str, schema: str
) -> None:
    label = _label()
    with PostgresStore(postgres_url, schema=schema, application_name=label, pool_size=2) as store:
        new_run(store, chain(2))
        for _ in range(3):
            assert store.get_run_status("run-1") is RunStatus.RUNNING  # parks
            assert _kill(postgres_url, label) >= 1
            # The read's COMMIT and this write's first flight share the dead
            # connection; the write moves to a new one and runs once.
            with store._pg.write() as tx:
                assert (
                    tx.run(
                        "run_set_status", {"run_id": "run-1", "old": "running", "new": "pending"}
                    )
                    == 1
                )
            assert _kill(postgres_url, label) >= 1
            assert store.get_run_status("run-1") is RunStatus.PENDING
            assert _kill(postgres_url, label) >= 1
            with store._pg.write() as tx:
                tx.run("run_set_status", {"run_id": "run-1", "old": "pending", "new": "running"})


def test_a_write_that_loses_its_connection_before_commit_is_unavailable(
    postgres_url: str, schema: str
) -> None:
    label = _label()
    with PostgresStore(postgres_url, schema=schema, application_name=label, pool_size=2) as store:
        new_run(store, chain(2))
        with pytest.raises(StoreUnavailableError) as caught, store._pg.write() as tx:
            tx.one("run_status", {"run_id": "run-1"})
            tx.send("run_set_status", {"run_id": "run-1", "old": "running", "new": "pending"})
            _kill(postgres_url, label)
        assert caught.value.code == "store_unavailable"
        assert store.get_run_status("run-1") is RunStatus.RUNNING


def test_threads_never_wait_for_a_parked_connection(postgres_url: str, schema: str) -> None:
    """With fewer connections than threads, reads and writes of every thread
    finish: a connection is parked only while no thread waits for one."""
    with PostgresStore(postgres_url, schema=schema, pool_size=1, reconnect_timeout=5.0) as store:
        new_run(store, chain(2))
        errors: list[BaseException] = []

        def work() -> None:
            try:
                for n in range(40):
                    if n % 3:
                        assert store.get_run_status("run-1") is RunStatus.RUNNING
                    else:
                        with store._pg.write() as tx:
                            tx.one("run_status", {"run_id": "run-1"})
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        begun = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert time.monotonic() - begun < 30


def test_close_closes_parked_connections(postgres_url: str, schema: str) -> None:
    label = _label()
    store = PostgresStore(postgres_url, schema=schema, application_name=label)
    new_run(store, chain(2))
    store.get_run_status("run-1")
    assert store._pg.connections._parked
    store.close()
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (label,)
            ).fetchone()
            if left == (0,):
                break
            time.sleep(0.02)
        assert left == (0,)
    with pytest.raises(StoreUnavailableError):
        store.get_run_status("run-1")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_leaves_the_parents_parked_connection_alone(
    postgres_url: str, schema: str
) -> None:
    with PostgresStore(postgres_url, schema=schema) as store:
        new_run(store, chain(2))
        assert store.get_run_status("run-1") is RunStatus.RUNNING  # parks
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            ok = False
            try:
                ok = store.get_run_status("run-1") is RunStatus.RUNNING
                gc.collect()  # the parent's parked objects are collected here
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's parked connection still speaks a clean protocol.
        for _ in range(3):
            assert store.get_run_status("run-1") is RunStatus.RUNNING
            with store._pg.write() as tx:
                assert tx.one("run_status", {"run_id": "run-1"}) is not None
