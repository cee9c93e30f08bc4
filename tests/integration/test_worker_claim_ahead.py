"""The claim ahead with real ``dagwerk worker`` processes (default settings):
long tasks are not hoarded, so two workers share ten 1 s tasks (on a SQLite
file and on PostgreSQL); on a SQLite file, deliveries one worker claimed
ahead go back when it gets SIGTERM and another worker runs them at once (not
after their lease). Plugins in ``claim_ahead_plugins.py``; each entry into a
plugin leaves a marker file naming its task, attempt and process."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from dagwerk.constants import DEFAULT_CLAIM_AHEAD, InputMode, RunStatus, TaskStatus
from dagwerk.engine import Engine
from dagwerk.models import DagNode, EdgeSource, InputEdge
from dagwerk.testing.waits import wait_until

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGTERM")

PLUGINS = str(Path(__file__).resolve().parent / "claim_ahead_plugins.py")
_SERVING = re.compile(r"^worker (\S+) serving ", re.MULTILINE)
DEFAULT_CONCURRENCY = 4  # `dagwerk worker` without --concurrency


class _Worker:
    """One ``dagwerk worker --db URL --plugins claim_ahead_plugins.py``, no other flag."""

    def __init__(self, url: str, events: Path, name: str) -> None:
        self.log = events.parent / f"{name}.err"
        env = {**os.environ, "DAGWERK_EVENTS": str(events), "PYTHONUNBUFFERED": "1"}
        env.pop("DAGWERK_DB", None)
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dagwerk", "worker", "--db", url, "--plugins", PLUGINS],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                cwd=events.parent,
            )

    @property
    def worker_id(self) -> str | None:
        found = _SERVING.search(self.log.read_text())
        return found.group(1) if found else None

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def _fan(plugin: str, field: str) -> list[DagNode]:
    return [
        DagNode(slug="gen", plugin="ca_gen"),
        DagNode(
            slug="work",
            plugin=plugin,
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="items", source="gen"),),
            bindings={
                "n": EdgeSource(edge="items", field="n"),
                field: EdgeSource(edge="items", field=field),
            },
        ),
    ]


def _started(events: Path, pid: int | None = None) -> set[str]:
    """Task IDs (as in the marker names) whose plugin was entered, by ``pid``'s process."""
    found = set()
    for marker in events.glob("started-*"):
        task, _, owner = marker.name.removeprefix("started-").rpartition("-")
        if pid is None or int(owner) == pid:
            found.add(task.rpartition("-")[0])
    return found


@pytest.fixture
def setting(tmp_path: Path) -> Iterator[tuple[Engine, str, Path]]:
    db = tmp_path / "ahead.db"
    events = tmp_path / "events"
    events.mkdir()
    url = f"sqlite:///{db}"
    engine = Engine(url, execution_root=tmp_path)
    try:
        yield engine, url, events
    finally:
        engine.close()


def _leased_to(db: Path, worker_id: str | None) -> int:
    """Queue rows under a lease of ``worker_id`` (read from the file itself:
    no store method lists lease holders)."""
    with closing(sqlite3.connect(db)) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM dagwerk_deliveries WHERE lease_owner = ?", (worker_id,)
        ).fetchone()
    return int(count)


def _work_attempts(engine: Engine, run_id: str) -> list[tuple[str, str, TaskStatus | None]]:
    """(task, worker, status) of every attempt of the run's ``work`` tasks
    (status ``None``: the attempt is unsettled)."""
    store = engine.store
    rows = []
    for task in store.list_tasks(run_id):
        if task.node_index != 1:
            continue
        for attempt in store.list_attempts(task.task_id):
            rows.append((task.task_id, attempt.worker_id or "", attempt.status))
    return rows


def test_two_default_workers_share_ten_one_second_tasks(database_url: str, tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    with Engine(database_url, execution_root=tmp_path) as engine:
        workers = [_Worker(database_url, events, f"w{n}") for n in range(2)]
        try:
            wait_until(
                lambda: all(w.worker_id for w in workers), "both workers to serve", timeout=60
            )
            run_id = engine.submit(_fan("ca_nap", "seconds"), {"count": 10, "seconds": 1.0})
            assert engine.wait(run_id, timeout=120).status is RunStatus.COMPLETED
            ran = {
                worker
                for _, worker, status in _work_attempts(engine, run_id)
                if status is TaskStatus.COMPLETED
            }
            assert ran == {w.worker_id for w in workers}
            assert len(_started(events)) == 10
        finally:
            for worker in workers:
                worker.kill()


def test_work_claimed_ahead_goes_back_on_sigterm_and_another_worker_runs_it(
    setting: tuple[Engine, str, Path],
) -> None:
    engine, url, events = setting
    db = events.parent / "ahead.db"
    # Items below `fast` return at once (the worker times ca_step short and
    # claims ahead); the rest block, so the claimed-ahead ones wait unstarted.
    count, fast = 40, 8
    first = _Worker(url, events, "first")
    second: _Worker | None = None
    try:
        wait_until(lambda: first.worker_id is not None, "the first worker to serve", timeout=60)
        run_id = engine.submit(_fan("ca_step", "fast"), {"count": count, "fast": fast})
        pid = first.proc.pid
        wait_until(
            lambda: len(_started(events, pid)) == fast + DEFAULT_CONCURRENCY,
            "the first worker's runners to block",
            timeout=60,
            interval=0.02,
        )

        def held() -> list[str]:
            return [
                task
                for task, worker, status in _work_attempts(engine, run_id)
                if worker == first.worker_id and status is None  # claimed, unsettled
            ]

        # Claimed beyond the runners, within the bound of one batch.
        claimed = held()
        assert DEFAULT_CONCURRENCY < len(claimed) <= 2 * DEFAULT_CONCURRENCY + DEFAULT_CLAIM_AHEAD
        assert _leased_to(db, first.worker_id) == len(claimed)
        assert first.terminate() == 0
        assert _leased_to(db, first.worker_id) == 0  # all given back, none left to its lease
        (events / "release").write_text("go")
        given_back = time.monotonic()
        second = _Worker(url, events, "second")
        assert engine.wait(run_id, timeout=60).status is RunStatus.COMPLETED
        # Well within the 60 s lease the given-back deliveries would have waited.
        assert time.monotonic() - given_back < 30
        attempts = _work_attempts(engine, run_id)
        by_first = {task for task, worker, _ in attempts if worker == first.worker_id}
        never_started = {t for t in by_first if t.replace(":", "_") not in _started(events, pid)}
        # Held: the batch's own fast items (returned, settled with the batch),
        # the runners' blocked ones, and the rest claimed ahead, never started.
        assert len(never_started) >= len(claimed) - 2 * DEFAULT_CONCURRENCY > 0
        completed = {
            task: worker for task, worker, status in attempts if status is TaskStatus.COMPLETED
        }
        assert len(completed) == count
        assert all(completed[task] == second.worker_id for task in never_started)
    finally:
        first.kill()
        if second is not None:
            second.kill()
