"""Schedules and idempotent submits across processes on SQLite and
PostgreSQL: the scheduling lease holder is killed (SIGKILL) right after a
tick's commit, and several processes submit with one idempotency key."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.testing.helpers import root
from dagwerk.testing.postgres import fresh_schema_url

HELPER = Path(__file__).with_name("sched_proc.py")
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'procs.db'}"
        return
    with fresh_schema_url(request.getfixturevalue("postgres_url"), "sched") as found:
        yield found


def _spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    environment = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
    return subprocess.Popen(
        [sys.executable, str(HELPER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )


def _poll(condition: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail("condition not met in time")
        time.sleep(0.05)


def test_killing_the_lease_holder_mid_tick_loses_no_tick_and_doubles_none(
    url: str, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    with Engine(url) as engine:
        engine.register_pipeline([root("a")], "p")
        engine.schedule("fast", "p", every="1s", catchup="all", catchup_limit=1_000)
        holder = _spawn("schedule", url, "doomed", str(stop), env={"KILL_AFTER": "3"})
        _, err = holder.communicate(timeout=60)
        assert holder.returncode == -signal.SIGKILL, err
        killed_at = max(f.tick for f in engine.schedule_fires("fast", 100))
        others = [_spawn("schedule", url, f"w{i}", str(stop)) for i in range(2)]
        try:
            # The lease (2 s) expires, another process takes over and catches up.
            _poll(
                lambda: max(f.tick for f in engine.schedule_fires("fast", 5)) >= killed_at + 4, 60
            )
        finally:
            stop.touch()
            for process in others:
                _, err = process.communicate(timeout=60)
                assert process.returncode == 0, err
        fires = sorted(engine.schedule_fires("fast", 1_000), key=lambda f: f.tick)
        ticks = [f.tick for f in fires]
        assert ticks == list(range(ticks[0], ticks[-1] + 1))  # no tick lost
        run_ids = [f.run_id for f in fires]
        assert None not in run_ids and len(set(run_ids)) == len(ticks)  # none doubled
        runs = engine.list_runs(limit=1_000)
        assert {r.run_id for r in runs} == set(run_ids)  # no run without its tick
        # The run the killed holder committed but never started was started.
        assert all(r.status is RunStatus.RUNNING for r in runs)


def test_concurrent_submits_with_one_key_create_one_run(url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    with Engine(url):
        pass  # the schema exists before the processes race
    processes = [_spawn("submit", url, "order-7", str(go)) for _ in range(4)]
    for process in processes:  # every store is open: the go file starts the race
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    go.touch()
    answers = []
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        answers.append(out.strip())
    assert len(set(answers)) == 1
    with Engine(url) as engine:
        assert [r.run_id for r in engine.list_runs()] == [answers[0]]
