"""SQLite store and queue throughput on this machine (one process).

Measures, on a fresh file in a temporary directory:

* the raw ceiling: one-row ``INSERT`` transactions committed per second with
  the store's own settings (WAL, ``synchronous = NORMAL``, ``BEGIN IMMEDIATE``);
* launch creation: the EACH launch of ``--tasks`` tasks (tasks/s);
* the worker cycle dequeue -> claim -> complete (+ reconcile) -> ack, with
  ``limit=1`` and with a batched dequeue (cycles/s), through the public
  orchestration functions a worker uses;
* the same cycle against the store alone (``try_complete_task``, no
  reconcile), to show what the orchestration adds.

Run: ``.venv/bin/python bench/sqlite_queue.py [--tasks 10000] [--cycles 3000]``.
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import InputMode
from dagwerk.execution import claim_task
from dagwerk.models import DagNode, EmittedOutput, InputEdge
from dagwerk.orchestrator import OrchestratorCallbacks, on_task_complete, reconcile_run, start_run


def _noop(run_id: str) -> None:
    del run_id


CALLBACKS = OrchestratorCallbacks(
    on_run_completed=_noop, on_run_failed=_noop, on_run_crashed=_noop, on_run_cancelled=_noop
)
NODES = [
    DagNode(slug="src", plugin="src"),
    DagNode(
        slug="leaf",
        plugin="leaf",
        input_mode=InputMode.EACH,
        edges=(InputEdge(name="src", source="src"),),
    ),
]


def raw_insert_rate(path: Path, count: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    start = time.perf_counter()
    for n in range(count):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", (f"row-{n}",))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return count / elapsed


def fan_out(store: SqliteStore, run_id: str, tasks: int) -> tuple[float, float]:
    """Complete the root with ``tasks`` outputs; time publication and the launch."""
    store.create_run(run_id, NODES)
    start_run(store, run_id, callbacks=CALLBACKS)
    (row,) = store.dequeue("setup", limit=1, lease_seconds=600.0)
    assert claim_task(store, row.task_id, expected_attempt_id=row.attempt_id, expected_generation=0)
    outputs = tuple(EmittedOutput(id=f"o{n}", fields={"n": n}) for n in range(tasks))
    start = time.perf_counter()
    assert store.try_complete_task(row.task_id, outputs, expected_attempt_id=row.attempt_id)
    published = time.perf_counter()
    reconcile_run(store, run_id, callbacks=CALLBACKS)
    launched = time.perf_counter()
    assert store.ack(row.delivery_id, "setup")
    return published - start, launched - published


def worker_cycles(store: SqliteStore, cycles: int, limit: int, *, orchestrate: bool) -> float:
    done = 0
    start = time.perf_counter()
    while done < cycles:
        rows = store.dequeue("bench", limit=min(limit, cycles - done), lease_seconds=600.0)
        assert rows, "ran out of work"
        for row in rows:
            claimed = claim_task(
                store,
                row.task_id,
                expected_attempt_id=row.attempt_id,
                expected_generation=row.generation,
            )
            assert claimed is not None
            if orchestrate:
                on_task_complete(
                    store,
                    task_id=row.task_id,
                    expected_attempt_id=row.attempt_id,
                    callbacks=CALLBACKS,
                )
            else:
                assert store.try_complete_task(row.task_id, (), expected_attempt_id=row.attempt_id)
            assert store.ack(row.delivery_id, "bench")
            done += 1
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="EACH launch size")
    parser.add_argument("--cycles", type=int, default=3_000, help="worker cycles per variant")
    args = parser.parse_args()
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        results["raw_insert_commits_per_s"] = raw_insert_rate(base / "raw.db", 5_000)
        with SqliteStore(base / "launch.db") as store:
            publish, launch = fan_out(store, "launch", args.tasks)
            results["publish_outputs_per_s"] = args.tasks / publish
            results["launch_tasks_per_s"] = args.tasks / launch
        variants = [
            ("cycle_limit1_per_s", 1, True),
            ("cycle_batch32_per_s", 32, True),
            ("store_only_limit1_per_s", 1, False),
            ("store_only_batch32_per_s", 32, False),
        ]
        for name, limit, orchestrate in variants:
            with SqliteStore(base / f"{name}.db") as store:
                # One run with more leaves than cycles, so no run completes mid-measure.
                fan_out(store, "work", args.cycles + 1)
                results[name] = worker_cycles(store, args.cycles, limit, orchestrate=orchestrate)
    ceiling = results["raw_insert_commits_per_s"]
    print(f"{'measure':32} {'per second':>12} {'ceiling/x':>10}")
    for name, value in results.items():
        print(f"{name:32} {value:12,.0f} {ceiling / value:10.2f}")
    print(json.dumps({"tasks": args.tasks, "cycles": args.cycles, **results}))


if __name__ == "__main__":
    main()
