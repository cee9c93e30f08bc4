"""Metrics and health over real HTTP during a real run (SQLite file), and
backstop passes that never overlap across two real processes (GD-09)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
import threading
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from dagwerk.constants import InputMode, RunStatus, TaskStatus
from dagwerk.engine import Engine
from dagwerk.health import HealthServer, HealthState
from dagwerk.metrics import Metrics
from dagwerk.models import DagNode, InputEdge, TaskInputs
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.retry_policy import RetryPolicy


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def _total(text: str, name: str) -> float:
    return sum(_samples(text, name).values())


NODES = [
    DagNode(slug="fan", plugin="fan"),
    DagNode(
        slug="work",
        plugin="work",
        input_mode=InputMode.EACH,
        edges=(InputEdge(name="items", source="fan"),),
    ),
]


def test_metrics_scraped_during_a_run_add_up_to_the_tasks_that_ran(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'metrics.db'}"
    release = threading.Event()
    with Engine(url, execution_root=tmp_path) as engine:

        @engine.plugin("fan")
        def fan(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, object]]:
            return [{"n": n} for n in range(6)]

        @engine.plugin(
            "work", retry=RetryPolicy(max_attempts=3, backoff_base=0.01, backoff_max=0.01)
        )
        def work(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            # Hold the run open until the test has scraped it mid-run.
            release.wait(30)
            if ctx.attempt == 1 and ctx.task_id.endswith(("0", "1", "2", "3")):
                raise RuntimeError("flaky")  # some attempts fail and are retried
            return {"ok": True}

        metrics = Metrics(store=engine.store)
        worker = engine.worker(concurrency=3, backstop_interval=30.0)
        health = HealthState(engine.store, backstop=worker.backstop)
        worker.observers.extend([metrics, health])
        worker.callbacks = metrics.callbacks(worker.callbacks)
        with HealthServer(metrics, health) as server:
            assert server.host == "127.0.0.1"
            run_id = engine.submit(NODES)
            worker.start()
            try:
                # Mid-run: the fan task completed, work tasks are running.
                for _ in range(600):
                    status, text = _get(f"{server.url}/metrics")
                    if _total(text, "dagwerk_tasks_started_total") >= 4:
                        break
                    release.wait(0.05)
                assert status == 200
                assert _samples(text, "dagwerk_runs")[(("status", "running"),)] == 1
                assert _total(text, "dagwerk_tasks_started_total") >= 4
                release.set()
                result = engine.wait(run_id, timeout=60)
            finally:
                worker.stop()
            assert result.status is RunStatus.COMPLETED
            status, text = _get(f"{server.url}/metrics")
            assert status == 200
            attempts = [
                attempt
                for task in engine.list_tasks(run_id)
                for attempt in engine.list_attempts(task.task_id)
            ]
            tasks = engine.list_tasks(run_id)
            assert all(t.status is TaskStatus.COMPLETED for t in tasks)
            started = _total(text, "dagwerk_tasks_started_total")
            completed = _total(text, "dagwerk_tasks_completed_total")
            retried = _total(text, "dagwerk_tasks_retried_total")
            failed = _total(text, "dagwerk_tasks_failed_total")
            assert started == len(attempts)  # every attempt that ran was counted once
            assert completed == len(tasks) == 7
            assert started == completed + retried + failed
            assert retried == len(attempts) - len(tasks)
            by_node = _samples(text, "dagwerk_tasks_completed_total")
            assert by_node[(("node", "work"), ("plugin", "work"))] == 6
            assert _samples(text, "dagwerk_runs")[(("status", "completed"),)] == 1
            assert _total(text, "dagwerk_run_duration_seconds_count") == 1
            assert _total(text, "dagwerk_task_duration_seconds_count") == started
            assert _total(text, "dagwerk_backstop_passes_total") >= 1
            assert _samples(text, "dagwerk_queue_depth") in ({}, {(("queue", "default"),): 0.0})
            code, body = _get(f"{server.url}/healthz")
            assert code == 200, body
            document = json.loads(body)
            assert document["database_reachable"] is True
            assert document["backstop_age_seconds"] is not None
            assert _get(f"{server.url}/nothing")[0] == 404


class _Unreachable:
    def get_run_status(self, run_id: str) -> None:
        raise ConnectionError("database is down")


def test_healthz_is_503_when_the_database_is_unreachable() -> None:
    health = HealthState(_Unreachable())
    with HealthServer(Metrics(), health) as server:
        code, body = _get(f"{server.url}/healthz")
    assert code == 503
    document = json.loads(body)
    assert document["status"] == "unhealthy" and document["database_reachable"] is False
    assert "database unreachable" in document["problems"][0]


_PASSES = textwrap.dedent(
    """
    import sys, time
    from dagwerk.backends.sqlite import SqliteStore
    from dagwerk.runtime.backstop import Backstop

    db, out, holder = sys.argv[1:4]
    store = SqliteStore(db)
    log = open(out, "a", buffering=1)

    def on_pass(event):
        log.write(f"{event} {time.time():.6f}\\n")
        if event == "start":
            time.sleep(0.03)  # widen the window an overlap would need

    backstop = Backstop(store, interval=None, holder=holder, on_pass=on_pass)
    deadline = time.time() + 2.0
    ran = 0
    while time.time() < deadline:
        if backstop.run_pass().ran:
            ran += 1
        time.sleep(0.005)
    log.write(f"ran {ran}\\n")
    store.close()
    """
)


def test_gd_09_backstop_passes_never_overlap_across_processes(tmp_path: Path) -> None:
    db = tmp_path / "lease.db"
    with Engine(f"sqlite:///{db}", execution_root=tmp_path) as engine:
        engine.submit([DagNode(slug="a", plugin="a")])  # something to pass over
    script = tmp_path / "passes.py"
    script.write_text(_PASSES)
    outs = [tmp_path / f"out-{n}.txt" for n in range(2)]
    procs = [
        subprocess.Popen([sys.executable, str(script), str(db), str(out), f"holder-{n}"])
        for n, out in enumerate(outs)
    ]
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    intervals: list[tuple[float, float]] = []
    for out in outs:
        lines = out.read_text().split("\n")
        assert int(lines[-2].split()[1]) >= 1, "each process ran at least one pass"
        events = [line.split() for line in lines if line.startswith(("start", "end"))]
        for opened, closed in zip(events[::2], events[1::2], strict=True):
            assert (opened[0], closed[0]) == ("start", "end")
            intervals.append((float(opened[1]), float(closed[1])))
    intervals.sort()
    assert len(intervals) >= 2
    for (_, first_end), (second_start, _) in itertools.pairwise(intervals):
        assert second_start >= first_end, "two backstop passes overlapped"
