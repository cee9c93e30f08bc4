"""The machine, the versions and the databases of a benchmark run.

* :func:`machine` and :func:`versions` describe where the figures come from.
* :func:`sqlite_commit_rate` and :func:`postgres_commit_rate` measure the
  ceiling: one-row ``INSERT`` transactions per second on one connection,
  with the settings the stores use (SQLite: WAL, the given ``synchronous``,
  ``BEGIN IMMEDIATE``; PostgreSQL: ``BEGIN``/``INSERT``/``COMMIT``).
* :class:`PostgresDatabases` makes a fresh database per case and drops it.
"""

from __future__ import annotations

import os
import platform
import sqlite3
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "REFERENCE_CALIBRATION_MS",
    "PostgresDatabases",
    "case_url",
    "cpu_times",
    "emit_document",
    "machine",
    "postgres_commit_rate",
    "postgres_settings",
    "python_calibration_ms",
    "source",
    "speed_warning",
    "sqlite_commit_rate",
    "steal_share",
    "versions",
]


def machine() -> dict[str, object]:
    """CPU count, model, memory and kernel of this machine."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_mb: float | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_mb = round(int(line.split()[1]) / 1024)
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_mb": memory_mb,
        "kernel": platform.release(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def python_calibration_ms(rounds: int = 7) -> float:
    """Milliseconds a fixed pure-Python workload takes here (median of
    ``rounds``): dict building, JSON encoding and decoding, sorting, as on a
    worker's hot path. A shared VM's speed drifts between days; figures
    taken on different days compare only through such a yardstick."""
    import json
    import statistics

    def workload() -> int:
        total = 0
        for n in range(4_000):
            record = {"id": f"task-{n}", "n": n, "fields": {"k": str(n), "v": [n, n + 1]}}
            total += len(json.loads(json.dumps(record, sort_keys=True))["id"])
        return total + len(sorted(str(n) for n in range(4_000)))

    timings = []
    for _ in range(rounds):
        began = time.perf_counter()
        workload()
        timings.append(time.perf_counter() - began)
    return round(1e3 * statistics.median(timings), 2)


#: :func:`python_calibration_ms` on the VM where the suite's targets were set
#: (its fast and its slow hours). The targets are absolute figures for that
#: machine.
REFERENCE_CALIBRATION_MS = (17.9, 23.4)


def speed_warning(calibration_ms: float) -> str | None:
    """A warning when this machine ran the fixed workload well outside the
    reference range (more than 15 % beyond either end), ``None`` otherwise:
    the targets' absolute figures then say little about the code, and two
    trees should be compared on the same machine (``--src``)."""
    low, high = REFERENCE_CALIBRATION_MS
    if calibration_ms > 1.15 * high:
        factor, way = calibration_ms / high, "slower"
    elif calibration_ms < low / 1.15:
        factor, way = low / calibration_ms, "faster"
    else:
        return None
    return (
        f"this machine ran the calibration workload {factor:.1f}x {way} than the VM the "
        f"targets were set on ({low}-{high} ms): read the targets' 'met' with that in "
        "mind, and compare two trees on this machine with --src"
    )


def cpu_times() -> list[int] | None:
    """The machine's cumulative CPU times (``/proc/stat``'s first line:
    user, nice, system, idle, iowait, irq, softirq, steal, ...), if readable."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu" or len(first) < 9:
        return None
    return [int(value) for value in first[1:]]


def steal_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """The share of CPU time the hypervisor took from this VM (steal)
    between two :func:`cpu_times` readings; ``None`` when unknown."""
    if before is None or after is None:
        return None
    spent = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(spent[:8])
    return round(spent[7] / total, 4) if total > 0 else None


def versions(postgres_url: str | None) -> dict[str, object]:
    """Python, SQLite, dagwerk and (given a URL) the PostgreSQL server."""
    from importlib.metadata import version

    found: dict[str, object] = {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "dagwerk": version("dagwerk"),
    }
    if postgres_url:
        import psycopg

        found["psycopg"] = psycopg.__version__
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            found["postgres"] = row[0] if row else None
    return found


def source(src: Path) -> dict[str, object]:
    """Which dagwerk was measured: the src directory, and for a git checkout its
    commit and how many files under src differ from it."""
    import subprocess

    found: dict[str, object] = {"src": str(src)}
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "."],
            cwd=src,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        found.update(git_head=head, uncommitted_files=len(dirty))
    except (OSError, subprocess.CalledProcessError):
        # An exported tree (git archive) names its commit in a COMMIT file.
        marker = src.parent / "COMMIT"
        found["git_head"] = marker.read_text().strip() if marker.is_file() else None
    return found


def postgres_settings(url: str) -> dict[str, object]:
    """The server settings that decide a commit's cost."""
    import psycopg

    names = ("fsync", "synchronous_commit", "full_page_writes", "wal_level", "max_connections")
    with psycopg.connect(url, autocommit=True) as conn:
        return {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in names}  # type: ignore[index]


def sqlite_commit_rate(directory: Path, count: int, synchronous: str = "NORMAL") -> float:
    """One-row write transactions per second on a fresh WAL file."""
    path = directory / f"raw-{synchronous.lower()}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        start = time.perf_counter()
        for n in range(count):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (v) VALUES (?)", (f"row-{n}",))
            conn.execute("COMMIT")
        return count / (time.perf_counter() - start)
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def postgres_commit_rate(url: str, count: int) -> float:
    """One-row write transactions per second on one connection, in a fresh database."""
    import psycopg

    with PostgresDatabases(url) as dbs:
        fresh = dbs.create("raw")
        with psycopg.connect(fresh, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id bigserial PRIMARY KEY, v text NOT NULL)")
            start = time.perf_counter()
            for n in range(count):
                conn.execute("BEGIN")
                conn.execute("INSERT INTO t (v) VALUES (%s)", (f"row-{n}",))
                conn.execute("COMMIT")
            return count / (time.perf_counter() - start)


class PostgresDatabases:
    """Fresh databases on the server of ``url``, dropped on exit."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"bench_{uuid.uuid4().hex[:8]}"
        self.made: list[str] = []

    def __enter__(self) -> PostgresDatabases:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.drop_all()

    def create(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg

        database = f"{self.prefix}_{name}".lower()
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        self.made.append(database)
        parts = urlsplit(self.url)
        return urlunsplit(parts._replace(path=f"/{database}"))

    def drop_all(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            for database in self.made:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        self.made.clear()


def case_url(backend: str, directory: Path, databases: PostgresDatabases | None, name: str) -> str:
    """A fresh database for one run of a case: a SQLite file in
    ``directory``, or a new database named after ``name`` on the server."""
    if backend == "sqlite":
        return f"sqlite:///{directory / 'bench.db'}"
    assert databases is not None
    return databases.create(name)


def emit_document(document: Mapping[str, object], path: Path | None) -> None:
    """Print the JSON document of a run after a blank line (and write it to ``path``)."""
    import json

    text = json.dumps(document, indent=2)
    print()
    print(text)
    if path is not None:
        path.write_text(text + "\n")
