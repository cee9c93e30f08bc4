"""Helpers of the PostgreSQL worker-process tests (not a test module).

Each test gets its own schema on the server, named in the URL
(``?options=-csearch_path=...``), so ``dagwerk worker --db URL`` processes
and the test's own store see the same tables and nothing else. Workers are
``python -m dagwerk worker`` subprocesses; their stderr goes to a file, from
which the test reads the worker ID each one announces.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import psycopg

from dagwerk.backends.postgres import PostgresStore
from dagwerk.constants import InputMode, RunStatus, TaskStatus
from dagwerk.models import DagNode, EdgeSource, InputEdge

HERE = Path(__file__).resolve().parent
PLUGINS = str(HERE / "pg_worker_plugins.py")
_SERVING = re.compile(r"^worker (\S+) serving ", re.MULTILINE)


@contextmanager
def schema_url(url: str, prefix: str) -> Iterator[str]:
    """A URL whose connections use a fresh schema; dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    separator = "&" if "?" in url else "?"
    try:
        yield f"{url}{separator}options={quote(f'-csearch_path={name}')}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def fan_nodes(spread: str = "mw_spread") -> list[DagNode]:
    """gen -> one ``spread`` task per item -> one fan-in task."""
    return [
        DagNode(slug="gen", plugin="mw_gen"),
        DagNode(
            slug="spread",
            plugin=spread,
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="items", source="gen"),),
            bindings={"n": EdgeSource(edge="items", field="n")},
        ),
        DagNode(
            slug="fanin",
            plugin="mw_fanin",
            input_mode=InputMode.ALL,
            edges=(InputEdge(name="items", source="spread"),),
        ),
    ]


class WorkerProcess:
    """One ``dagwerk worker`` subprocess."""

    def __init__(self, url: str, ledger: Path, logs: Path, name: str, *args: str) -> None:
        self.log = logs / f"{name}.err"
        env = {**os.environ, "DAGWERK_LEDGER": str(ledger), "PYTHONUNBUFFERED": "1"}
        env.pop("DAGWERK_DB", None)
        with open(self.log, "w") as err, open(logs / f"{name}.out", "w") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dagwerk",
                    "worker",
                    "--db",
                    url,
                    "--plugins",
                    PLUGINS,
                    *args,
                ],
                stdout=out,
                stderr=err,
                env=env,
                cwd=logs,
            )

    def stderr(self) -> str:
        return self.log.read_text()

    @property
    def worker_id(self) -> str | None:
        found = _SERVING.search(self.stderr())
        return found.group(1) if found else None

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, then wait for the exit; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling with a deadline, not synchronisation by sleeping


def ledger_entries(ledger: Path) -> tuple[list[str], list[str]]:
    """(attempt entries, duplicate markers) of a ledger folder."""
    names = [p.name for p in ledger.iterdir() if p.name not in ("release", "stop")]
    return sorted(n for n in names if not n.startswith("dup-")), [
        n for n in names if n.startswith("dup-")
    ]


def assert_fan_settled_once(
    store: PostgresStore, run_id: str, ledger: Path, items: int, stderr: str
) -> None:
    """A :func:`fan_nodes` run of ``items`` items completed with every task
    settled once: each output published once, one completed attempt per
    task, every attempt the store recorded ran once (an attempt a fault cut
    short may have been replaced; it is recorded and ran once all the
    same), no attempt ran twice and no delivery left."""
    assert store.get_run_status(run_id) is RunStatus.COMPLETED, stderr
    outputs = store.get_output_ids(run_id, 1)
    assert len(outputs) == items == len(set(outputs))  # nothing lost, nothing twice
    tasks = store.list_tasks(run_id)
    assert len(tasks) == 1 + items + 1
    assert {t.status for t in tasks} == {TaskStatus.COMPLETED}
    entries, duplicates = ledger_entries(ledger)
    assert duplicates == []  # no attempt ran twice
    recorded = sorted(
        f"{t.task_id.replace(':', '_')}.{a.number}"
        for t in tasks
        for a in store.list_attempts(t.task_id)
    )
    assert entries == recorded
    for task in tasks:
        completed = [
            a for a in store.list_attempts(task.task_id) if a.status is TaskStatus.COMPLETED
        ]
        assert len(completed) == 1
    assert store.list_deliveries() == []


def open_store(url: str) -> PostgresStore:
    return PostgresStore(url, pool_size=2)


# --- a worker process with short leases (``python pg_workers.py work ...``) ----------


def spawn_script_worker(
    url: str, ledger: Path, logs: Path, worker_id: str, *, lease: float = 1.0
) -> subprocess.Popen[bytes]:
    """A worker process running :func:`worker_main`: a real ``Worker`` with
    ``lease``-second leases (the CLI's are 30 s), serving until
    ``ledger/stop`` exists."""
    env = {**os.environ, "DAGWERK_LEDGER": str(ledger), "PYTHONUNBUFFERED": "1"}
    with open(logs / f"{worker_id}.err", "w") as err:
        return subprocess.Popen(
            [sys.executable, __file__, "work", url, worker_id, str(lease)],
            stderr=err,
            stdout=subprocess.DEVNULL,
            env=env,
        )


def worker_main(url: str, worker_id: str, lease: float) -> None:
    import pg_worker_plugins as plugins

    from dagwerk.runtime.worker import Worker

    store = PostgresStore(url, pool_size=2)
    worker = Worker(
        store,
        {
            "mw_gen": plugins.mw_gen,
            "mw_spread": plugins.mw_spread,
            "mw_fanin": plugins.mw_fanin,
            "mw_hold": plugins.mw_hold,
        },
        concurrency=1,
        lease_seconds=lease,
        lease_grace=0.5,
        poll_interval=0.05,
        cancel_check_interval=0.25,
        worker_id=worker_id,
        execution_root=os.environ["DAGWERK_LEDGER"],
    )
    stop = Path(os.environ["DAGWERK_LEDGER"]) / "stop"
    while not stop.exists():
        worker.process_once(wait_seconds=0.2)
    worker.stop(timeout=10)
    store.close()


if __name__ == "__main__":
    if sys.argv[1] == "work":
        worker_main(sys.argv[2], sys.argv[3], float(sys.argv[4]))
