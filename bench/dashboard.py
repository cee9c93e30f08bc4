"""How fast the dashboard answers on a large database.

Run from the repository root::

    python -m bench.dashboard [--runs 100000] [--tasks 100000] [--db PATH] [--json-only]

Builds a SQLite database (outside the measured region; ``--reuse`` times
one an earlier run built) with ``--runs``
one-node runs (a mix of completed, failed and running ones) and one run
whose ``work`` node fans out to ``--tasks`` tasks (left queued: no worker
serves them), then times the pages and API answers the issue names, in
process through the ASGI app (Starlette's test client; no network). Each
figure is the median (and the worst) of 20 requests after one warm-up. The
target is under 300 ms each.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from dagwerk.constants import InputMode
from dagwerk.engine import Engine
from dagwerk.models import DagNode, InputEdge
from dagwerk.web import WebSettings, create_app

TARGET_MS = 300.0
REQUESTS = 20
BATCH = 2_000


def _build(db: Path, runs: int, tasks: int) -> str:
    """The database; returns the ID of the wide run."""
    from dagwerk.testing.helpers import CallbackLog

    with Engine(f"sqlite:///{db}", backstop_interval=None) as engine:

        @engine.plugin("bench_fan")
        def fan(inputs: Any, ctx: Any) -> list[dict[str, object]]:
            return [{"n": n} for n in range(tasks)]

        store = engine.store
        units = engine.capabilities.units
        assert units is not None
        log = CallbackLog()
        from dagwerk.orchestrator import start_run

        single = [DagNode(slug="only", plugin="bench_noop")]
        made = 0
        while made < runs:
            with units.unit_of_work():
                for n in range(made, min(runs, made + BATCH)):
                    run_id = f"run-{n:07d}"
                    store.create_run(run_id, single, pipeline=f"pipe-{n % 10}")
                    if n % 3:  # two in three runs start (a task each)
                        start_run(store, run_id, callbacks=log.callbacks)
                    if n % 3 == 2:
                        store.try_cancel_run(run_id)
            made = min(runs, made + BATCH)
        wide = [
            DagNode(slug="fan", plugin="bench_fan"),
            DagNode(
                slug="work",
                plugin="bench_work",
                input_mode=InputMode.EACH,
                edges=(InputEdge(name="items", source="fan"),),
            ),
        ]
        wide_id = engine.submit(wide, run_id="run-wide")
        worker = engine.worker(concurrency=1, backstop_interval=None, prefer_run=wide_id)
        worker.run_until_idle()
        return wide_id


def _time(client: TestClient, url: str) -> dict[str, float]:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code, response.text[:300])
    seconds: list[float] = []
    for _ in range(REQUESTS):
        start = time.perf_counter()
        response = client.get(url)
        seconds.append(time.perf_counter() - start)
        assert response.status_code == 200
    return {
        "median_ms": round(statistics.median(seconds) * 1000, 1),
        "max_ms": round(max(seconds) * 1000, 1),
        "bytes": len(response.content),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--db", type=Path, default=Path("bench-dashboard.db"))
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument(
        "--reuse", action="store_true", help="time an existing --db built by an earlier run"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.reuse and args.db.exists():
        wide_id = "run-wide"
    else:
        for suffix in ("", "-wal", "-shm", "-dagwerk.lock"):
            Path(f"{args.db}{suffix}").unlink(missing_ok=True)
        wide_id = _build(args.db, args.runs, args.tasks)
    built = time.perf_counter() - started
    with Engine(f"sqlite:///{args.db}", backstop_interval=None) as engine:
        client = TestClient(create_app(engine, WebSettings()), base_url="http://127.0.0.1")
        deep = engine.list_runs_page(limit=50)
        pages = max(1, min(200, args.runs // 50 - 2))  # 10,000 runs in at most
        for _ in range(pages):
            assert deep.next is not None
            deep = engine.list_runs_page(after=deep.next, limit=50)
        assert deep.next is not None
        cursor = deep.next.encode()
        cases = {
            "runs page (newest 50)": "/runs",
            f"runs page ({pages * 50 + 50:,} runs deep)": f"/runs?after={cursor}",
            "runs page (status=cancelled)": "/runs?status=cancelled",
            "runs page (pipeline filter)": "/runs?pipeline=pipe-3",
            "runs API (newest 50)": "/api/runs",
            f"run page ({args.tasks:,}-task run)": f"/runs/{wide_id}",
            f"run live part ({args.tasks:,}-task run)": f"/runs/{wide_id}/live",
            f"run API ({args.tasks:,}-task run)": f"/api/runs/{wide_id}",
            "tasks of the wide node (API, first 50)": f"/api/runs/{wide_id}/tasks?node=work",
            "overview": "/",
        }
        figures = {name: _time(client, url) for name, url in cases.items()}
    result = {
        "runs": args.runs,
        "tasks": args.tasks,
        "build_seconds": round(built, 1),
        "target_ms": TARGET_MS,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "figures": figures,
        "within_target": all(f["median_ms"] < TARGET_MS for f in figures.values()),
    }
    if not args.json_only:
        width = max(len(name) for name in figures)
        print(f"{args.runs:,} runs, one run of {args.tasks:,} tasks (built in {built:.0f} s)")
        for name, f in figures.items():
            print(f"  {name:<{width}}  median {f['median_ms']:7.1f} ms   max {f['max_ms']:7.1f} ms")
    print(json.dumps(result))
    if not result["within_target"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
