"""Worker throughput and per-hop latency with real worker processes, on SQLite
and PostgreSQL side by side.

Pipelines:
  fanout  one root emitting N items -> N EACH tasks -> one ALL join (N=1,000)
  chain   a chain of L single-task steps (L=200)

Each runs on every database of ``--db`` (``sqlite`` for a fresh temporary
file, or a ``postgresql://`` URL: each case gets a fresh schema there, dropped
afterwards) with 1, 2 and 4 worker processes (``--workers``), each worker
with ``--concurrency`` threads. Every plugin writes its start and end times to a
file in the execution root; a hop is the time from a task's upstream end to
its own start (queueing + dispatch + claim), reported as mean and p99.
Prints a table and, with ``--json``, the figures as JSON.

    .venv/bin/python bench/worker_pipelines.py [--fanout 1000] [--chain 200] \
        [--db sqlite --db postgresql://user@host:port/db] [--workers 1 2 4]

Without ``--db`` it uses SQLite, plus PostgreSQL when
``DAGWERK_TEST_POSTGRES_URL`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dagwerk.constants import RUN_TERMINAL_STATUSES, InputMode
from dagwerk.engine import open_store
from dagwerk.models import DagNode, EdgeSource, InputEdge, TaskInputs
from dagwerk.orchestrator import OrchestratorCallbacks, start_run
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.plugins import PluginFn
from dagwerk.runtime.worker import Worker

RUN_ID = "bench"


def _noop(run_id: str) -> None:
    del run_id


CALLBACKS = OrchestratorCallbacks(_noop, _noop, _noop, _noop)


def _record(ctx: TaskContext, start: float) -> None:
    name = ctx.task_id.replace(":", "_")
    (ctx.execution_root / f"{name}.t").write_text(f"{ctx.node_index} {start} {time.time()}")


def root(inputs: TaskInputs, ctx: TaskContext) -> object:
    start = time.time()
    count = int(str(inputs.parameters.get("count", 1)))
    out = [{"n": n} for n in range(count)]
    _record(ctx, start)
    return out


def step(inputs: TaskInputs, ctx: TaskContext) -> object:
    start = time.time()
    _record(ctx, start)
    return {"n": 1}


PLUGINS: dict[str, PluginFn] = {"root": root, "step": step}


def fanout_nodes() -> list[DagNode]:
    return [
        DagNode(slug="root", plugin="root"),
        DagNode(
            slug="each",
            plugin="step",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="items", source="root"),),
            bindings={"n": EdgeSource(edge="items", field="n")},
        ),
        DagNode(
            slug="join",
            plugin="step",
            input_mode=InputMode.ALL,
            edges=(InputEdge(name="items", source="each"),),
        ),
    ]


def chain_nodes(length: int) -> list[DagNode]:
    nodes = [DagNode(slug="s0", plugin="root")]
    for index in range(1, length):
        nodes.append(
            DagNode(
                slug=f"s{index}",
                plugin="step",
                input_mode=InputMode.EACH,
                edges=(InputEdge(name="prev", source=f"s{index - 1}"),),
            )
        )
    return nodes


def worker_main(db: str, events: str, concurrency: int) -> None:
    store = open_store(db)
    worker = Worker(
        store,
        PLUGINS,
        concurrency=concurrency,
        poll_interval=0.05,
        cancel_check_interval=1.0,
        execution_root=events,
    )
    while store.get_run_status(RUN_ID) not in RUN_TERMINAL_STATUSES:
        worker.process_once(wait_seconds=0.1)
    worker.stop(timeout=10)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


@contextmanager
def fresh_database(db: str, tmp: Path) -> Iterator[str]:
    """A URL of an empty database: a new SQLite file, or a new schema on the
    PostgreSQL server of ``db`` (dropped afterwards)."""
    if db == "sqlite":
        yield f"sqlite:///{tmp / 'bench.db'}"
        return
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    separator = "&" if "?" in db else "?"
    try:
        yield f"{db}{separator}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def backend_name(db: str) -> str:
    return "sqlite" if db == "sqlite" else "postgres"


def run_case(db_spec: str, kind: str, size: int, workers: int, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, fresh_database(db_spec, Path(tmp)) as db:
        events = Path(tmp) / "events"
        events.mkdir()
        store = open_store(db)
        nodes = fanout_nodes() if kind == "fanout" else chain_nodes(size)
        run_input = {"count": size} if kind == "fanout" else {"count": 1}
        store.create_run(RUN_ID, nodes, run_input=run_input)
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "work", str(db), str(events), str(concurrency)]
            )
            for _ in range(workers)
        ]
        began = time.time()
        start_run(store, RUN_ID, callbacks=CALLBACKS)
        for proc in procs:
            proc.wait()
        elapsed = time.time() - began
        status = store.get_run_status(RUN_ID)
        tasks = len(store.list_tasks(RUN_ID))
        store.close()
        times: dict[int, list[tuple[float, float]]] = {}
        for path in events.glob("*.t"):
            node, start, end = path.read_text().split()
            times.setdefault(int(node), []).append((float(start), float(end)))
    hops: list[float] = []
    for index in sorted(times):
        if index == 0:
            continue
        upstream_end = max(end for _, end in times[index - 1])
        hops.extend(start - upstream_end for start, _ in times[index])
    return {
        "backend": backend_name(db_spec),
        "pipeline": kind,
        "size": size,
        "workers": workers,
        "concurrency": concurrency,
        "status": str(status),
        "tasks": tasks,
        "seconds": round(elapsed, 3),
        "tasks_per_second": round(tasks / elapsed, 1),
        "hop_mean_ms": round(statistics.fmean(hops) * 1000, 2) if hops else None,
        "hop_p99_ms": round(_percentile(hops, 0.99) * 1000, 2) if hops else None,
        "hops": len(hops),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fanout", type=int, default=1000)
    parser.add_argument("--chain", type=int, default=200)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--db",
        action="append",
        metavar="URL",
        help="'sqlite' or a postgresql:// URL; repeatable (default: sqlite, and "
        "$DAGWERK_TEST_POSTGRES_URL when set)",
    )
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args()
    databases: list[str] = args.db or [
        "sqlite",
        *filter(None, [os.environ.get("DAGWERK_TEST_POSTGRES_URL")]),
    ]
    results = []
    header = (
        f"{'backend':<8} {'pipeline':<8} {'size':>5} {'workers':>7} {'tasks':>6} {'s':>8} "
        f"{'tasks/s':>8} {'hop mean ms':>12} {'hop p99 ms':>11}"
    )
    print(header)
    for kind, size in (("fanout", args.fanout), ("chain", args.chain)):
        for workers in args.workers:
            for db in databases:
                r = run_case(db, kind, size, workers, args.concurrency)
                results.append(r)
                _print_row(r)
    if args.json:
        print(json.dumps(results, indent=2))


def _print_row(r: dict[str, Any]) -> None:
    print(
        f"{r['backend']:<8} {r['pipeline']:<8} {r['size']:>5} {r['workers']:>7} {r['tasks']:>6} "
        f"{r['seconds']:>8} {r['tasks_per_second']:>8} {r['hop_mean_ms']!s:>12} "
        f"{r['hop_p99_ms']!s:>11}",
        flush=True,
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "work":
        worker_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        main()
