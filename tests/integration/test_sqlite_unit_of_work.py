"""One transaction for a worker's completions and the launches they cause
(SQLite's ``UnitOfWorkStore``).

Inside ``store.unit_of_work()`` the calling thread's store calls share one
write transaction: nothing is visible to other connections before the block
ends, an exception rolls the whole block back, a call that raises undoes only
its own writes, reads see the block's writes, and other threads wait. The
worker completes a batch and launches the ready children in one such block;
the run callbacks fire only once it has committed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dagwerk import completions
from dagwerk._protocols import implements
from dagwerk.backends.errors import StoreFullError, StoreUnavailableError
from dagwerk.backends.memory.store import MemoryStore
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.engine import Engine
from dagwerk.models import DagNode
from dagwerk.orchestrator import OrchestratorCallbacks
from dagwerk.runtime.worker import Worker
from dagwerk.store import (
    ClaimedDelivery,
    CompletionRequest,
    InvalidStoreValueError,
    OutputPublicationError,
    StoreContractError,
    TaskCompletionResult,
    UnitOfWorkStore,
)
from dagwerk.testing.helpers import chain, emit, new_run, root

_NODES = [DagNode(slug="a", plugin="p")]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "db.sqlite"


def test_sqlite_offers_units_of_work_and_memory_does_not(db: Path) -> None:
    with SqliteStore(str(db)) as store:
        assert isinstance(store, UnitOfWorkStore)
        assert implements(store, UnitOfWorkStore)
    assert not isinstance(MemoryStore(), UnitOfWorkStore)


def test_savepoint_journals_stay_in_memory(db: Path) -> None:
    # A joined call's savepoint journals the pages it changes; on a temporary
    # file (SQLite's default past 64 KiB) a batch's writes cost ~3x more.
    with SqliteStore(str(db)) as store, store._sqlite.read() as tx:
        assert tx._conn.execute("PRAGMA temp_store").fetchone()[0] == 2  # MEMORY


def test_nothing_is_visible_before_the_block_ends(db: Path) -> None:
    with SqliteStore(str(db)) as store, SqliteStore(str(db)) as other:
        with store.unit_of_work():
            assert store.create_run("r1", _NODES)
            assert store.create_run("r2", _NODES)
            # The block's own reads see its writes ...
            assert store.get_run_status("r1") is RunStatus.PENDING
            # ... another connection sees none of them yet.
            assert other.get_run_status("r1") is None
        assert other.get_run_status("r1") is RunStatus.PENDING
        assert other.get_run_status("r2") is RunStatus.PENDING


def test_an_exception_rolls_the_whole_block_back(db: Path) -> None:
    with SqliteStore(str(db)) as store:
        with pytest.raises(RuntimeError, match="boom"), store.unit_of_work():
            assert store.create_run("r1", _NODES)
            raise RuntimeError("boom")
        assert store.get_run_status("r1") is None
        assert store.create_run("r1", _NODES)  # the store is usable afterwards


def test_a_call_that_raises_undoes_only_its_own_writes(db: Path) -> None:
    with SqliteStore(str(db)) as store, SqliteStore(str(db)) as other:
        with store.unit_of_work():
            assert store.create_run("r1", _NODES)
            with pytest.raises(InvalidStoreValueError):
                store.create_run("", _NODES)  # refused: writes nothing
            assert store.create_run("r2", _NODES)
        assert other.get_run_status("r1") is RunStatus.PENDING
        assert other.get_run_status("r2") is RunStatus.PENDING


def _scratch_tables(store: SqliteStore) -> int:
    with store._sqlite.read() as tx:
        found: int = tx._conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE name LIKE 'scratch%'"
        ).fetchone()[0]
    return found


def test_a_raising_write_inside_a_block_leaves_no_partial_rows(db: Path) -> None:
    with SqliteStore(str(db)) as store:
        gateway = store._sqlite
        with store.unit_of_work():
            with pytest.raises(RuntimeError), gateway.write() as tx:
                tx._conn.execute("CREATE TABLE scratch (a)")
                raise RuntimeError("after a write")
            assert _scratch_tables(store) == 0


def test_a_raising_later_write_leaves_no_partial_rows_and_keeps_the_earlier_ones(
    db: Path,
) -> None:
    with SqliteStore(str(db)) as store, SqliteStore(str(db)) as other:
        gateway = store._sqlite
        with store.unit_of_work():
            assert store.create_run("r1", _NODES)
            with pytest.raises(RuntimeError), gateway.write() as tx:
                tx._conn.execute("CREATE TABLE scratch (a)")
                raise RuntimeError("after a write")
            assert store.create_run("r2", _NODES)
        assert other.get_run_status("r1") is RunStatus.PENDING
        assert other.get_run_status("r2") is RunStatus.PENDING
        assert _scratch_tables(other) == 0


def test_a_raising_first_write_gives_the_write_lock_back_and_the_next_one_begins_afresh(
    db: Path,
) -> None:
    with SqliteStore(str(db)) as store, SqliteStore(str(db)) as other:
        gateway = store._sqlite
        conn = gateway._connection()
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        with store.unit_of_work():
            with pytest.raises(RuntimeError), gateway.write() as tx:
                tx._conn.execute("CREATE TABLE scratch (a)")
                raise RuntimeError("after a write")
            # Rolled back: the lock is free for another connection meanwhile.
            meanwhile = threading.Thread(target=other.create_run, args=("r0", _NODES))
            meanwhile.start()
            meanwhile.join(5)
            assert not meanwhile.is_alive()
            assert store.create_run("r1", _NODES)
            assert store.create_run("r2", _NODES)
        conn.set_trace_callback(None)
        assert other.get_run_status("r1") is RunStatus.PENDING
        assert other.get_run_status("r2") is RunStatus.PENDING
        assert _scratch_tables(other) == 0
        # Each transaction's first write runs without a savepoint; the
        # second write of the block needs one.
        assert statements.count("BEGIN IMMEDIATE") == 2
        assert statements.count("ROLLBACK") == 1
        assert statements.count("SAVEPOINT dagwerk_call") == 1
        assert statements.count("RELEASE dagwerk_call") == 1


def test_an_all_or_nothing_block_runs_its_writes_without_savepoints(db: Path) -> None:
    with SqliteStore(str(db)) as store, SqliteStore(str(db)) as other:
        conn = store._sqlite._connection()
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        with store.unit_of_work():
            with store.unit_of_work(all_or_nothing=True):
                assert store.create_run("r1", _NODES)  # the first write
                assert store.create_run("r2", _NODES)
            assert store.create_run("r3", _NODES)  # after the block: guarded again
        conn.set_trace_callback(None)
        assert statements.count("SAVEPOINT dagwerk_call") == 1
        assert [other.get_run_status(r) for r in ("r1", "r2", "r3")] == [RunStatus.PENDING] * 3


def test_every_ended_write_moves_the_write_mark_and_a_read_does_not(db: Path) -> None:
    # What a unit read stays valid (its cached frontier, snapshot, fresh
    # tasks) only until the unit's next write ends: each kind of joined
    # write must move the mark, a joined read must not.
    with SqliteStore(str(db)) as store:
        gateway = store._sqlite
        assert gateway.write_mark() is None  # outside a unit
        with store.unit_of_work():
            assert gateway.write_mark() is None  # nothing written yet
            assert store.create_run("r1", _NODES)  # the first write
            first = gateway.write_mark()
            assert first is not None
            assert store.get_run_status("r1") is RunStatus.PENDING
            with gateway.read() as tx:
                assert tx.one("run_status", {"run_id": "r1"}) is not None
            assert gateway.write_mark() == first  # reads leave it
            assert store.create_run("r2", _NODES)  # guarded (a savepoint)
            guarded = gateway.write_mark()
            assert guarded != first
            with store.unit_of_work(all_or_nothing=True):
                assert store.create_run("r3", _NODES)  # unguarded
                unguarded = gateway.write_mark()
                assert unguarded not in (first, guarded)
                with gateway.read() as tx:
                    assert tx.one("run_status", {"run_id": "r3"}) is not None
                assert gateway.write_mark() == unguarded


def test_a_swallowed_failure_in_an_all_or_nothing_block_dooms_the_unit(db: Path) -> None:
    with SqliteStore(str(db)) as store, SqliteStore(str(db)) as other:
        gateway = store._sqlite
        unit = store.unit_of_work(all_or_nothing=True)
        with pytest.raises(StoreContractError, match="all-or-nothing"), unit:
            assert store.create_run("r1", _NODES)
            try:
                with gateway.write() as tx:
                    tx._conn.execute("CREATE TABLE scratch_a (a)")
                    raise RuntimeError("after a write, and swallowed")
            except RuntimeError:
                pass
            # Whatever comes later in the unit is refused ...
            with pytest.raises(StoreContractError, match="all-or-nothing"):
                store.create_run("r2", _NODES)
            with pytest.raises(StoreContractError, match="all-or-nothing"):
                store.get_run_status("r1")
        # ... and nothing of the unit is kept, the half-done write included.
        assert other.get_run_status("r1") is None
        assert _scratch_tables(other) == 0
        assert store.create_run("r1", _NODES)  # the gateway is usable again
        assert other.get_run_status("r1") is RunStatus.PENDING


def test_a_failure_leaving_an_all_or_nothing_block_rolls_the_unit_back(db: Path) -> None:
    with SqliteStore(str(db)) as store, SqliteStore(str(db)) as other:
        gateway = store._sqlite
        with pytest.raises(RuntimeError, match="leaves"), store.unit_of_work(all_or_nothing=True):
            assert store.create_run("r1", _NODES)
            with gateway.write() as tx:
                tx._conn.execute("CREATE TABLE scratch_b (a)")
                raise RuntimeError("leaves the unit")
        assert other.get_run_status("r1") is None
        assert _scratch_tables(other) == 0


def test_an_optimistic_completion_reads_taken_ids_where_it_could_not_be_undone(
    db: Path,
) -> None:
    # complete_and_ack inserts outputs without reading the taken IDs only
    # where a failed insert is undone alone; in an all-or-nothing block after
    # the unit's first write it reads them, so a taken ID is refused (not a
    # doomed unit).
    with SqliteStore(str(db)) as store:
        new_run(store, [root("a"), root("b")])
        first, second = store.claim_deliveries("w1", limit=2, lease_seconds=30.0)

        def request(entry: ClaimedDelivery) -> CompletionRequest:
            row = entry.delivery
            return CompletionRequest(row.task_id, row.attempt_id, emit("same"), row.delivery_id)

        assert isinstance(store.complete_and_ack("w1", [request(first)])[0], TaskCompletionResult)
        with store.unit_of_work(all_or_nothing=True):
            assert store.create_run("r-other", _NODES)  # the unit's first write
            (refused,) = store.complete_and_ack("w1", [request(second)])
        assert isinstance(refused, OutputPublicationError)
        assert store.get_run_status("r-other") is RunStatus.PENDING


def test_blocks_nest(db: Path) -> None:
    with SqliteStore(str(db)) as store, SqliteStore(str(db)) as other:
        with store.unit_of_work():
            with store.unit_of_work():
                assert store.create_run("r1", _NODES)
            assert other.get_run_status("r1") is None  # still the outer block's
        assert other.get_run_status("r1") is RunStatus.PENDING


def test_the_block_takes_the_write_lock_at_its_first_write(db: Path) -> None:
    with SqliteStore(str(db)) as store, SqliteStore(str(db)) as other:
        with store.unit_of_work():
            # Before the block writes, it holds no lock: another connection
            # writes, and the block's read (a transaction of its own) sees it.
            early = threading.Thread(target=other.create_run, args=("r0", _NODES))
            early.start()
            early.join(5)
            assert not early.is_alive()
            assert store.get_run_status("r0") is RunStatus.PENDING
            assert store.create_run("r1", _NODES)
            # From the first write on, the block holds the write lock.
            thread = threading.Thread(target=other.create_run, args=("r2", _NODES))
            thread.start()
            thread.join(0.2)
            assert thread.is_alive()
        thread.join(5)
        assert other.get_run_status("r1") is RunStatus.PENDING
        assert other.get_run_status("r2") is RunStatus.PENDING


def test_other_threads_wait_for_the_block(db: Path) -> None:
    with SqliteStore(str(db)) as store:
        seen: list[RunStatus | None] = []
        started = threading.Event()

        def read() -> None:
            started.set()
            seen.append(store.get_run_status("r1"))

        with store.unit_of_work():
            assert store.create_run("r1", _NODES)
            thread = threading.Thread(target=read)
            thread.start()
            assert started.wait(5)
            thread.join(0.2)
            assert thread.is_alive()  # blocked on the block's connection
        thread.join(5)
        assert seen == [RunStatus.PENDING]


def test_a_worker_launches_the_next_step_in_its_completion_commit(db: Path) -> None:
    engine = Engine(f"sqlite:///{db}")
    for name in ("n0", "n1", "n2"):  # chain() names each plugin after its node
        engine.plugin(name)(lambda inputs, ctx: [{"n": 1}])
    nodes = chain(3)
    run_id = engine.submit(nodes)
    store = engine.store
    assert isinstance(store, SqliteStore)
    conn = store._sqlite._connection()
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    worker = engine.worker(concurrency=1)
    worker.process_once()  # the root: claim, run, complete + launch b
    conn.set_trace_callback(None)
    assert engine.store.get_run_status(run_id) is RunStatus.RUNNING
    # Two write transactions: the claim, and the completion that also
    # launched the child (it used to take a third for the launch).
    assert sum(1 for s in statements if s == "BEGIN IMMEDIATE") == 2
    assert any("INSERT INTO dagwerk_deliveries" in s for s in statements)
    worker.run_until_idle()
    assert engine.store.get_run_status(run_id) is RunStatus.COMPLETED


def test_run_callbacks_fire_after_the_block_commits(db: Path) -> None:
    engine = Engine(f"sqlite:///{db}")
    engine.plugin("step")(lambda inputs, ctx: [{"n": 1}])
    run_id = engine.submit([DagNode(slug="a", plugin="step")])
    seen: list[RunStatus | None] = []

    def completed(finished: str) -> None:
        # Another connection already sees the terminal status.
        with SqliteStore(str(db)) as other:
            seen.append(other.get_run_status(finished))

    def unexpected(finished: str) -> None:
        raise AssertionError(f"run {finished} did not complete")

    callbacks = OrchestratorCallbacks(completed, unexpected, unexpected, unexpected)
    worker = engine.worker(concurrency=4, callbacks=callbacks)
    worker.run_until_idle()
    assert seen == [RunStatus.COMPLETED]
    assert engine.store.get_run_status(run_id) is RunStatus.COMPLETED


def test_deferred_callbacks_each_fire_once_even_when_one_raises() -> None:
    deferred = completions._DeferredCallbacks()
    deferred.callbacks.on_run_failed("r1")
    deferred.callbacks.on_run_completed("r2")
    fired: list[str] = []

    def failing(run_id: str) -> None:
        fired.append(run_id)
        raise RuntimeError("callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        deferred.fire(OrchestratorCallbacks(fired.append, failing, fired.append, fired.append))
    assert fired == ["r1", "r2"]


def _chain_engine(db: Path, steps: int = 3) -> tuple[Engine, str]:
    engine = Engine(f"sqlite:///{db}")
    for n in range(steps):  # chain() names each plugin after its node
        engine.plugin(f"n{n}")(lambda inputs, ctx: [{"n": 1}])
    return engine, engine.submit(chain(steps))


def _statements(store: object, action: Callable[[], object]) -> list[str]:
    assert isinstance(store, SqliteStore)
    conn = store._sqlite._connection()
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        action()
    finally:
        conn.set_trace_callback(None)
    return seen


def test_the_completion_commit_claims_the_next_batch(db: Path) -> None:
    engine, run_id = _chain_engine(db)
    worker = engine.worker(concurrency=4)
    worker.process_once()  # the root: claim, run, complete + launch n1 + claim it
    (child,) = [t for t in engine.store.list_tasks(run_id) if t.node_index == 1]
    assert child.status is TaskStatus.RUNNING  # claimed in the root's completion commit
    assert engine.store.list_attempts(child.task_id)[-1].worker_id == worker.worker_id
    # The next batch needs no claim of its own: one write transaction, the
    # completion (which launches and claims n2).
    statements = _statements(engine.store, worker.process_once)
    assert statements.count("BEGIN IMMEDIATE") == 1
    worker.run_until_idle()
    assert engine.store.get_run_status(run_id) is RunStatus.COMPLETED


def _stop_releases_and_another_worker_finishes(engine: Engine, worker: Worker, run_id: str) -> None:
    worker.stop()
    assert [r.action for r in worker.reports][-1] == "released"
    # Released at once, not left to its 30 s lease: another worker recovers
    # the claimed task under a new attempt and finishes the run.
    other = engine.worker(concurrency=4)
    other.run_until_idle()
    assert engine.store.get_run_status(run_id) is RunStatus.COMPLETED


def _fail_in_a_joined_write(store: SqliteStore, run_id: str, message: str) -> None:
    """A write joined to the caller's unit that writes, then raises."""
    with store._sqlite.write() as tx:
        tx.run("run_status", {"run_id": run_id})
        raise StoreUnavailableError(message)


def test_a_stopping_worker_gives_back_what_it_claimed_ahead(db: Path) -> None:
    engine, run_id = _chain_engine(db)
    worker = engine.worker(concurrency=4)
    worker.process_once()
    (child,) = [t for t in engine.store.list_tasks(run_id) if t.node_index == 1]
    assert child.status is TaskStatus.RUNNING
    _stop_releases_and_another_worker_finishes(engine, worker, run_id)


def test_a_store_fault_while_giving_back_the_claim_ahead_is_one_line(
    db: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A worker stopping while its disk is full cannot give back what it
    # claimed ahead: it says so once, without a traceback, and leaves the
    # deliveries to their leases.
    engine, _ = _chain_engine(db)
    worker = engine.worker(concurrency=4)
    worker.process_once()
    assert len(worker.claimed_ahead) == 1

    def full(*args: Any, **kwargs: Any) -> None:
        raise StoreFullError("commit failed: database or disk is full", target=str(db))

    monkeypatch.setattr(engine.store, "nack", full)
    with caplog.at_level(logging.WARNING):
        worker.stop()
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(records) == 1, [r.getMessage() for r in records]
    assert "giving back 1 deliveries claimed ahead failed" in records[0].getMessage()
    assert records[0].exc_info is None
    assert worker.claimed_ahead == []


def test_a_stop_after_the_claim_was_announced_still_hands_over_and_releases(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stop lands inside the completion unit, after the worker announced
    # its claim: the launch inserts n1 claimed all the same, so the claim
    # ahead must still take it (and the stop give it back), or it would
    # wait out its lease.
    engine, run_id = _chain_engine(db)
    worker = engine.worker(concurrency=4)
    store = engine.store
    real = store.expect_claim

    def expect_then_stop(*args: Any, **kwargs: Any) -> bool:
        announced: bool = real(*args, **kwargs)
        worker.stopping.set()  # as stop() sets it, from another thread
        return announced

    monkeypatch.setattr(store, "expect_claim", expect_then_stop)
    worker.process_once()
    (child,) = [t for t in store.list_tasks(run_id) if t.node_index == 1]
    assert child.status is TaskStatus.RUNNING  # claimed by its launch
    assert [c.delivery.task_id for c in worker.claimed_ahead] == [child.task_id]
    _stop_releases_and_another_worker_finishes(engine, worker, run_id)


def test_a_failed_claim_ahead_keeps_the_completions(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, run_id = _chain_engine(db)
    worker = engine.worker(concurrency=4)
    store = engine.store
    real = store.claim_deliveries
    calls: list[float] = []
    # No launch claims its tasks for the claim ahead here (see the next test).
    monkeypatch.setattr(store, "expect_claim", lambda *args, **kwargs: False)

    def claim(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["wait_seconds"])
        if len(calls) == 2:  # the claim ahead, inside the root's completion unit
            _fail_in_a_joined_write(store, run_id, "claim failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "claim_deliveries", claim)
    worker.process_once()
    assert calls[1] == 0.0
    statuses = {t.node_index: t.status for t in store.list_tasks(run_id)}
    assert statuses == {0: TaskStatus.COMPLETED, 1: TaskStatus.QUEUED}
    assert worker.claimed_ahead == []
    worker.run_until_idle()
    assert store.get_run_status(run_id) is RunStatus.COMPLETED


def test_a_failed_queue_read_still_hands_over_what_the_launches_claimed(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The launch in the root's completion unit inserted its task claimed for
    # the claim ahead; the claim's own read of the queue then fails (and is
    # undone), but the claimed task commits with its launch and must reach
    # the worker, not wait for its lease to run out.
    engine = Engine(f"sqlite:///{db}")
    others: list[str] = []

    def first(inputs: object, ctx: object) -> object:
        if not others:  # a run whose root then waits beside the launch
            others.append(engine.submit(chain(1)))
        return [{"n": 1}]

    engine.plugin("n0")(first)
    for n in (1, 2):
        engine.plugin(f"n{n}")(lambda inputs, ctx: [{"n": 1}])
    run_id = engine.submit(chain(3))
    worker = engine.worker(concurrency=4)
    store = engine.store
    real = store._dequeue
    failed: list[int] = []

    def dequeue(*args: Any, **kwargs: Any) -> Any:
        if store._sqlite.write_mark() is not None:  # inside the completion unit
            failed.append(kwargs["limit"])
            _fail_in_a_joined_write(store, run_id, "queue read failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "_dequeue", dequeue)
    worker.process_once()  # the root; its completion unit launches n1 claimed
    assert failed == [3]  # the claim read for the waiting root (room 4 - 1)
    statuses = {t.node_index: t.status for t in store.list_tasks(run_id)}
    assert statuses == {0: TaskStatus.COMPLETED, 1: TaskStatus.RUNNING}
    assert [t.status for t in store.list_tasks(others[0])] == [TaskStatus.QUEUED]
    assert [c.delivery.node_index for c in worker.claimed_ahead] == [1]
    assert [c.task is not None for c in worker.claimed_ahead] == [True]
    worker.run_until_idle()
    assert store.get_run_status(run_id) is RunStatus.COMPLETED
    assert store.get_run_status(others[0]) is RunStatus.COMPLETED
