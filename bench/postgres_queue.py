"""PostgreSQL store and queue throughput (the measurements of sqlite_queue.py).

Measures, each in a fresh schema of the server at ``--url`` (default: the
``DAGWERK_TEST_POSTGRES_URL`` environment variable):

* the raw ceiling: one-row ``INSERT`` transactions committed per second on
  one connection, as three round trips (``BEGIN``, ``INSERT``, ``COMMIT``),
  as two (``BEGIN`` pipelined with the ``INSERT``, then ``COMMIT``: what
  the gateway does for a one-statement write) and as one (all three in one
  pipeline flight);
* launch creation: the EACH launch of ``--tasks`` tasks (tasks/s);
* the worker cycle dequeue -> claim -> complete (+ reconcile) -> ack, with
  ``limit=1`` and with a batched dequeue (cycles/s), in one process;
* the same cycle against the store alone (``try_complete_task``, no reconcile);
* the orchestrated ``limit=1`` cycle with 1, 2 and 4 worker processes
  sharing one queue (cycles/s over all processes);
* the client's and the server's CPU time per store-only cycle (the server's
  only when ``--server-pid`` names the postmaster of a local server).

``--roundtrips`` instead counts the client/server round trips of single
store operations, through a local TCP proxy that delays the server's bytes
(a round trip is a burst of server bytes after client bytes; the delay
keeps a pipelined flight from being split by an early answer).
``--latency-ms X`` runs the measurements through a proxy process that adds
at least X ms to every round trip, as a server across a network would (the
proxy's event loop sleeps in whole milliseconds and costs some itself: the
three raw commit rates show what a round trip really costs there).

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
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from dagwerk.backends.postgres import PostgresStore
from dagwerk.constants import InputMode
from dagwerk.execution import claim_task
from dagwerk.models import DagNode, EmittedOutput, InputEdge
from dagwerk.orchestrator import OrchestratorCallbacks, on_task_complete, reconcile_run, start_run
from dagwerk.testing.pg_proxy import DelayProxy


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


def raw_commit_rate(url: str, schema: str, count: int, flights: int = 3) -> float:
    """One-row INSERT transactions per second, in ``flights`` round trips each."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{schema}".t (id bigserial PRIMARY KEY, v text NOT NULL)'
        )
        insert = f'INSERT INTO "{schema}".t (v) VALUES (%s)'
        start = time.perf_counter()
        for n in range(count):
            if flights == 3:
                conn.execute("BEGIN")
                conn.execute(insert, (f"row-{n}",))
                conn.execute("COMMIT")
                continue
            with conn.pipeline() as pipeline:
                conn.execute("BEGIN")
                conn.execute(insert, (f"row-{n}",))
                if flights == 2:
                    pipeline.sync()
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
    """Dequeue, claim, complete (+ reconcile) and ack ``cycles`` tasks; cycles/s."""
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


# -- CPU per cycle ------------------------------------------------------------------


def _proc_cpu(pid: int) -> float | None:
    """CPU seconds of process ``pid`` and its reaped children, or None."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _server_cpu(postmaster: int) -> float | None:
    """CPU seconds of a local server: the postmaster and every child of it."""
    total = _proc_cpu(postmaster)
    if total is None:
        return None
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == postmaster:
            total += _proc_cpu(int(name)) or 0.0
    return total


def _postmaster(url: str) -> int | None:
    """The postmaster's PID if the server runs on this machine."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    try:
        with open(f"/proc/{row[0] if row else 0}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def cpu_per_cycle(url: str, schema: str, cycles: int) -> dict[str, float]:
    """Client and (local) server CPU milliseconds per store-only cycle."""
    postmaster = _postmaster(url)
    with PostgresStore(url, schema=schema) as store:
        fan_out(store, "work", cycles + 1)
        server = _server_cpu(postmaster) if postmaster else None
        client = time.process_time()
        worker_cycles(store, cycles, 1, orchestrate=False)
        result = {"client_cpu_ms_per_cycle": 1e3 * (time.process_time() - client) / cycles}
        if server is not None and postmaster:
            after = _server_cpu(postmaster)
            if after is not None:
                result["server_cpu_ms_per_cycle"] = 1e3 * (after - server) / cycles
    return result


# -- a delaying proxy: round trips and network latency --------------------------------


def _serve_proxy(url: str, delay: float) -> None:
    """The ``--proxy`` child: print the proxy's URL, serve until stdin closes."""
    proxy = DelayProxy(url, delay)
    print(proxy.url, flush=True)
    sys.stdin.read()


def count_round_trips(url: str, schema: str, samples: int) -> dict[str, float]:
    """Mean round trips of single store operations (through a DelayProxy)."""
    proxy = DelayProxy(url, 0.005)
    counts: dict[str, list[int]] = {}

    @contextmanager
    def counted(name: str) -> Iterator[None]:
        before = proxy.round_trips
        yield
        counts.setdefault(name, []).append(proxy.round_trips - before)

    with PostgresStore(proxy.url, schema=schema) as store:
        fan_out(store, "work", 2 * samples + 4)
        for _ in range(samples):
            with counted("dequeue (limit=1)"):
                (row,) = store.dequeue("w", limit=1, lease_seconds=600.0)
            with counted("get_run_status (a read)"):
                store.get_run_status("work")
            with counted("try_claim_task"):
                store.try_claim_task(
                    row.task_id,
                    expected_attempt_id=row.attempt_id,
                    expected_generation=row.generation,
                )
            with counted("try_complete_task"):
                store.try_complete_task(row.task_id, (), expected_attempt_id=row.attempt_id)
            with counted("ack"):
                store.ack(row.delivery_id, "w")
            (row,) = store.dequeue("w", limit=1, lease_seconds=600.0)
            with counted("claim_task + on_task_complete + ack"):
                claim_task(
                    store,
                    row.task_id,
                    expected_attempt_id=row.attempt_id,
                    expected_generation=row.generation,
                )
                on_task_complete(
                    store,
                    task_id=row.task_id,
                    expected_attempt_id=row.attempt_id,
                    callbacks=CALLBACKS,
                )
                store.ack(row.delivery_id, "w")
        with counted("dequeue (limit=4)"):
            store.dequeue("w", limit=4, lease_seconds=600.0)
    return {name: sum(values) / len(values) for name, values in counts.items()}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--proxy":
        _serve_proxy(sys.argv[2], float(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("DAGWERK_TEST_POSTGRES_URL"))
    parser.add_argument("--tasks", type=int, default=10_000, help="EACH launch size")
    parser.add_argument("--cycles", type=int, default=3_000, help="worker cycles per variant")
    parser.add_argument(
        "--roundtrips", action="store_true", help="count round trips per store operation"
    )
    parser.add_argument(
        "--latency-ms", type=float, default=0.0, help="added to every round trip (a proxy)"
    )
    args = parser.parse_args()
    if not args.url:
        parser.error("pass --url or set DAGWERK_TEST_POSTGRES_URL")
    prefix = f"bench_{uuid.uuid4().hex[:8]}"
    made: list[str] = []

    def schema(name: str) -> str:
        made.append(f"{prefix}_{name}")
        return made[-1]

    proxy: subprocess.Popen[str] | None = None
    url = args.url
    results: dict[str, float] = {}
    try:
        if args.roundtrips:
            trips = count_round_trips(args.url, schema("trips"), 10)
            print(f"{'operation':40} {'round trips':>12}")
            for name, value in trips.items():
                print(f"{name:40} {value:12.2f}")
            print(json.dumps({"round_trips": trips}))
            return
        if args.latency_ms > 0:
            proxy = subprocess.Popen(
                [sys.executable, __file__, "--proxy", args.url, str(args.latency_ms / 1e3)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proxy.stdout is not None
            url = proxy.stdout.readline().strip()
        for flights in (3, 2, 1):
            results[f"raw_insert_{flights}rt_commits_per_s"] = raw_commit_rate(
                url, schema(f"raw{flights}"), 5_000 if not proxy else 500, flights
            )
        with PostgresStore(url, schema=schema("launch")) as store:
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
            with PostgresStore(url, schema=schema(name)) as store:
                # One run with more leaves than cycles, so no run completes mid-measure.
                fan_out(store, "work", args.cycles + 1)
                results[name] = worker_cycles(store, args.cycles, limit, orchestrate=orchestrate)
        for procs in (1, 2, 4):
            results[f"cycle_limit1_{procs}proc_per_s"] = processes_rate(
                url, schema(f"procs{procs}"), procs, args.cycles // procs
            )
        if not proxy:
            results.update(cpu_per_cycle(url, schema("cpu"), args.cycles))
    finally:
        if proxy is not None:
            assert proxy.stdin is not None
            proxy.stdin.close()
            proxy.wait(timeout=60)
        with psycopg.connect(args.url, autocommit=True) as conn:
            for name in made:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    ceiling = results["raw_insert_3rt_commits_per_s"]
    print(f"{'measure':36} {'value':>12} {'ceiling/x':>10}")
    for name, value in results.items():
        ratio = f"{ceiling / value:10.2f}" if name.endswith("_per_s") else ""
        print(f"{name:36} {value:12,.2f} {ratio}")
    print(
        json.dumps(
            {"tasks": args.tasks, "cycles": args.cycles, "latency_ms": args.latency_ms, **results}
        )
    )


if __name__ == "__main__":
    main()
