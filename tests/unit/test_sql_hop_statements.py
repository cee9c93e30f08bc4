"""The SQL store's reconcile after a completion reads what the hop needs, not
the whole run: its statements neither name every node or launch of
the run nor grow with the run's size."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import Counter
from pathlib import Path

import pytest

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.backends.sqlite import gateway as sqlite_gateway
from dagwerk.constants import (
    InputMode,
    InputRole,
    LaunchCreateStatus,
    NodeDisposition,
    RunStatus,
)
from dagwerk.engine import Engine
from dagwerk.execution import claim_task
from dagwerk.frontier import reconcile_after_completion
from dagwerk.models import EmittedOutput, PlannedEdgeInput, PlanningSnapshot, TaskInputPlan
from dagwerk.store import (
    CompletionRequest,
    InvalidStoreValueError,
    TaskCompletionResult,
)
from dagwerk.testing.helpers import CallbackLog, chain, child, new_run, only_task, root

# Blocks that read every node or launch of a run, or the run's definitions.
_WHOLE_RUN_READS = {"nodes_of_run", "launches_active", "launch_task_ids_of_run", "run_get"}


def _hop(
    store: SqliteStore,
    log: CallbackLog,
    node_index: int,
    outputs: tuple[EmittedOutput, ...] | None = None,
) -> None:
    record = only_task(store, "run-1", node_index)
    won = claim_task(
        store,
        record.task_id,
        expected_attempt_id=record.attempt_id,
        expected_generation=record.generation,
    )
    assert won is not None
    if outputs is None:
        outputs = (EmittedOutput(id=f"o{node_index}", fields={"n": node_index}),)
    result = store.try_complete_task(record.task_id, outputs, expected_attempt_id=won.attempt_id)
    assert result is not None and result.launch_complete


def _snapshot(store: SqliteStore, node_index: int, sources: dict[str, int]) -> PlanningSnapshot:
    """A planning snapshot of run-1's node with generous limits."""
    return store.get_planning_snapshot(
        "run-1",
        node_index,
        sources,
        max_outputs_per_edge=100,
        max_outputs_total=100,
        max_routing_bytes=10_000,
    )


def _root_done(store: SqliteStore, length: int) -> CallbackLog:
    """A chain of ``length`` as run-1 whose root completed and launched node 1."""
    log = new_run(store, chain(length))
    _hop(store, log, 0)
    reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
    return log


def _reconcile_statements(tmp_path: Path, statements: Counter[str], length: int) -> Counter[str]:
    """The statements of the reconcile after the 6th hop of a chain."""
    store = SqliteStore(f"sqlite:///{tmp_path / f'chain-{length}.db'}")
    try:
        log = new_run(store, chain(length))
        for index in range(5):
            _hop(store, log, index)
            reconcile_after_completion(store, "run-1", [index], callbacks=log.callbacks)
        _hop(store, log, 5)
        statements.clear()
        reconcile_after_completion(store, "run-1", [5], callbacks=log.callbacks)
        found = Counter(statements)
        assert 6 in store.list_node_launches("run-1")
        return found
    finally:
        store.close()


def test_a_hop_reads_no_whole_run_rows(tmp_path: Path, statements: Counter[str]) -> None:
    found = _reconcile_statements(tmp_path, statements, 40)
    assert not _WHOLE_RUN_READS & set(found), found
    # Frontier (2), snapshot (4), launch creation (8).
    assert sum(found.values()) <= 14, found


def test_a_hop_costs_the_same_statements_in_a_longer_chain(
    tmp_path: Path, statements: Counter[str]
) -> None:
    short = _reconcile_statements(tmp_path, statements, 10)
    long = _reconcile_statements(tmp_path, statements, 120)
    assert short == long


def test_run_activity_reads_in_three_statements(tmp_path: Path, statements: Counter[str]) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path / 'activity.db'}")
    try:
        new_run(store, chain(3))
        record = only_task(store, "run-1", 0)
        won = claim_task(
            store,
            record.task_id,
            expected_attempt_id=record.attempt_id,
            expected_generation=record.generation,
        )
        assert won is not None
        assert store.mark_task_failed(record.task_id, "boom", expected_attempt_id=won.attempt_id)
        statements.clear()
        activity = store.get_run_activity("run-1")
        assert sum(statements.values()) <= 3, statements
        assert activity is not None
        assert activity.failed_nodes == frozenset({0})
        assert [ref.task_id for ref in activity.failed_tasks] == [record.task_id]
        assert activity.failed_launches == () and activity.crashed_tasks == ()
    finally:
        store.close()


def test_a_claim_inside_a_writing_unit_looks_at_the_queue_once(
    tmp_path: Path, statements: Counter[str]
) -> None:
    """Outside a unit, an empty queue is seen by a read before the write lock
    is taken; a unit that already writes holds that lock, so its claim (the
    worker's claim ahead) goes straight to the leasing transaction."""
    store = SqliteStore(f"sqlite:///{tmp_path / 'claim.db'}")
    try:
        new_run(store, chain(2))
        statements.clear()
        assert store.claim_deliveries("w1", limit=4, lease_seconds=30.0) != []
        assert statements["queue_candidates"] == 2  # the look, then the lease
        new_run(store, chain(2), "run-2")
        with store.unit_of_work():
            assert store.create_run("run-3", chain(1))  # the unit's first write
            statements.clear()
            claimed = store.claim_deliveries("w1", limit=4, lease_seconds=30.0)
        assert [c.delivery.run_id for c in claimed] == ["run-2"]
        assert statements["queue_candidates"] == 1
    finally:
        store.close()


def _unit_hop_statements(
    tmp_path: Path, statements: Counter[str], *, write_between: bool
) -> tuple[Counter[str], object]:
    """Inside a unit of work that has written: snapshot node 2 of a chain,
    optionally write something that changes node 2's token, then launch."""
    store = SqliteStore(f"sqlite:///{tmp_path / f'unit-{write_between}.db'}")
    try:
        log = _root_done(store, 4)
        _hop(store, log, 1)  # node 2 is ready, not launched
        nodes = store.get_run_nodes("run-1")
        assert nodes is not None
        with store.unit_of_work():
            assert store.create_run("run-2", chain(1))  # the unit's first write
            snapshot = _snapshot(store, 2, {"in": 1})
            if write_between:
                with store._gw.write() as tx:
                    tx.run("node_bump", {"run_id": "run-1", "node_index": 1})
            statements.clear()
            result = store.try_create_node_launch(
                "run-1", 2, nodes[2].plugin, snapshot.token, (), NodeDisposition.SKIPPED
            )
        return Counter(statements), result.status
    finally:
        store.close()


@pytest.mark.parametrize(
    ("write_between", "status", "reads"),
    [
        # Nothing written since the snapshot: neither is read again.
        (False, LaunchCreateStatus.CREATED, 0),
        # The source's revision moved: read again, and the token is stale (OR-19).
        (True, LaunchCreateStatus.STALE, 1),
    ],
)
def test_a_launch_after_its_snapshot_in_a_unit_reads_again_only_after_a_write(
    tmp_path: Path,
    statements: Counter[str],
    write_between: bool,
    status: LaunchCreateStatus,
    reads: int,
) -> None:
    found, result = _unit_hop_statements(tmp_path, statements, write_between=write_between)
    assert result is status
    assert found["run_head"] == reads and found["nodes_of_indices"] == reads, found


def test_a_reconcile_inside_a_writing_unit_reads_each_thing_once(
    tmp_path: Path, statements: Counter[str]
) -> None:
    """The worker's hop: the launch reuses its snapshot's run row, token and
    outputs (no write came between), instead of reading them again."""
    store = SqliteStore(f"sqlite:///{tmp_path / 'unit-reconcile.db'}")
    try:
        log = _root_done(store, 4)
        with store.unit_of_work():
            _hop(store, log, 1)  # the completion: the unit's first write
            statements.clear()
            reconcile_after_completion(store, "run-1", [1], callbacks=log.callbacks)
        assert 2 in store.list_node_launches("run-1")
    finally:
        store.close()
    # The snapshot reuses the frontier's run row and launches; the launch
    # reuses the snapshot's.
    assert statements["run_frontier"] == 1 and statements["run_head"] == 0, statements
    # The frontier read the nodes with their launches; the snapshot needs
    # neither again.
    assert statements["frontier_of_nodes"] == 1, statements
    assert statements["launches_of_nodes"] == 0, statements
    assert statements["nodes_of_indices"] == 0, statements
    assert statements["outputs_valid_by_ids"] == 0, statements
    # The frontier saw that node 2 had no launch yet.
    assert statements["launch_active"] == 0, statements


def test_a_launch_the_frontier_saw_is_read_and_reported_as_existing(
    tmp_path: Path, statements: Counter[str]
) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path / 'frontier-existing.db'}")
    try:
        _root_done(store, 4)
        nodes = store.get_run_nodes("run-1")
        assert nodes is not None
        with store.unit_of_work():
            assert store.create_run("run-2", chain(1))  # the unit's first write
            frontier = store.get_run_frontier("run-1", [0, 1])
            assert frontier is not None and set(frontier.launches) == {0, 1}
            snapshot = _snapshot(store, 1, {"in": 0})
            statements.clear()
            result = store.try_create_node_launch(
                "run-1", 1, nodes[1].plugin, snapshot.token, (), NodeDisposition.SKIPPED
            )
            found = Counter(statements)
    finally:
        store.close()
    assert result.status is LaunchCreateStatus.ALREADY_EXISTS
    assert found["launch_active"] == 1, found


@pytest.mark.parametrize(
    "case",
    [
        # Nothing written, the sources among the frontier's nodes: no read.
        (False, [1, 2], {"in": 1}, (0, 0, 0)),
        # A write came between: the frontier's reads may be stale.
        (True, [1, 2], {"in": 1}, (1, 1, 1)),
        # A source the frontier did not read: its launches are read.
        (False, [1, 2], {"in": 1, "other": 3}, (0, 1, 0)),
        # The frontier did not read the node's source (the token's rows).
        (False, [2], {"in": 1}, (0, 1, 1)),
    ],
)
def test_a_snapshot_reuses_its_frontier_only_with_no_write_between(
    tmp_path: Path,
    statements: Counter[str],
    case: tuple[bool, list[int], dict[str, int], tuple[int, int, int]],
) -> None:
    between, read, sources, (head, launch_reads, node_reads) = case
    store = SqliteStore(f"sqlite:///{tmp_path / 'frontier-memo.db'}")
    try:
        log = _root_done(store, 5)
        _hop(store, log, 1)
        with store.unit_of_work():
            assert store.create_run("run-2", chain(1))  # the unit's first write
            frontier = store.get_run_frontier("run-1", read)
            assert frontier is not None and set(frontier.launches) == {1} & set(read)
            if between:
                with store._gw.write() as tx:
                    tx.run("node_bump", {"run_id": "run-1", "node_index": 1})
            statements.clear()
            snapshot = _snapshot(store, 2, sources)
            found = Counter(statements)
        # Whatever was reused, the snapshot is the one a fresh read gives.
        again = _snapshot(store, 2, sources)
        assert snapshot == again
        assert [o.id for o in snapshot.outputs_by_edge["in"]] == ["o1"]
    finally:
        store.close()
    assert found["run_head"] == head, found
    assert found["launches_of_nodes"] == launch_reads, found
    # The token's rows: the node's and its sources' in the run's topology.
    assert found["nodes_of_indices"] == node_reads, found


def test_a_plan_naming_outputs_beyond_its_snapshot_is_checked_against_the_table(
    tmp_path: Path, statements: Counter[str]
) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path / 'unit-beyond.db'}")
    try:
        log = new_run(store, [root("n0"), child("n1", "n0", mode=InputMode.ALL)])
        _hop(store, log, 0, tuple(EmittedOutput(id=f"o{n}", fields={"n": n}) for n in range(3)))
        for unit, named in (("run-2", "o9"), ("run-3", "o2")):
            with store.unit_of_work():
                assert store.create_run(unit, chain(1))  # the unit's first write
                snapshot = store.get_planning_snapshot(
                    "run-1",
                    1,
                    {"n0": 0},
                    max_outputs_per_edge=1,  # reads o0 and o1 (the overflow signal)
                    max_outputs_total=100,
                    max_routing_bytes=10_000,
                )
                edge = PlannedEdgeInput(
                    edge="n0", source_index=0, role=InputRole.MAIN, output_ids=(named,)
                )
                plan = TaskInputPlan(generation=snapshot.generation, edges=(edge,))
                statements.clear()
                if named == "o9":  # published nowhere
                    with pytest.raises(InvalidStoreValueError, match="has not published"):
                        store.try_create_node_launch(
                            "run-1", 1, "n1", snapshot.token, (plan,), None
                        )
                else:  # published, but beyond what the snapshot read
                    result = store.try_create_node_launch(
                        "run-1", 1, "n1", snapshot.token, (plan,), None
                    )
                    assert result.status is LaunchCreateStatus.CREATED
                assert statements["outputs_valid_by_ids"] == 1
    finally:
        store.close()


def test_a_worker_hop_in_a_chain_takes_17_statements(
    tmp_path: Path, statements: Counter[str]
) -> None:
    """The whole hop as the batched worker takes it on SQLite: one write
    transaction (complete, reconcile and launch without savepoints; the
    launch inserts the child claimed for the claim ahead, which then has
    nothing to read or write) and the run's status read alone; the child's
    input comes from the outputs the worker just committed: 17 statements."""
    engine = Engine(f"sqlite:///{tmp_path / 'hop.db'}")
    for n in range(12):
        engine.plugin(f"n{n}")(lambda inputs, ctx: [{"n": 1}])
    run_id = engine.submit(chain(12))
    worker = engine.worker(concurrency=4)
    for _ in range(4):
        assert worker.process_once() == 1
    store = engine.store
    assert isinstance(store, SqliteStore)
    conn = store._sqlite._connection()
    traced: list[str] = []
    hop_thread = threading.get_ident()

    def trace(statement: str) -> None:
        # The hop's own statements: the attempt monitor's periodic status
        # read (another thread) lands in a hop only when the hop is slow.
        if threading.get_ident() == hop_thread:
            traced.append(statement)

    conn.set_trace_callback(trace)
    hops = 5
    statements.clear()
    for _ in range(hops):
        assert worker.process_once() == 1
    conn.set_trace_callback(None)
    names = Counter(statements)
    # One task completes and one is claimed per hop: key lookups, no JSON
    # lists; the claimed task was launched in the same unit: not read.
    assert names["task_get_completing"] == hops and names["tasks_get_owned_many"] == 0, names
    assert names["task_get_owned"] == names["tasks_claimable_many"] == 0, names
    # Claimed as it was inserted: no lease, no claim update, one queue look.
    assert names["task_insert_claimed"] == names["delivery_insert_leased"] == hops, names
    assert names["queue_lease"] == names["task_claim"] == names["task_insert"] == 0, names
    assert names["queue_candidates"] == hops, names
    kinds = Counter(s.split()[0] for s in traced)
    assert kinds["BEGIN"] == hops and kinds["COMMIT"] == hops, kinds
    assert kinds["SAVEPOINT"] == 0, kinds
    assert len(traced) == 17 * hops, Counter(traced).most_common(5)
    worker.run_until_idle()
    assert engine.store.get_run_status(run_id) is RunStatus.COMPLETED
    engine.close()


def _launch_in_unit(store: SqliteStore, log: CallbackLog) -> None:
    """Complete node 1 of a chain and launch node 2, in the caller's unit."""
    _hop(store, log, 1)
    reconcile_after_completion(store, "run-1", [1], callbacks=log.callbacks)


def test_the_claim_after_a_launch_in_a_unit_reads_no_task_rows(
    tmp_path: Path, statements: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    read_ids: list[list[str]] = []
    execute = sqlite_gateway._Tx._execute

    def spy(self: sqlite_gateway._Tx, name: str, params: dict[str, object]) -> object:
        if name == "tasks_claimable_many":
            read_ids.append(json.loads(str(params["ids"])))
        return execute(self, name, params)

    monkeypatch.setattr(sqlite_gateway._Tx, "_execute", spy)
    store = SqliteStore(f"sqlite:///{tmp_path / 'claim-fresh.db'}")
    try:
        log = _root_done(store, 4)
        with store.unit_of_work():
            _launch_in_unit(store, log)
            kept = dict(store._fresh_tasks.rows) if store._fresh_tasks else {}
            (task_id,) = kept
            with store._sqlite.read() as tx:
                stored = tx.one("tasks_claimable_many", {"ids": f'["{task_id}"]', "first": 1})
            assert stored is not None
            # What the launch kept is the row a claim would read, column by
            # column (a new column of the table fails here first).
            assert isinstance(stored, sqlite3.Row)
            columns = stored.keys()  # a sqlite3.Row iterates its values
            assert {k: stored[k] for k in columns if k != "seq"} == kept[task_id]
            statements.clear()
            read_ids.clear()
            # (The helper's hops left their own rows in the queue: their
            # tasks are done, so those claims are refused after a read.)
            claims = store.claim_deliveries("w1", limit=4, lease_seconds=30.0)
            found = Counter(statements)
        (claimed,) = [c for c in claims if c.delivery.task_id == task_id]
        assert claimed.task is not None and claimed.task.task_id == task_id
        assert claimed.task == store.get_task(task_id)
    finally:
        store.close()
    # One read, for the old rows' tasks only.
    assert found["tasks_claimable_many"] == 1, found
    assert read_ids == [[c.delivery.task_id for c in claims if c.delivery.task_id != task_id]]


def test_a_write_between_launch_and_claim_makes_the_claim_read_its_tasks(
    tmp_path: Path, statements: Counter[str]
) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path / 'claim-stale.db'}")
    try:
        log = _root_done(store, 4)
        with store.unit_of_work():
            _launch_in_unit(store, log)
            (task_id,) = store._fresh_tasks.rows if store._fresh_tasks else {}
            # Another write of the unit: here the task's own attempt moves on.
            record = store.get_task(task_id)
            assert record is not None
            assert claim_task(
                store,
                task_id,
                expected_attempt_id=record.attempt_id,
                expected_generation=record.generation,
            )
            statements.clear()
            claimed = store.claim_deliveries("w1", limit=4, lease_seconds=30.0)
            found = Counter(statements)
        # The row was read, and the claim refused: the task is RUNNING already.
        assert [c.task for c in claimed] == [None] * len(claimed)
        assert task_id in [c.delivery.task_id for c in claimed]
    finally:
        store.close()
    assert found["tasks_claimable_many"] == 1, found


def test_a_lone_claim_or_completion_reads_its_task_by_key(
    tmp_path: Path, statements: Counter[str]
) -> None:
    with SqliteStore(f"sqlite:///{tmp_path / 'lone.db'}") as store:
        new_run(store, [root("a"), root("b")])
        statements.clear()
        (first,) = store.claim_deliveries("w1", limit=1, lease_seconds=30.0)
        assert statements["task_get_owned"] == 1 and statements["tasks_claimable_many"] == 0
        assert first.task == store.get_task(first.delivery.task_id)
        row = first.delivery
        request = CompletionRequest(row.task_id, row.attempt_id, (), row.delivery_id)
        statements.clear()
        (done,) = store.complete_and_ack("w1", [request])
        assert isinstance(done, TaskCompletionResult) and done.task_id == row.task_id
        assert statements["task_get_completing"] == 1, statements
        assert statements["tasks_get_owned_many"] == 0, statements
        # Several rows: one read of all their tasks.
        new_run(store, [root("c"), root("d")], run_id="run-2")
        statements.clear()
        assert len(store.claim_deliveries("w1", limit=3, lease_seconds=30.0)) == 3
        assert statements["tasks_claimable_many"] == 1 and statements["task_get_owned"] == 0
