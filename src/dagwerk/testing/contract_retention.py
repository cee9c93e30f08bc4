"""Contract tests: deleting finished runs (``RunRetentionStore``, GC-xx).

Stores are built through the backend's ``make_store(**settings)`` fixture
with a fake clock, so "finished 30 days ago" is a setting of the test. The
test that every record of a deleted run is gone also needs the backend's
``store_rows`` fixture: a function from a store to every row it holds,
table by table, read from the live schema (see
:mod:`dagwerk.testing.table_rows`); it fails on a table that gained rows of
a run and kept them after the run was deleted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dagwerk.budgets import Budget
from dagwerk.constants import FailurePolicy, RunStatus, TaskStatus
from dagwerk.execution import claim_task, recover_task
from dagwerk.lineage import RunLink
from dagwerk.models import TaskInputs
from dagwerk.orchestrator import abort_run, start_run
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.retention import RetentionPolicy, delete_runs
from dagwerk.runtime.worker import Worker
from dagwerk.scheduling.definitions import ScheduleDefinition
from dagwerk.store import (
    BackstopStore,
    DagBudgetStore,
    DagChildStore,
    IdempotentSubmitStore,
    InvalidStoreValueError,
    NewRun,
    RunTraceStore,
    ScheduleStore,
)
from dagwerk.store_retention import RetentionCursor, RunRetentionStore
from dagwerk.store_tracebacks import AttemptTracebackStore
from dagwerk.testing.contract_queue import FakeClock, QueueContractStore
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    FakeWorker,
    chain,
    fingerprint,
    new_run,
    only_task,
    root,
)
from dagwerk.testing.table_rows import TableRows
from dagwerk.waiting import resume_task

__all__ = [
    "retention_clock",
    "rstore",
    "test_gc_01_old_terminal_runs_go_and_everything_else_stays",
    "test_gc_02_only_the_statuses_asked_for",
    "test_gc_03_a_parent_takes_its_children_and_a_child_never_goes_alone",
    "test_gc_04_batches_are_bounded_and_go_on_after_their_cursor",
    "test_gc_05_a_dry_run_deletes_nothing",
    "test_gc_06_bad_requests_raise_typed_errors",
    "test_gc_07_every_record_of_a_deleted_run_is_gone",
    "test_gc_08_deleting_while_a_worker_finishes_other_runs_loses_nothing",
    "test_gc_09_a_worker_with_retention_deletes_old_runs",
]

DAY = 86_400.0
OLD = 1_000.0
"""When the runs to delete finish."""
NOW = 100 * DAY
"""When retention runs (runs finished after ``NOW - 30 days`` are recent)."""
MONTH = 30 * DAY

StoreRows = Callable[[Any], TableRows]


@pytest.fixture
def retention_clock() -> FakeClock:
    return FakeClock(OLD)


@pytest.fixture
def rstore(
    make_store: Callable[..., QueueContractStore], retention_clock: FakeClock
) -> ContractStore:
    store = make_store(clock=retention_clock)
    assert isinstance(store, RunRetentionStore)
    return store


def _retention(store: ContractStore) -> RunRetentionStore:
    assert isinstance(store, RunRetentionStore)
    return store


def _completed(store: ContractStore, run_id: str, length: int = 2) -> None:
    log = new_run(store, chain(length), run_id)
    FakeWorker(store, log).drain(run_id)
    assert store.get_run_status(run_id) is RunStatus.COMPLETED


def _end(store: ContractStore, run_id: str, status: RunStatus) -> None:
    """Create ``run_id`` and end it with ``status`` (not COMPLETED)."""
    new_run(store, chain(2), run_id)
    assert abort_run(
        store, run_id=run_id, reason="test", callbacks=CallbackLog().callbacks, status=status
    )


def _child(store: ContractStore, run_id: str, parent: str, root_run: str | None = None) -> None:
    """A started child run of ``parent`` (its lineage's root ``root_run``)."""
    assert isinstance(store, DagChildStore)
    top = root_run or parent
    link = RunLink(
        run_id=run_id,
        parent_run_id=parent,
        parent_task_id=f"{parent}-task",
        root_run_id=top,
        # Opaque to the store (workers decode it); these children run no task.
        lineage="{}",
    )
    assert store.create_child_run(run_id, [root("leaf")], link=link)
    start_run(store, run_id, callbacks=CallbackLog().callbacks)


def _gone(store: ContractStore, run_id: str) -> None:
    assert store.get_run(run_id) is None, run_id
    assert store.get_run_status(run_id) is None, run_id
    assert store.get_run_nodes(run_id) is None, run_id
    assert store.list_deliveries(run_id) == [], run_id
    assert store.list_dead_letters(run_id) == [], run_id  # type: ignore[attr-defined]
    assert run_id not in {run.run_id for run in store.list_runs(limit=1_000)}


def test_gc_01_old_terminal_runs_go_and_everything_else_stays(
    rstore: ContractStore, retention_clock: FakeClock
) -> None:
    store = rstore
    _completed(store, "old-completed")
    task_ids = [t.task_id for t in store.list_tasks("old-completed")]
    _end(store, "old-failed", RunStatus.FAILED)
    _end(store, "old-crashed", RunStatus.CRASHED)
    _end(store, "old-cancelled", RunStatus.CANCELLED)
    new_run(store, chain(2), "old-running")  # created long ago, never finished
    new_run(store, chain(2), "old-pending", start=False)
    retention_clock.now = NOW - MONTH + 1  # finished within the 30 days kept
    _completed(store, "recent")
    retention_clock.now = NOW
    kept = ["old-running", "old-pending", "recent"]
    before = {run_id: fingerprint(store, run_id) for run_id in kept}
    batch = _retention(store).delete_finished_runs(older_than=MONTH)
    assert sorted(batch.run_ids) == ["old-cancelled", "old-completed", "old-crashed", "old-failed"]
    assert batch.rows["runs"] == 4
    assert batch.rows["tasks"] == 2 + 3  # an ended run never launched its second node
    assert batch.passed == () and batch.after is None
    for run_id in batch.run_ids:
        _gone(store, run_id)
    assert all(store.get_task(task_id) is None for task_id in task_ids)
    assert {run_id: fingerprint(store, run_id) for run_id in kept} == before
    # A repeat finds nothing more to delete.
    assert _retention(store).delete_finished_runs(older_than=MONTH).run_ids == ()


def test_gc_02_only_the_statuses_asked_for(
    rstore: ContractStore, retention_clock: FakeClock
) -> None:
    store = rstore
    _completed(store, "done")
    _end(store, "failed", RunStatus.FAILED)
    _end(store, "cancelled", RunStatus.CANCELLED)
    retention_clock.now = NOW
    batch = _retention(store).delete_finished_runs(
        older_than=MONTH, statuses=["failed", RunStatus.CANCELLED]
    )
    assert sorted(batch.run_ids) == ["cancelled", "failed"]
    assert store.get_run_status("done") is RunStatus.COMPLETED


def test_gc_03_a_parent_takes_its_children_and_a_child_never_goes_alone(
    rstore: ContractStore, retention_clock: FakeClock
) -> None:
    store = rstore
    # A finished family: the root and two generations below it, all terminal
    # (the grandchild even finished after the cut-off: the root decides).
    _end(store, "family", RunStatus.FAILED)
    _child(store, "family-kid", "family")
    _child(store, "family-grandkid", "family-kid", "family")
    retention_clock.now = NOW - DAY
    _end_child(store, "family-grandkid")
    retention_clock.now = OLD
    _end_child(store, "family-kid")
    # A finished parent whose child still runs: neither goes.
    _end(store, "busy", RunStatus.CANCELLED)
    _child(store, "busy-kid", "busy")
    # A finished child of a parent that still runs: the child stays.
    new_run(store, chain(2), "alive")
    _child(store, "alive-kid", "alive")
    _end_child(store, "alive-kid")
    # A child whose parent is not stored is a root of its own.
    _child(store, "orphan", "never-stored")
    _end_child(store, "orphan")
    retention_clock.now = NOW
    kept = ["busy", "busy-kid", "alive", "alive-kid"]
    before = {run_id: fingerprint(store, run_id) for run_id in kept}
    batch = _retention(store).delete_finished_runs(older_than=MONTH)
    assert set(batch.run_ids) == {"family", "family-kid", "family-grandkid", "orphan"}
    assert batch.run_ids.index("family") < batch.run_ids.index("family-kid")
    assert batch.passed == ("busy",)
    for run_id in batch.run_ids:
        _gone(store, run_id)
    assert {run_id: fingerprint(store, run_id) for run_id in kept} == before
    assert isinstance(store, DagChildStore)
    assert store.list_child_runs("alive") == ["alive-kid"]
    # Once the child finishes, the finished parent goes and takes it along.
    _end_child(store, "busy-kid")
    assert set(_retention(store).delete_finished_runs(older_than=MONTH).run_ids) == {
        "busy",
        "busy-kid",
    }


def _end_child(store: ContractStore, run_id: str) -> None:
    assert abort_run(
        store,
        run_id=run_id,
        reason="test",
        callbacks=CallbackLog().callbacks,
        status=RunStatus.CANCELLED,
    )


def test_gc_04_batches_are_bounded_and_go_on_after_their_cursor(
    rstore: ContractStore, retention_clock: FakeClock
) -> None:
    store = rstore
    for n in range(7):
        retention_clock.now = OLD + n
        _end(store, f"r{n}", RunStatus.CANCELLED)
    # A lineage of three runs never splits across batches.
    retention_clock.now = OLD + 3.5
    _end(store, "p", RunStatus.CANCELLED)
    _child(store, "p-kid1", "p")
    _child(store, "p-kid2", "p")
    _end_child(store, "p-kid1")
    _end_child(store, "p-kid2")
    retention_clock.now = NOW
    retention = _retention(store)
    seen: list[tuple[str, ...]] = []
    after: RetentionCursor | None = None
    while True:
        batch = retention.delete_finished_runs(older_than=MONTH, limit=3, after=after)
        seen.append(batch.run_ids)
        after = batch.after
        if after is None:
            break
    assert seen[0] == ("r0", "r1", "r2")
    assert seen[1] == ("r3", "p", "p-kid1", "p-kid2") or seen[1] == ("r3",)
    flat = [run_id for ids in seen for run_id in ids]
    assert sorted(flat) == sorted([f"r{n}" for n in range(7)] + ["p", "p-kid1", "p-kid2"])
    assert all(len(ids) <= 3 or ids[1:] == ("p", "p-kid1", "p-kid2") for ids in seen)
    assert store.list_runs(limit=100) == []
    # The whole pass: one call, counted.
    for n in range(5):
        retention_clock.now = OLD + n
        _end(store, f"s{n}", RunStatus.FAILED)
    retention_clock.now = NOW
    summary = delete_runs(retention, older_than="30d", batch_size=2)
    assert (summary.runs, summary.batches, summary.complete) == (5, 3, True)
    assert summary.rows["runs"] == 5


def test_gc_05_a_dry_run_deletes_nothing(rstore: ContractStore, retention_clock: FakeClock) -> None:
    store = rstore
    _completed(store, "a")
    _end(store, "b", RunStatus.FAILED)
    retention_clock.now = NOW
    before = {run_id: fingerprint(store, run_id) for run_id in ("a", "b")}
    batch = _retention(store).delete_finished_runs(older_than=MONTH, dry_run=True)
    assert sorted(batch.run_ids) == ["a", "b"]
    assert dict(batch.rows) == {"runs": 2}
    assert {run_id: fingerprint(store, run_id) for run_id in ("a", "b")} == before
    summary = delete_runs(_retention(store), older_than=MONTH, dry_run=True)
    assert (summary.runs, summary.dry_run) == (2, True)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({"older_than": -1}, "older_than"),
        ({"older_than": float("nan")}, "older_than"),
        ({"older_than": "30d"}, "older_than"),
        ({"older_than": True}, "older_than"),
        ({"older_than": 1, "statuses": ["running"]}, "statuses"),
        ({"older_than": 1, "statuses": []}, "statuses"),
        ({"older_than": 1, "statuses": "completed"}, "statuses"),
        ({"older_than": 1, "limit": 0}, "limit"),
        ({"older_than": 1, "limit": 10_001}, "limit"),
        ({"older_than": 1, "after": "r1"}, "after"),
        ({"older_than": 1, "dry_run": "yes"}, "dry_run"),
    ],
)
def test_gc_06_bad_requests_raise_typed_errors(
    rstore: ContractStore, retention_clock: FakeClock, request_: dict[str, Any], field: str
) -> None:
    store = rstore
    _end(store, "r", RunStatus.FAILED)
    retention_clock.now = NOW
    with pytest.raises(InvalidStoreValueError) as caught:
        _retention(store).delete_finished_runs(**request_)
    assert caught.value.field == field
    assert store.get_run_status("r") is RunStatus.FAILED


# --- GC-07: nothing of a deleted run is left, in any table ---------------------------------


def _gate(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    ctx.logger.warning("the gate waits for approval")
    stamp = ctx.step("stamp", lambda: {"at": 1})
    return {"approved": ctx.wait("approval"), "stamp": stamp}


def _spawn(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    result = ctx.child_result()
    if result is None:
        ctx.run_child([root("leaf")])
    assert result is not None
    return {"child": result.status.value}


def fill_every_table(
    store: ContractStore, retention_clock: FakeClock, tmp_path: Path, prefix: str
) -> None:
    """Runs named ``prefix-*`` that leave rows in every table a run has:
    tasks with replaced attempts, outputs, a recorded step, a resolved wait, a child
    run, budget accounts and holds, a stall, a recovery and dead letters.
    Every run ends terminal."""
    main = f"{prefix}-main"
    nodes = [
        root("src"),
        root("gate"),
        root("spawn"),
    ]
    new_run(store, nodes, main, start=False)
    assert isinstance(store, DagBudgetStore)
    assert store.try_set_run_budget(main, Budget(max_cost=100, max_output_bytes=1_000_000))
    start_run(store, main, callbacks=CallbackLog().callbacks)
    assert isinstance(store, BackstopStore)
    assert store.try_record_stall(main, "test stall", (1,))
    # A scheduled run and one submitted with an idempotency key (their tick
    # record and key go with them; the schedule itself belongs to no run).
    assert isinstance(store, ScheduleStore) and isinstance(store, IdempotentSubmitStore)
    schedule = store.get_schedule("retention") or store.put_schedule(
        ScheduleDefinition.build("retention", "retention.yaml", chain(1), every="1h"),
        replace=False,
    )
    assert schedule is not None
    tick = int(retention_clock.now)
    scheduled = NewRun(f"{prefix}-tick", tuple(chain(1)), {}, FailurePolicy.FAIL_FAST, None)
    fired = store.fire_schedule_tick(
        schedule.schedule_id, tick, source="schedule", run=scheduled, advance_cursor=True
    )
    assert fired.created
    keyed = NewRun(f"{prefix}-keyed", tuple(chain(1)), {}, FailurePolicy.FAIL_FAST, None)
    assert store.create_run_once(f"{prefix}-key", "f", keyed, retention=10 * MONTH).created
    for run_id in (scheduled.run_id, keyed.run_id):
        start_run(store, run_id, callbacks=CallbackLog().callbacks)
    assert isinstance(store, RunTraceStore)
    assert store.set_run_traceparent(main, "00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    queue: Any = store
    plugins: dict[str, Any] = {
        "src": lambda i, c: [{"n": 1}, {"n": 2}],
        "gate": _gate,
        "spawn": _spawn,
        "leaf": lambda i, c: {"leaf": True},
        "n0": lambda i, c: {"n": 0},
    }
    estimates = dict.fromkeys(plugins, 0.5)
    worker = Worker(
        store, plugins, execution_root=tmp_path, cost_estimates=estimates, backstop_interval=None
    )
    try:
        worker.run_until_idle()
        gate = only_task(store, main, 1)
        assert gate.status is TaskStatus.WAITING, gate
        assert resume_task(
            store,
            gate.task_id,
            "approval",
            expected_attempt_id=gate.attempt_id,
            expected_generation=gate.generation,
            response={"by": "test"},
        )
        worker.run_until_idle()
    finally:
        worker.stop()
    assert store.get_run_status(main) is RunStatus.COMPLETED, store.list_tasks(main)
    # A recovery, and dead letters: leases that lapse with their worker.
    lost = f"{prefix}-lost"
    new_run(store, chain(1), lost)
    (first,) = queue.dequeue("w1", limit=10, lease_seconds=5.0)
    record = store.get_task(first.delivery.task_id)
    assert record is not None
    claimed = claim_task(
        store, record.task_id, expected_attempt_id=record.attempt_id, expected_generation=0
    )
    assert claimed is not None
    assert isinstance(store, AttemptTracebackStore)
    assert store.record_attempt_traceback(record.task_id, record.attempt_id, "Traceback: lost")
    assert recover_task(
        store, record.task_id, expected_attempt_id=record.attempt_id, expected_generation=0
    )
    for _ in range(queue.max_deliveries + 1):
        retention_clock.advance(10.0)
        queue.dequeue("w1", limit=10, lease_seconds=5.0)
    assert queue.list_dead_letters(lost), "no dead letter"
    queue.take_dead_lettered()
    if store.get_run_status(lost) is RunStatus.RUNNING:
        abort_run(store, run_id=lost, reason="test", callbacks=CallbackLog().callbacks)


_EMPTY_WHEN_TERMINAL = {
    # A run's queue rows are dropped in the commit that ends it, so a finished
    # run has none (the tables are deleted from all the same).
    "dagwerk_deliveries",
    "_deliveries",
    "_queue",
    "_task_rows",
    # Tasks a dequeue crashed, until take_dead_lettered drains them.
    "_dead_lettered",
}

_GLOBAL = {
    # Rows that belong to no run (the workers' presence, named leases, the
    # schema version); every other table is a run's.
    "dagwerk_schema_version",
    "dagwerk_leases",
    "dagwerk_workers",
    "_workers",
    "_leases",
    # Schedules belong to no run (their tick records do). The memory store
    # keeps its tick records by schedule, indexed by run in _run_fires.
    "dagwerk_schedules",
    "_schedules",
    "_fires",
}


def test_gc_07_every_record_of_a_deleted_run_is_gone(
    make_store: Callable[..., QueueContractStore],
    retention_clock: FakeClock,
    store_rows: StoreRows,
    tmp_path: Path,
) -> None:
    """Kept runs first, then runs to delete: each table that holds a run's
    rows must gain rows from the second, and after the delete hold exactly
    what it held before them."""
    store: Any = make_store(clock=retention_clock, max_deliveries=1)
    retention_clock.now = NOW - DAY
    fill_every_table(store, retention_clock, tmp_path, "kept")
    kept = {name: rows for name, rows in store_rows(store).items() if name not in _GLOBAL}
    retention_clock.now = OLD
    fill_every_table(store, retention_clock, tmp_path, "old")
    full = {name: rows for name, rows in store_rows(store).items() if name not in _GLOBAL}
    assert set(full) == set(kept)
    unfilled = sorted(name for name in full if full[name] == kept[name])
    unfilled = [name for name in unfilled if name not in _EMPTY_WHEN_TERMINAL]
    assert unfilled == [], (
        f"fill_every_table leaves no row in {unfilled}: extend it so this test "
        "proves retention deletes those rows"
    )
    retention_clock.now = NOW
    summary = delete_runs(store, older_than=MONTH, batch_size=1)
    assert summary.runs == 5  # main, its child, the scheduled and keyed runs, lost
    after = {name: rows for name, rows in store_rows(store).items() if name not in _GLOBAL}
    left = {name: rows for name, rows in after.items() if rows != kept[name]}
    assert left == {}, f"tables that kept rows of a deleted run (or lost a kept one's): {left}"


# --- GC-08: deleting while workers run ------------------------------------------------------


def test_gc_08_deleting_while_a_worker_finishes_other_runs_loses_nothing(
    make_store: Callable[..., QueueContractStore], tmp_path: Path
) -> None:
    """Old runs are deleted batch by batch while a worker completes new ones
    on the same store: every new run completes with all its outputs."""
    ages = FakeClock(OLD)
    store: Any = make_store(clock=lambda: ages.now if ages.now < NOW else time.time())
    for n in range(30):
        _completed(store, f"old-{n}", length=3)
    ages.now = NOW  # from here on: the wall clock
    fresh = [f"new-{n}" for n in range(20)]
    for run_id in fresh:
        new_run(store, chain(3), run_id)
    plugins: dict[str, Any] = {f"n{i}": (lambda i, c: [{"v": 1}, {"v": 2}]) for i in range(3)}
    worker = Worker(store, plugins, execution_root=tmp_path, backstop_interval=None)
    deleted: list[int] = []

    def delete() -> None:
        deleted.append(delete_runs(store, older_than=3600, batch_size=2).runs)

    thread = threading.Thread(target=delete)
    thread.start()
    worker.run_until_idle()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert deleted == [30]
    for run_id in fresh:
        assert store.get_run_status(run_id) is RunStatus.COMPLETED, run_id
        # Fan-out 2 per node: 1, 2 and 4 tasks; 2, 4 and 8 outputs.
        tasks = store.list_tasks(run_id)
        assert [sum(t.node_index == i for t in tasks) for i in range(3)] == [1, 2, 4]
        assert len(store.get_output_ids(run_id, 2)) == 8
    assert {run.run_id for run in store.list_runs(limit=100)} == set(fresh)


# --- GC-09: the worker's periodic retention --------------------------------------------------


def test_gc_09_a_worker_with_retention_deletes_old_runs(
    make_store: Callable[..., QueueContractStore], retention_clock: FakeClock, tmp_path: Path
) -> None:
    store: Any = make_store(clock=retention_clock)
    _completed(store, "old")
    retention_clock.now = NOW
    _completed(store, "recent")
    worker = Worker(
        store,
        {"n0": lambda i, c: {}, "n1": lambda i, c: {}},
        execution_root=tmp_path,
        poll_interval=0.01,
        retention=RetentionPolicy("30d", interval=0.05),
    )
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while store.get_run("old") is not None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        worker.stop()
    assert store.get_run("old") is None
    assert store.get_run_status("recent") is RunStatus.COMPLETED
    assert worker.retention is not None
    assert worker.retention.last_summary is not None
