"""The client-observed suite: ``python -m bench --client``.

What a user sees: real ``dagwerk worker --plugins bench.workloads``
processes and a separate client process that calls ``Engine.submit`` and
then ``Engine.wait`` (the engine's default poll), which returns with the
run's result read back. The figure is the client's wall time from before the
submit to the result in hand; each case runs three times (``--repeat``),
each on a fresh database with fresh workers, and the median run is reported
with every run's figure.

Cases, on each backend: W1 (a root emits 1,000 items -> 1,000 EACH tasks ->
one ALL join; tasks/s) and W2 (a chain of 200 steps; wall time / 200 per
step), with 1 and 2 workers, each at ``--concurrency 1`` and at the worker's
default (no flag). ``--durable-postgres`` starts a PostgreSQL cluster with
``fsync = on`` and ``synchronous_commit = on`` for the run (``bench/_cluster.py``)
and stops it at the end. The suite prints the issue's targets with their
measured figures, the machine's calibration and its load average before and
after (the noise of a shared machine).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import _env
from bench._procs import WorkerProcs, run_client

__all__ = [
    "ClientCase",
    "client_cases",
    "client_targets",
    "print_client_table",
    "print_targets",
    "run_client_suite",
]

CHAIN_LENGTH = 200
FANOUT_ITEMS = 1_000
WORKER_COUNTS = (1, 2)
CONCURRENCIES: tuple[int | None, ...] = (1, None)
"""``--concurrency`` of the workers per case; ``None`` is no flag (the default)."""


@dataclass(frozen=True)
class ClientCase:
    """One client-observed configuration."""

    backend: str
    label: str  # W1 or W2
    workers: int
    concurrency: int | None

    @property
    def name(self) -> str:
        flag = "default" if self.concurrency is None else f"c{self.concurrency}"
        return f"{self.label} {self.backend} {self.workers}w {flag}"


def client_cases(backends: Sequence[str], labels: Sequence[str]) -> list[ClientCase]:
    """Every case of the suite for ``backends`` and workloads ``labels``."""
    return [
        ClientCase(backend, label, workers, concurrency)
        for backend in backends
        for label in labels
        for concurrency in CONCURRENCIES
        for workers in WORKER_COUNTS
    ]


def _figure(case: ClientCase, run: dict[str, object]) -> float:
    seconds = float(str(run["seconds"]))
    if case.label == "W2":
        return round(1000 * seconds / CHAIN_LENGTH, 3)  # ms per step
    return round(int(str(run["tasks"])) / seconds, 1)  # tasks/s


def measure_client(case: ClientCase, url: str, directory: Path) -> dict[str, object]:
    """One run of ``case`` against the fresh database at ``url``."""
    workers = WorkerProcs(url, case.workers, directory, concurrency=case.concurrency)
    workers.start()
    try:
        kind, size = ("chain", CHAIN_LENGTH) if case.label == "W2" else ("fanout", FANOUT_ITEMS)
        result = run_client(url, kind, size, directory)
    finally:
        workers.stop()
    errors = workers.errors()
    if errors:
        print(errors, file=sys.stderr)
    if result["status"] != "completed":
        print(f"WARNING: {case.name} ended {result['status']}", file=sys.stderr)
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    result["figure"] = _figure(case, result)
    return dict(result)


def run_client_suite(
    cases: Sequence[ClientCase],
    urls: dict[str, str],
    tmp: Path,
    repeat: int,
) -> dict[ClientCase, dict[str, object]]:
    """Measure every case ``repeat`` times; the median run of each with every
    run's figure (``runs``) and load average (``loads``). ``urls``: a
    PostgreSQL server URL per backend (SQLite gets a fresh file per run)."""
    results: dict[ClientCase, dict[str, object]] = {}
    pg = _env.PostgresDatabases(urls["postgres"]) if "postgres" in urls else None
    try:
        for n, case in enumerate(cases):
            runs: list[dict[str, object]] = []
            for attempt in range(max(1, repeat)):
                directory = tmp / f"client-{n}-{attempt}"
                directory.mkdir()
                url = _env.case_url(case.backend, directory, pg, f"k{n}")
                print(
                    f"[{n + 1}/{len(cases)}] {case.name} (run {attempt + 1}) ...",
                    file=sys.stderr,
                    flush=True,
                )
                runs.append(measure_client(case, url, directory))
                print(f"    {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
                if pg is not None and case.backend == "postgres":
                    pg.drop_all()
            # Slowest first (a longer step, or fewer tasks/s); the middle one.
            ranked = sorted(runs, key=lambda r: float(str(r["figure"])), reverse=case.label == "W2")
            chosen = dict(ranked[(len(ranked) - 1) // 2])
            chosen["runs"] = [r["figure"] for r in runs]
            chosen["loads"] = [r["load_average"] for r in runs]
            results[case] = chosen
    finally:
        if pg is not None:
            pg.drop_all()
    return results


def client_targets(
    results: dict[ClientCase, dict[str, object]], durable: bool
) -> list[dict[str, object]]:
    """The targets of the client-observed suite next to the measured figures
    (only those measured; the PostgreSQL ones only on a durable server)."""
    out: list[dict[str, object]] = []

    def add(label: str, backend: str, workers: int, concurrency: int | None, goal: float) -> None:
        case = ClientCase(backend, label, workers, concurrency)
        if case not in results:
            return
        measured = float(str(results[case]["figure"]))
        higher = label == "W1"
        ratio = measured / goal if higher else (goal / measured if measured else 0.0)
        out.append(
            {
                "target": f"{case.name} {'tasks/s >=' if higher else 'ms/step <='}",
                "goal": goal,
                "measured": measured,
                "ratio": round(ratio, 3),
                "met": ratio >= 1.0,
            }
        )

    if durable:
        for concurrency in CONCURRENCIES:
            for workers in WORKER_COUNTS:
                add("W2", "postgres", workers, concurrency, 3.0)
        add("W1", "postgres", 2, 1, 1_000.0)
        add("W1", "postgres", 2, None, 2_000.0)
    add("W1", "sqlite", 2, None, 3_500.0)
    add("W2", "sqlite", 2, None, 0.9)
    return out


def print_client_table(
    results: dict[ClientCase, dict[str, object]], goals: list[dict[str, object]]
) -> None:
    """The cases with their median figure, every run's figure and load."""
    print("client-observed (Engine.submit -> Engine.wait -> result), median of runs:")
    header = f"{'case':<28} {'figure':>9} {'unit':<8} {'runs':<28} load (1 min) per run"
    print(header)
    print("-" * len(header))
    for case, row in results.items():
        unit = "ms/step" if case.label == "W2" else "tasks/s"
        runs = ", ".join(str(r) for r in row["runs"])  # type: ignore[attr-defined]
        loads = ", ".join(str(load[0]) for load in row["loads"])  # type: ignore[attr-defined]
        print(f"{case.name:<28} {row['figure']!s:>9} {unit:<8} {runs:<28} {loads}")
    print_targets(goals)


def print_targets(goals: list[dict[str, object]]) -> None:
    """The targets with their goal, measured figure and ratio (nothing when empty)."""
    if not goals:
        return
    print()
    print(f"{'target':<40} {'goal':>8} {'measured':>10} {'ratio':>7} met")
    for g in goals:
        print(
            f"{g['target']!s:<40} {g['goal']!s:>8} {g['measured']!s:>10} "
            f"{g['ratio']!s:>7} {'yes' if g['met'] else 'no'}"
        )
