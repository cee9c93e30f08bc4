"""CPU time per step of a chain on PostgreSQL: the workers' and the server's.

Starts ``--workers`` real ``dagwerk worker --plugins bench.workloads``
processes on a fresh database of the server at ``--postgres`` (default:
``DAGWERK_BENCH_POSTGRES_URL``), runs a client that submits a chain of
``--steps`` steps and waits for its result, and reads the CPU seconds
(user + system, ``/proc/PID/stat``) of the workers and of every local
``postgres`` process before and after. Prints wall time, worker CPU and
server CPU per step (the wall time includes the client process's start,
so it reads high on short chains): on a shared VM CPU time moves less with the machine's
speed than wall time does, so two trees compare better by it (alternate
their ``--src`` exports within minutes). The server must run on this
machine for its CPU to count.

Run: ``.venv/bin/python -m bench.chain_cpu --postgres URL [--src DIR/src]
[--steps 1000] [--workers 1] [--concurrency 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from bench import _procs

_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int | str) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


def _server_seconds() -> float:
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/comm").read_text().strip() == "postgres":
                total += _cpu_seconds(entry)
        except OSError:  # the process ended meanwhile
            continue
    return total


def measure(url: str, *, steps: int, workers: int, concurrency: int | None) -> dict[str, object]:
    """One chain of ``steps`` on a fresh database of the server at ``url``."""
    name = f"chain_cpu_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    database = url.rsplit("/", 1)[0] + "/" + name
    try:
        with tempfile.TemporaryDirectory() as directory:
            procs = _procs.WorkerProcs(database, workers, Path(directory), concurrency=concurrency)
            procs.start()
            try:
                pids = [proc.pid for proc in procs.procs]
                worker_before = sum(_cpu_seconds(pid) for pid in pids)
                server_before = _server_seconds()
                started = time.perf_counter()
                result = _procs.run_client(database, "chain", steps, Path(directory))
                wall = time.perf_counter() - started
                worker_cpu = sum(_cpu_seconds(pid) for pid in pids) - worker_before
                server_cpu = _server_seconds() - server_before
            finally:
                procs.stop()
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    per_step = 1000 / steps
    return {
        "steps": steps,
        "workers": workers,
        "concurrency": concurrency,
        "status": result["status"],
        "wall_ms_per_step": round(wall * per_step, 3),
        "worker_cpu_ms_per_step": round(worker_cpu * per_step, 3),
        "server_cpu_ms_per_step": round(server_cpu * per_step, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default=os.environ.get("DAGWERK_BENCH_POSTGRES_URL"))
    parser.add_argument("--src", help="import dagwerk from this directory (a tree's export)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--concurrency", default="1", help="dagwerk worker --concurrency ('default': no flag)"
    )
    args = parser.parse_args(argv)
    if not args.postgres:
        parser.error("give --postgres URL (or set DAGWERK_BENCH_POSTGRES_URL)")
    if args.src:
        _procs.SRC[0] = Path(args.src).resolve()
    concurrency = None if args.concurrency == "default" else int(args.concurrency)
    figures = measure(
        args.postgres, steps=args.steps, workers=args.workers, concurrency=concurrency
    )
    print(
        f"{args.workers} worker(s), concurrency {args.concurrency}, {args.steps} steps: "
        f"wall {figures['wall_ms_per_step']} ms/step, worker CPU "
        f"{figures['worker_cpu_ms_per_step']} ms/step, server CPU "
        f"{figures['server_cpu_ms_per_step']} ms/step ({figures['status']})"
    )
    print(json.dumps(figures))
    return 0 if figures["status"] == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
