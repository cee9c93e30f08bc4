"""The chaos driver: many runs of mixed pipelines on worker processes that it
kills with SIGKILL at random, then a check of the database and the ledger.

``run_chaos(url, seconds=..., seed=...)`` submits runs of five pipeline
shapes (fan-out/fan-in, BY_CORRELATION joins with a flaky retried branch,
chains, waits that the driver resumes, and a doomed node that must fail its
run) to ``workers`` processes of ``chaos_worker.py``; every 0.5-2.5 s it
kills one of them (now and then two) and starts a replacement. After
``seconds`` it stops killing, lets the open runs finish, stops the workers
and checks, from a fresh connection to the database and the ledger folder
alone:

- every run is terminal with the status its plugins dictate, and the
  outputs of a completed run are the values its plugins compute;
- each node published exactly the outputs its completed tasks emit, each
  output once, and each completed task has exactly one COMPLETED attempt;
- no QUEUED task lacks a delivery of its current attempt and no delivery
  points at a missing task; nothing was dead-lettered;
- no task was retried after a failure beyond its retry policy;
- every ledger entry (one per plugin execution) names an attempt the store
  knows; every attempt the store says ran to an end (COMPLETED, FAILED,
  WAITING) has its entry; an attempt executed twice was abandoned (CRASHED).

The schedule (pipelines, sizes, kill times) comes from one seed, printed at
the start; ``DAGWERK_CHAOS_SEED`` replays it. Process timing is not
reproducible, so a replay repeats the pressure, not the interleaving.

Run it by hand: ``python tests/chaos/driver.py --minutes 5 [--url URL]``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from chaos_check import ChaosReport, Planned, check, probe_queue, store_options

from dagwerk.constants import RUN_TERMINAL_STATUSES, FailurePolicy, InputMode, RunStatus, TaskStatus
from dagwerk.engine import Engine, ResumeRejectedError
from dagwerk.models import (
    DagNode,
    EdgeSource,
    InputEdge,
    LiteralSource,
    RetryPolicySpec,
)

HERE = Path(__file__).resolve().parent
WORKER_SCRIPT = HERE / "chaos_worker.py"
NO_BACKOFF = {"backoff_base": 0.0, "backoff_max": 0.0}


# --- the pipelines ---------------------------------------------------------------


def _gen(count: int) -> DagNode:
    return DagNode(slug="gen", plugin="c_gen", bindings={"count": LiteralSource(value=count)})


def _each(slug: str, plugin: str, source: str, **extra: Any) -> DagNode:
    bindings: dict[str, Any] = {"n": EdgeSource(edge="items", field="n")}
    bindings.update(extra.pop("bindings", {}))
    return DagNode(
        slug=slug,
        plugin=plugin,
        input_mode=InputMode.EACH,
        edges=(InputEdge(name="items", source=source),),
        bindings=bindings,
        **extra,
    )


def _sum(slug: str, source: str) -> DagNode:
    return DagNode(
        slug=slug,
        plugin="c_sum",
        input_mode=InputMode.ALL,
        edges=(InputEdge(name="items", source=source),),
    )


def plan_run(rng: random.Random) -> Planned:
    """A random pipeline of one of the five shapes."""
    kind = rng.choice(["fan", "join", "chain", "wait", "doom"])
    count = rng.randint(2, 6)
    values = list(range(count))
    if kind == "fan":
        return Planned(
            kind,
            [_gen(count), _each("work", "c_work", "gen"), _sum("total", "work")],
            RunStatus.COMPLETED,
            {"work": ("n", values), "total": ("total", [sum(values)])},
            {"gen": count, "work": count, "total": 1},
        )
    if kind == "join":
        succeed_at = rng.randint(1, 3)
        flaky = _each(
            "right",
            "c_flaky",
            "gen",
            bindings={"succeed_at": LiteralSource(value=succeed_at)},
            retry=RetryPolicySpec(max_attempts=succeed_at, jitter=False, **NO_BACKOFF),
        )
        join = DagNode(
            slug="join",
            plugin="c_join",
            input_mode=InputMode.BY_CORRELATION,
            edges=(InputEdge(name="left", source="left"), InputEdge(name="right", source="right")),
        )
        return Planned(
            kind,
            [_gen(count), _each("left", "c_work", "gen"), flaky, join, _sum("total", "join")],
            RunStatus.COMPLETED,
            {"join": ("n", [3 * n for n in values]), "total": ("total", [3 * sum(values)])},
            {"gen": count, "left": count, "right": count, "join": count, "total": 1},
        )
    if kind == "chain":
        length = rng.randint(3, 6)
        nodes = [DagNode(slug="s0", plugin="c_step")]
        for i in range(1, length):
            nodes.append(
                DagNode(
                    slug=f"s{i}",
                    plugin="c_step",
                    input_mode=InputMode.ALL,
                    edges=(InputEdge(name="prev", source=f"s{i - 1}"),),
                )
            )
        return Planned(
            kind,
            nodes,
            RunStatus.COMPLETED,
            {f"s{length - 1}": ("n", [length])},
            {f"s{i}": 1 for i in range(length)},
        )
    if kind == "wait":
        return Planned(
            kind,
            [_gen(count), _each("approve", "c_approve", "gen"), _sum("total", "approve")],
            RunStatus.COMPLETED,
            {"approve": ("n", [10 * n for n in values]), "total": ("total", [10 * sum(values)])},
            {"gen": count, "approve": count, "total": 1},
        )
    doom = DagNode(
        slug="doom",
        plugin="c_doom",
        input_mode=InputMode.ALL,
        edges=(InputEdge(name="items", source="gen"),),
        retry=RetryPolicySpec(max_attempts=2, jitter=False, **NO_BACKOFF),
    )
    return Planned(
        kind,
        [_gen(count), _each("work", "c_work", "gen"), doom],
        RunStatus.FAILED,
        {},
        {},
    )


# --- workers ---------------------------------------------------------------------


class Workers:
    """The worker processes: spawn, kill -9, replace, stop."""

    def __init__(self, url: str, ledger: Path, logs: Path) -> None:
        self.url, self.ledger, self.logs = url, ledger, logs
        self.live: dict[str, subprocess.Popen[bytes]] = {}
        self.dead: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self.kills = 0

    def spawn(self) -> str:
        self.started += 1
        worker_id = f"chaos-w{self.started}"
        env = {**os.environ, "DAGWERK_CHAOS_LEDGER": str(self.ledger), "PYTHONUNBUFFERED": "1"}
        with open(self.logs / f"{worker_id}.err", "wb") as err:
            self.live[worker_id] = subprocess.Popen(
                [sys.executable, str(WORKER_SCRIPT), self.url, worker_id, str(self.ledger)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
        return worker_id

    def kill(self, worker_id: str) -> None:
        proc = self.live.pop(worker_id)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            self.kills += 1
        proc.wait(30)
        self.dead.append(proc)

    def replace_exited(self) -> list[str]:
        """Workers that exited on their own (they must not): their IDs."""
        gone = [wid for wid, proc in self.live.items() if proc.poll() is not None]
        for wid in gone:
            self.dead.append(self.live.pop(wid))
            self.spawn()
        return gone

    def stop(self) -> None:
        (self.ledger / "stop").write_text("stop")
        deadline = time.monotonic() + 30
        for proc in self.live.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.dead.extend(self.live.values())
        self.live.clear()


# --- the driver --------------------------------------------------------------------


def _resume_waits(engine: Engine, run_id: str) -> int:
    resumed = 0
    for task in engine.list_tasks(run_id):
        if task.status is TaskStatus.WAITING and task.active_wait_id:
            n = int(task.active_wait_id.rsplit("-", 1)[1])
            try:
                engine.resume(task.task_id, task.active_wait_id, {"n": 10 * n})
                resumed += 1
            except ResumeRejectedError:
                pass  # the task moved on since the read (another driver pass)
    return resumed


def _hold_sqlite_lock(path: str, seconds: float) -> subprocess.Popen[bytes]:
    """A process that holds ``BEGIN EXCLUSIVE`` on the SQLite file for ``seconds``."""
    code = (
        "import sqlite3, sys, time\n"
        "conn = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)\n"
        "conn.execute('BEGIN EXCLUSIVE')\n"
        "print('locked', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
        "conn.execute('COMMIT')\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, path, str(seconds)], stdout=subprocess.PIPE
    )


def run_chaos(
    url: str,
    *,
    seconds: float,
    workdir: Path,
    seed: int | None = None,
    workers: int = 3,
    kill: bool = True,
    max_open_runs: int = 8,
    lock_every: float | None = None,
    drain_seconds: float = 120.0,
) -> ChaosReport:
    """Run the chaos schedule against ``url`` and check the result (see the module)."""
    if seed is None:
        seed = int(os.environ.get("DAGWERK_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    backend = url.split(":", 1)[0]
    print(
        f"chaos: backend={backend} seed={seed} (DAGWERK_CHAOS_SEED={seed} replays it)", flush=True
    )
    rng = random.Random(seed)
    report = ChaosReport(seed=seed, backend=backend)
    ledger, logs = workdir / "ledger", workdir / "logs"
    ledger.mkdir()
    logs.mkdir()
    planned: dict[str, Planned] = {}
    open_runs: list[str] = []
    locks: list[subprocess.Popen[bytes]] = []
    engine = Engine(url, execution_root=workdir, **store_options(url))
    pool = Workers(url, ledger, logs)
    started = time.monotonic()
    try:
        for _ in range(workers):
            pool.spawn()
        chaos_until = started + seconds
        next_kill = started + rng.uniform(0.5, 2.5)
        next_lock = started + (lock_every or 0.0)
        next_probe = started + 1.0
        pause = 0.05
        while True:
            now = time.monotonic()
            chaos = now < chaos_until
            if not chaos and not open_runs:
                break
            if not chaos and now > chaos_until + drain_seconds:
                report.lost.extend(f"{r}: not terminal after the drain" for r in open_runs)
                break
            # Submit while the chaos lasts.
            while chaos and len(open_runs) < max_open_runs:
                plan = plan_run(rng)
                run_id = f"chaos-{len(planned):05d}-{plan.kind}"
                engine.submit(plan.nodes, {}, run_id=run_id, failure_policy=FailurePolicy.FAIL_FAST)
                planned[run_id] = plan
                open_runs.append(run_id)
            for run_id in list(open_runs):
                status = engine.get_run(run_id)
                assert status is not None
                if status.status in RUN_TERMINAL_STATUSES:
                    open_runs.remove(run_id)
                elif planned[run_id].kind == "wait":
                    report.resumes += _resume_waits(engine, run_id)
            if kill and chaos and now >= next_kill:
                victims = rng.sample(
                    sorted(pool.live), k=min(len(pool.live), rng.choice([1, 1, 1, 2]))
                )
                for victim in victims:
                    pool.kill(victim)
                    pool.spawn()
                next_kill = now + rng.uniform(0.5, 2.5)
            if lock_every and chaos and now >= next_lock:
                locks.append(_hold_sqlite_lock(url.removeprefix("sqlite:///"), 3.0))
                next_lock = now + lock_every
            if now >= next_probe:
                probe_queue(url, report)
                next_probe = now + 2.0
            report.unexpected_worker_exits += len(pool.replace_exited())
            time.sleep(pause)  # the driver's polling period
    finally:
        pool.stop()
        lock_outputs = [lock.communicate(timeout=60)[0] for lock in locks]
        report.kills, report.workers_started = pool.kills, pool.started
        report.seconds = time.monotonic() - started
        engine.close()
    for lock, out in zip(locks, lock_outputs, strict=True):
        if lock.returncode != 0 or b"locked" not in out:
            report.violations.append(f"the lock holder did not hold the lock ({lock.returncode})")
        else:
            report.locks_held += 1
    for log in sorted(logs.iterdir()):
        report.worker_errors.extend(
            f"{log.name}: {line}"
            for line in log.read_text(errors="replace").splitlines()
            if "Error" in line or "Traceback" in line
        )
    report.runs = len(planned)
    report.runs_by_kind = Counter(p.kind for p in planned.values())
    probe_queue(url, report)
    check(url, planned, ledger, report)
    return report


# --- PostgreSQL: one schema per chaos run ------------------------------------------------


@contextmanager
def postgres_schema(url: str) -> Iterator[str]:
    """A URL whose connections use a fresh schema, dropped afterwards."""
    import psycopg

    name = f"chaos_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    separator = "&" if "?" in url else "?"
    try:
        yield f"{url}{separator}options={quote(f'-csearch_path={name}')}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def sqlite_url(workdir: Path) -> str:
    path = workdir / "chaos.db"
    sqlite3.connect(path).close()
    return f"sqlite:///{path}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="postgresql://... (default: a new SQLite file)")
    parser.add_argument(
        "--minutes", type=float, default=float(os.environ.get("DAGWERK_CHAOS_MINUTES", "1"))
    )
    parser.add_argument("--seed", type=int)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--keep", help="work in this new folder and keep it (ledger, logs, database)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dagwerk-chaos-") as tmp:
        workdir = Path(args.keep) if args.keep else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.url and args.keep:
            # Keep the schema too, for a post-mortem: its name is in the URL.
            url = f"{args.url}{'&' if '?' in args.url else '?'}options=" + quote(
                f"-csearch_path=chaos_keep_{uuid.uuid4().hex[:8]}"
            )
            import psycopg

            with psycopg.connect(args.url, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA "{url.rsplit("%3D", 1)[1]}"')
            print(f"chaos: keeping {url}", flush=True)
            report = run_chaos(
                url,
                seconds=args.minutes * 60,
                workdir=workdir,
                seed=args.seed,
                workers=args.workers,
            )
        elif args.url:
            with postgres_schema(args.url) as url:
                report = run_chaos(
                    url,
                    seconds=args.minutes * 60,
                    workdir=workdir,
                    seed=args.seed,
                    workers=args.workers,
                )
        else:
            report = run_chaos(
                sqlite_url(workdir),
                seconds=args.minutes * 60,
                workdir=workdir,
                seed=args.seed,
                workers=args.workers,
            )
    print(report.summary())
    for line in report.lost + report.violations:
        print("  ", line)
    # Worker log lines that mention an error, grouped (the first 20 kinds).
    kinds = Counter(line.split(": ", 1)[1][:160] for line in report.worker_errors)
    for text, count in kinds.most_common(20):
        print(f"   {count} x {text}")
    return 1 if report.lost or report.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
