"""PostgreSQL store and queue throughput (the measurements of sqlite_queue.py).

Measures, each in a fresh schema of the server at ``--url`` (default: the
``DAGWERK_TEST_POSTGRES_URL`` environment variable):

* the raw ceiling: one-row ``INSERT`` transactions committed per second on
  one connection (``BEGIN``/``INSERT``/``COMMIT``, as the store's writes do);
* launch creation: the EACH launch of ``--tasks`` tasks (tasks/s);
* the worker cycle dequeue -> claim -> complete (+ reconcile) -> ack, with
  ``limit=1`` and with a batched dequeue (cycles/s), in one process;
* the same cycle against the store alone (``try_complete_task``, no reconcile);
* the orchestrated ``limit=1`` cycle with 1, 2 and 4 worker processes
  sharing one queue (cycles/s over all processes).

Run: ``.venv/bin/python bench/postgres_queue.py [--tasks 10000] [--cycles 3000]``.
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid

import psycopg

from dagwerk.backends.postgres import PostgresStore
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


def raw_commit_rate(url: str, schema: str, count: int) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".t (id bigserial PRIMARY KEY, v text NOT NULL)')
        insert = f'INSERT INTO "{schema}".t (v) VALUES (%s)'
        start = time.perf_counter()
        for n in range(count):
            conn.execute("BEGIN")
            conn.execute(insert, (f"row-{n}",))
            conn.execute("COMMIT")
        return count / (time.perf_counter() - start)


def fan_out(store: PostgresStore, run_id: str, tasks: int) -> tuple[float, float]:
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


def worker_cycles(
    store: PostgresStore, cycles: int, limit: int, *, orchestrate: bool, worker: str = "bench"
) -> float:
    done = 0
    start = time.perf_counter()
    while done < cycles:
        rows = store.dequeue(worker, limit=min(limit, cycles - done), lease_seconds=600.0)
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
            assert store.ack(row.delivery_id, worker)
            done += 1
    return done / (time.perf_counter() - start)


def _child(url: str, schema: str, worker: str, cycles: int) -> None:
    """One worker process of the multi-process measure: waits for "go" on
    stdin, then runs ``cycles`` orchestrated cycles."""
    with PostgresStore(url, schema=schema, pool_size=2) as store:
        sys.stdin.readline()
        worker_cycles(store, cycles, 1, orchestrate=True, worker=worker)


def processes_rate(url: str, schema: str, procs: int, cycles: int) -> float:
    with PostgresStore(url, schema=schema) as store:
        fan_out(store, "work", cycles * procs + 1)
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", url, schema, f"w{n}", str(cycles)],
            stdin=subprocess.PIPE,
            text=True,
        )
        for n in range(procs)
    ]
    time.sleep(2.0)  # let every interpreter import and connect before the clock starts
    start = time.perf_counter()
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.close()
    for child in children:
        assert child.wait(timeout=3600) == 0
    return cycles * procs / (time.perf_counter() - start)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("DAGWERK_TEST_POSTGRES_URL"))
    parser.add_argument("--tasks", type=int, default=10_000, help="EACH launch size")
    parser.add_argument("--cycles", type=int, default=3_000, help="worker cycles per variant")
    args = parser.parse_args()
    if not args.url:
        parser.error("pass --url or set DAGWERK_TEST_POSTGRES_URL")
    prefix = f"bench_{uuid.uuid4().hex[:8]}"
    made: list[str] = []

    def schema(name: str) -> str:
        made.append(f"{prefix}_{name}")
        return made[-1]

    results: dict[str, float] = {}
    try:
        results["raw_insert_commits_per_s"] = raw_commit_rate(args.url, schema("raw"), 5_000)
        with PostgresStore(args.url, schema=schema("launch")) as store:
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
            with PostgresStore(args.url, schema=schema(name)) as store:
                # One run with more leaves than cycles, so no run completes mid-measure.
                fan_out(store, "work", args.cycles + 1)
                results[name] = worker_cycles(store, args.cycles, limit, orchestrate=orchestrate)
        for procs in (1, 2, 4):
            results[f"cycle_limit1_{procs}proc_per_s"] = processes_rate(
                args.url, schema(f"procs{procs}"), procs, args.cycles // procs
            )
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            for name in made:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    ceiling = results["raw_insert_commits_per_s"]
    print(f"{'measure':32} {'per second':>12} {'ceiling/x':>10}")
    for name, value in results.items():
        print(f"{name:32} {value:12,.0f} {ceiling / value:10.2f}")
    print(json.dumps({"tasks": args.tasks, "cycles": args.cycles, **results}))


if __name__ == "__main__":
    main()
