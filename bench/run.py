"""dagwerk's benchmark suite: ``python -m bench`` or ``python bench/run.py``.

Workloads, each on a fresh database, with real ``dagwerk worker`` processes:

  W1  fan-out/fan-in: root emits 1,000 items -> 1,000 EACH tasks -> one ALL
      join; tasks/s from submit to the run's terminal commit
  W2  chain of 200 single-task steps; mean and p99 per-hop latency (parent
      plugin returned -> child plugin entered; see bench/workloads.py)
  W3  wide: W1 with 100,000 items (10,000 unless --full); tasks/s and the
      peak RSS of the workers and of the submitter
  W4  1,000 five-node runs submitted at once; runs/s
  W5  scaling: W1 at 1,000 / 10,000 / 100,000 items (--full; otherwise up to
      10,000)

SQLite runs with 1 and 2 workers; PostgreSQL (``--postgres URL`` or
``DAGWERK_BENCH_POSTGRES_URL``) with 1, 2 and 4. The raw commit rate of each
database, measured here, is the ceiling. Identical cases are measured once
(W1 is W5's first point; without --full W3 is W5's 10,000 point). The short
cases (W1, W2) run three times (``--repeat``), each on a fresh database with
fresh workers, and report the median run with every run's figure. Prints a
table, the suite's targets against the figures, and a JSON document
(also written to ``--json PATH``). ``--profile DIR`` runs the selected cases
with every worker thread and the submitter under cProfile and writes the
statistics (``.prof`` and a text summary) to DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the bench package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _env, _procs
from bench._cluster import DurableCluster
from bench._procs import WorkerProcs, run_submitter
from bench.client import (
    client_cases,
    client_targets,
    print_client_table,
    print_targets,
    run_client_suite,
)

ALL_WORKLOADS = ("W1", "W2", "W3", "W4", "W5")
WORKER_COUNTS = {"sqlite": (1, 2), "postgres": (1, 2, 4)}
CHAIN_LENGTH = 200
MANY_RUNS = 1_000


@dataclass(frozen=True)
class Case:
    """One measured configuration; workloads that map to the same case share it."""

    backend: str
    workers: int
    kind: str  # fanout, chain, many
    size: int


REPEATS = 3
"""Default runs of each short case (W1's 1,000-item fan-out and W2's chain;
``--repeat``). One run of W1 on PostgreSQL with 4 workers spread from 2,185
to 2,610 tasks/s over six runs of the same code on this VM: the row reported
is the median run, and its ``repeats`` lists every run's figure."""


def repeats_of(case: Case, repeat: int) -> int:
    """How many times ``case`` is measured: short cases ``repeat`` times (each
    on a fresh database with fresh workers), the long ones once."""
    short = case.kind == "chain" or (case.kind == "fanout" and case.size <= 1_000)
    return max(1, repeat) if short else 1


def figure_of(case: Case, row: dict[str, object]) -> float:
    """The figure a case's runs are ranked by: the mean hop of a chain, else tasks/s."""
    key = "hop_mean_ms" if case.kind == "chain" else "tasks_per_s"
    value = row.get(key)
    return float(value) if isinstance(value, int | float) else float("nan")


def median_run(case: Case, rows: list[dict[str, object]]) -> dict[str, object]:
    """The median of ``rows`` (runs of ``case``, in the order they ran) by
    :func:`figure_of`, with every run's figure under ``repeats``. With an
    even count the slower of the two middle runs is reported."""
    if len(rows) == 1:
        return rows[0]
    chain = case.kind == "chain"
    # Slowest first: a longer hop, or fewer tasks per second.
    ranked = sorted(rows, key=lambda row: figure_of(case, row), reverse=chain)
    chosen = dict(ranked[(len(ranked) - 1) // 2])
    chosen["repeats"] = [figure_of(case, row) for row in rows]
    return chosen


def workload_cases(label: str, full: bool) -> list[tuple[str, int]]:
    """(kind, size) measured for a workload label."""
    if label == "W1":
        return [("fanout", 1_000)]
    if label == "W2":
        return [("chain", CHAIN_LENGTH)]
    if label == "W3":
        return [("fanout", 100_000 if full else 10_000)]
    if label == "W4":
        return [("many", MANY_RUNS)]
    if label == "W5":
        return [("fanout", n) for n in ((1_000, 10_000, 100_000) if full else (1_000, 10_000))]
    raise ValueError(label)


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure(
    case: Case,
    url: str,
    directory: Path,
    *,
    concurrency: int | None,
    executor: str,
    profile: Path | None,
) -> dict[str, object]:
    """Run one case against the fresh database at ``url``."""
    prof_stem = f"{case.backend}-{case.kind}{case.size}-w{case.workers}"
    workers = WorkerProcs(
        url,
        case.workers,
        directory,
        concurrency=concurrency,
        executor=executor,
        profile=profile / f"worker-{prof_stem}.prof" if profile else None,
    )
    workers.start()
    try:
        result = run_submitter(
            url,
            case.kind,
            case.size,
            directory,
            profile / f"submitter-{prof_stem}.prof" if profile else None,
        )
    finally:
        workers.stop()
    errors = workers.errors()
    seconds = float(result["seconds"])
    row: dict[str, object] = {
        "backend": case.backend,
        "workers": case.workers,
        "pipeline": case.kind,
        "size": case.size,
        "runs": result["runs"],
        "tasks": result["tasks"],
        "status": ",".join(result["statuses"]),
        "seconds": round(seconds, 3),
        "submit_seconds": round(float(result["submit_seconds"]), 3),
        "tasks_per_s": round(int(result["tasks"]) / seconds, 1),
        "runs_per_s": round(int(result["runs"]) / seconds, 1),
        "worker_peak_rss_mb": round(max(workers.peak_rss or [0.0]), 1),
        "submitter_peak_rss_mb": round(float(result["submitter_peak_rss_mb"]), 1),
        "worker_errors": bool(errors),
    }
    if case.kind == "chain":
        from bench.workloads import read_hops

        hops = read_hops(directory)
        row["hops"] = len(hops)
        row["hop_mean_ms"] = round(statistics.fmean(hops) * 1000, 3) if hops else None
        row["hop_p99_ms"] = round(_percentile(hops, 0.99) * 1000, 3) if hops else None
    if errors:
        print(errors, file=sys.stderr)
    if row["status"] != "completed":
        print(f"WARNING: {case} ended {row['status']}", file=sys.stderr)
    return row


def run_cases(
    args: argparse.Namespace, postgres_url: str | None, tmp: Path
) -> tuple[dict[Case, dict[str, object]], dict[str, list[Case]]]:
    labels = [w.strip().upper() for w in args.only.split(",")] if args.only else ALL_WORKLOADS
    backends = [args.backend] if args.backend else ["sqlite", "postgres"]
    if not postgres_url:
        backends = [b for b in backends if b != "postgres"]
    by_label: dict[str, list[Case]] = {}
    order: list[Case] = []
    for label in labels:
        for backend in backends:
            counts = args.workers or WORKER_COUNTS[backend]
            for workers in counts:
                for kind, size in workload_cases(label, args.full):
                    case = Case(backend, workers, kind, size)
                    by_label.setdefault(label, []).append(case)
                    if case not in order:
                        order.append(case)
    results: dict[Case, dict[str, object]] = {}
    pg = _env.PostgresDatabases(postgres_url) if postgres_url else None
    repeat = 1 if args.profile else args.repeat
    try:
        for n, case in enumerate(order):
            runs: list[dict[str, object]] = []
            for attempt in range(repeats_of(case, repeat)):
                directory = tmp / f"case-{n}-{attempt}"
                directory.mkdir()
                url = _env.case_url(case.backend, directory, pg, f"c{n}")
                print(
                    f"[{n + 1}/{len(order)}] {case.backend} {case.kind} {case.size} "
                    f"x{case.workers} (run {attempt + 1}) ...",
                    file=sys.stderr,
                    flush=True,
                )
                runs.append(
                    measure(
                        case,
                        url,
                        directory,
                        concurrency=args.concurrency,
                        executor=args.executor,
                        profile=args.profile,
                    )
                )
                print(f"    {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
                if pg is not None and case.backend == "postgres":
                    pg.drop_all()
            results[case] = median_run(case, runs)
    finally:
        if pg is not None:
            pg.drop_all()
    return results, by_label


def targets(
    results: dict[Case, dict[str, object]], by_label: dict[str, list[Case]]
) -> list[dict[str, object]]:
    """The suite's targets next to the measured figures (only those measured)."""
    out: list[dict[str, object]] = []

    def find(label: str, backend: str, workers: int) -> dict[str, object] | None:
        for case in by_label.get(label, []):
            if case.backend == backend and case.workers == workers:
                return results[case]
        return None

    def add(name: str, target: float, measured: object, higher_is_better: bool) -> None:
        if not isinstance(measured, int | float):
            return
        ratio = measured / target if higher_is_better else target / measured if measured else 0.0
        out.append(
            {
                "target": name,
                "goal": target,
                "measured": measured,
                "ratio": round(ratio, 3),
                "met": ratio >= 1.0,
            }
        )

    for workers in (1, 2):
        w1 = find("W1", "sqlite", workers)
        if w1 and workers == 2:  # no target for one worker (its row is a reference)
            add(f"W1 sqlite {workers}w tasks/s >=", 5000.0, w1["tasks_per_s"], True)
        w2 = find("W2", "sqlite", workers)
        if w2:
            add(f"W2 sqlite {workers}w hop mean ms <=", 1.0, w2["hop_mean_ms"], False)
            add(f"W2 sqlite {workers}w hop p99 ms <=", 5.0, w2["hop_p99_ms"], False)
    for backend in ("sqlite", "postgres"):
        for workers in (1, 2, 4):
            w3, w1 = find("W3", backend, workers), find("W1", backend, workers)
            if w3:
                add(
                    f"W3 {backend} {workers}w worker RSS MB <=",
                    500.0,
                    w3["worker_peak_rss_mb"],
                    False,
                )
                if w1:
                    share = float(str(w3["tasks_per_s"])) / float(str(w1["tasks_per_s"]))
                    add(f"W3 {backend} {workers}w tasks/s / W1's >=", 0.7, round(share, 3), True)
    pg = find("W1", "postgres", 4)
    if pg:
        add("W1 postgres 4w tasks/s >=", 2000.0, pg["tasks_per_s"], True)
    return out


def print_table(
    results: dict[Case, dict[str, object]],
    by_label: dict[str, list[Case]],
    ceilings: dict[str, float],
    goals: list[dict[str, object]],
) -> None:
    header = (
        f"{'wl':<3} {'backend':<8} {'w':>1} {'size':>7} {'tasks':>7} {'s':>8} {'tasks/s':>8} "
        f"{'runs/s':>7} {'status':>9} {'hop ms':>7} {'p99 ms':>7} {'wRSS MB':>8} {'sRSS MB':>8} "
        f"{'x ceil':>7}"
    )
    print(header)
    print("-" * len(header))
    for label, cases in by_label.items():
        for case in cases:
            r = results[case]
            ceiling = ceilings.get(case.backend)
            share = float(str(r["tasks_per_s"])) / ceiling if ceiling else float("nan")
            print(
                f"{label:<3} {case.backend:<8} {case.workers:>1} {case.size:>7} {r['tasks']!s:>7} "
                f"{r['seconds']!s:>8} {r['tasks_per_s']!s:>8} {r['runs_per_s']!s:>7} "
                f"{r['status']!s:>9} "
                f"{r.get('hop_mean_ms', '')!s:>7} {r.get('hop_p99_ms', '')!s:>7} "
                f"{r['worker_peak_rss_mb']!s:>8} {r['submitter_peak_rss_mb']!s:>8} {share:>7.3f}"
            )
    repeated = [
        (label, case, results[case]["repeats"])
        for label, cases in by_label.items()
        for case in cases
        if "repeats" in results[case]
    ]
    if repeated:
        print()
        print("median of several runs (each on a fresh database); every run's figure:")
        for label, case, figures in repeated:
            print(f"  {label} {case.backend} {case.workers}w: {figures}")
    print()
    for name, rate in ceilings.items():
        print(f"raw commit rate {name}: {rate:,.0f}/s ({1e6 / rate:.0f} us per commit)")
    print_targets(goals)


def write_profile_summaries(directory: Path, top: int = 40) -> None:
    """A text summary next to each ``.prof``: top functions by self and cumulative time."""
    import io
    import pstats

    for prof in sorted(directory.glob("*.prof")):
        buffer = io.StringIO()
        stats = pstats.Stats(str(prof), stream=buffer)
        stats.strip_dirs()
        for key in ("tottime", "cumulative"):
            buffer.write(f"\n===== {prof.name} by {key} =====\n")
            stats.sort_stats(key).print_stats(top)
        prof.with_suffix(".txt").write_text(buffer.getvalue())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="dagwerk benchmark suite",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="W3/W5 at 100,000 items")
    size.add_argument("--quick", action="store_true", help="W3/W5 up to 10,000 (default)")
    parser.add_argument("--only", help="comma-separated workloads, e.g. W1,W2")
    parser.add_argument("--backend", choices=["sqlite", "postgres"])
    parser.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], help="e.g. 1,2")
    parser.add_argument("--postgres", default=os.environ.get("DAGWERK_BENCH_POSTGRES_URL"))
    parser.add_argument(
        "--concurrency",
        type=lambda s: None if s == "default" else int(s),
        default=32,
        help="batch size and most threads per worker (`dagwerk worker --concurrency`; "
        "`default`: no flag, the worker's default); 32 is what docs/performance.md reports",
    )
    parser.add_argument("--executor", default="thread", choices=["thread", "async", "process"])
    parser.add_argument("--json", type=Path, help="also write the JSON document here")
    parser.add_argument("--profile", type=Path, help="cProfile workers and submitter into DIR")
    parser.add_argument(
        "--src",
        type=Path,
        help="import dagwerk from this src directory in the workers and submitter "
        "(e.g. a `git archive HEAD src` export); default: this checkout's src",
    )
    parser.add_argument("--commits", type=int, default=5_000, help="raw commits to time")
    parser.add_argument(
        "--repeat",
        type=int,
        default=REPEATS,
        help="runs of each short case (W1 at 1,000 items, W2), each on a fresh database; "
        "the median run is reported (1 with --profile)",
    )
    parser.add_argument(
        "--client",
        action="store_true",
        help="the client-observed suite (bench/client.py): W1 and W2 timed by a client "
        "that calls Engine.submit and Engine.wait, 1 and 2 workers, at --concurrency 1 "
        "and at the worker's default",
    )
    parser.add_argument(
        "--durable-postgres",
        action="store_true",
        help="start a PostgreSQL cluster with fsync=on and synchronous_commit=on "
        "(initdb/pg_ctl in a temporary directory, 127.0.0.1, a free port) for this run, "
        "and stop it at the end; it replaces --postgres",
    )
    args = parser.parse_args(argv)
    if args.durable_postgres:
        with _durable_cluster() as url:
            args.postgres = url
            _main(parser, args, durable=True)
        return
    _main(parser, args, durable=False)


@contextmanager
def _durable_cluster() -> Iterator[str]:
    """A durable PostgreSQL cluster for the run; its URL. Its directory is
    readable by the ``postgres`` user, which runs the server."""
    directory = Path(tempfile.mkdtemp(prefix="dagwerk-bench-pg-"))
    directory.chmod(0o755)
    cluster = DurableCluster(directory / "cluster")
    try:
        print(f"starting a durable PostgreSQL cluster in {directory} ...", file=sys.stderr)
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace, *, durable: bool) -> None:
    if args.client:
        _client_main(args, durable=durable)
        return
    if args.backend == "postgres" and not args.postgres:
        parser.error("--backend postgres needs --postgres URL or DAGWERK_BENCH_POSTGRES_URL")
    if args.profile:
        args.profile = args.profile.resolve()
        args.profile.mkdir(parents=True, exist_ok=True)
    if args.src:
        _procs.SRC[0] = args.src.resolve()
        sys.path.insert(0, str(_procs.SRC[0]))
    postgres_url = args.postgres if args.backend in (None, "postgres") else None
    started = time.time()
    calibration = _env.python_calibration_ms()
    cpu_before = _env.cpu_times()
    with tempfile.TemporaryDirectory(prefix="dagwerk-bench-") as tmp_name:
        tmp = Path(tmp_name)
        ceilings: dict[str, float] = {}
        sqlite_extra: dict[str, float] = {}
        if args.backend in (None, "sqlite"):
            ceilings["sqlite"] = _env.sqlite_commit_rate(tmp, args.commits, "NORMAL")
            sqlite_extra["FULL"] = _env.sqlite_commit_rate(tmp, args.commits, "FULL")
        if postgres_url:
            ceilings["postgres"] = _env.postgres_commit_rate(postgres_url, args.commits)
        results, by_label = run_cases(args, postgres_url, tmp)
    steal = _env.steal_share(cpu_before, _env.cpu_times())
    goals = targets(results, by_label)
    warning = _env.speed_warning(calibration)
    settings: dict[str, object] = {
        "mode": "full" if args.full else "quick",
        "worker": "dagwerk worker (separate processes, CLI defaults)",
        "worker_concurrency": args.concurrency,
        "executor": args.executor,
        "sqlite_synchronous": "NORMAL (WAL; the store's setting)",
        "submitter": "separate process; Engine.submit, polls get_run every 50 ms",
        "timing": "submit start -> max(run.finished_at), both time.time()",
        "hop": "child plugin entered - parent plugin returned (includes the parent's commit)",
    }
    if postgres_url:
        settings["postgres_server"] = _env.postgres_settings(postgres_url)
    document = {
        "started_at": started,
        "machine": {
            **_env.machine(),
            "python_calibration_ms": calibration,
            "reference_calibration_ms": list(_env.REFERENCE_CALIBRATION_MS),
            "speed_warning": warning,
            "cpu_steal_share": steal,
        },
        "versions": _env.versions(postgres_url),
        "settings": settings,
        "ceilings_commits_per_s": {k: round(v) for k, v in ceilings.items()},
        "sqlite_commits_per_s_synchronous_full": {k: round(v) for k, v in sqlite_extra.items()},
        "workloads": {
            label: [results[case] for case in cases] for label, cases in by_label.items()
        },
        "source": _env.source(_procs.SRC[0]),
        "targets": goals,
    }
    print_table(results, by_label, ceilings, goals)
    print()
    print(
        f"python calibration: {calibration} ms (a fixed workload; lower is faster); "
        f"CPU steal during the run: {'unknown' if steal is None else f'{100 * steal:.1f} %'}"
    )
    if warning:
        print(f"WARNING: {warning}")
    _env.emit_document(document, args.json)
    if args.profile:
        write_profile_summaries(args.profile)


def _client_main(args: argparse.Namespace, *, durable: bool) -> None:
    """The client-observed suite (``--client``); see bench/client.py."""
    if args.src:
        _procs.SRC[0] = args.src.resolve()
        sys.path.insert(0, str(_procs.SRC[0]))
    backends = [args.backend] if args.backend else ["sqlite", "postgres"]
    if not args.postgres:
        backends = [b for b in backends if b != "postgres"]
    labels = [w.strip().upper() for w in args.only.split(",")] if args.only else ["W1", "W2"]
    labels = [label for label in labels if label in ("W1", "W2")]
    cases = client_cases(backends, labels)
    if args.workers:
        cases = [case for case in cases if case.workers in args.workers]
    load_before = [round(x, 2) for x in os.getloadavg()]
    calibration = _env.python_calibration_ms()
    cpu_before = _env.cpu_times()
    urls = {"postgres": args.postgres} if "postgres" in backends else {}
    with tempfile.TemporaryDirectory(prefix="dagwerk-bench-") as tmp_name:
        tmp = Path(tmp_name)
        ceilings: dict[str, float] = {}
        if "postgres" in backends:
            ceilings["postgres"] = _env.postgres_commit_rate(args.postgres, args.commits)
        results = run_client_suite(cases, urls, tmp, args.repeat)
    steal = _env.steal_share(cpu_before, _env.cpu_times())
    load_after = [round(x, 2) for x in os.getloadavg()]
    goals = client_targets(results, durable)
    document = {
        "mode": "client-observed",
        "machine": {
            **_env.machine(),
            "python_calibration_ms": calibration,
            "reference_calibration_ms": list(_env.REFERENCE_CALIBRATION_MS),
            "cpu_steal_share": steal,
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
        "versions": _env.versions(args.postgres if "postgres" in backends else None),
        "postgres_server": _env.postgres_settings(args.postgres)
        if "postgres" in backends
        else None,
        "ceilings_commits_per_s": {k: round(v) for k, v in ceilings.items()},
        "cases": [{"case": case.name, **row} for case, row in results.items()],
        "source": _env.source(_procs.SRC[0]),
        "targets": goals,
    }
    print_client_table(results, goals)
    print()
    for name, rate in ceilings.items():
        print(f"raw commit rate {name}: {rate:,.0f}/s ({1e6 / rate:.0f} us per commit)")
    if document["postgres_server"]:
        print(f"postgres settings: {document['postgres_server']}")
    print(
        f"python calibration: {calibration} ms (reference {_env.REFERENCE_CALIBRATION_MS}); "
        f"load average before {load_before}, after {load_after}; CPU steal "
        f"{'unknown' if steal is None else f'{100 * steal:.1f} %'}"
    )
    warning = _env.speed_warning(calibration)
    if warning:
        print(f"WARNING: {warning}")
    _env.emit_document(document, args.json)


if __name__ == "__main__":
    main()
