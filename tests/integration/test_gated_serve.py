"""Acceptance: ``dagwerk serve`` and ``dagwerk worker --metrics-port`` as real
processes on a free 127.0.0.1 port: ``/metrics`` and ``/healthz`` answer 200
with their content, and SIGTERM stops each process cleanly (exit code 0)."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.models import DagNode

STARTUP_TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _total(text: str, name: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


def _gauge(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


class _Process:
    """A ``dagwerk`` CLI process whose stderr lines are read as they come."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dagwerk", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for line in self.proc.stderr:
                self.stderr.append(line)
                self.lines.put(line)
        self.lines.put(None)

    def wait_for_line(self, needle: str) -> str:
        """The first stderr line containing ``needle`` (fails if the process exits first)."""
        while True:
            try:
                line = self.lines.get(timeout=STARTUP_TIMEOUT)
            except queue.Empty:
                pytest.fail(f"no {needle!r} on stderr within {STARTUP_TIMEOUT}s: {self.stderr}")
            if line is None:
                pytest.fail(f"process exited before {needle!r}: {''.join(self.stderr)}")
            if needle in line:
                return line

    def terminate(self) -> int:
        """SIGTERM, then the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=10)
        return code

    def kill_if_running(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[list[_Process]]:
    started: list[_Process] = []
    yield started
    for process in started:
        process.kill_if_running()


PLUGINS = textwrap.dedent(
    """
    import dagwerk

    @dagwerk.plugin("fan")
    def fan(inputs, ctx):
        return [{"n": n} for n in range(3)]

    @dagwerk.plugin("work")
    def work(inputs, ctx):
        return {"done": True}
    """
)

PIPELINE = textwrap.dedent(
    """
    name: served
    plugins: [served_plugins]
    nodes:
      - slug: fan
        plugin: fan
      - slug: work
        plugin: work
        input_mode: each
        edges:
          - {name: items, source: fan}
    """
)


def test_gd_serve_exposes_metrics_and_healthz_and_stops_on_sigterm(
    tmp_path: Path, spawn: list[_Process]
) -> None:
    db = tmp_path / "serve.db"
    with Engine(f"sqlite:///{db}") as engine:
        engine.submit([_node("a")], run_id="run-served")  # one RUNNING run to count
    port = _free_port()
    served = _Process(
        ["serve", "--db", f"sqlite:///{db}", "--port", str(port), "--backstop-interval", "30"],
        tmp_path,
    )
    spawn.append(served)
    line = served.wait_for_line("serving ")
    assert f"http://127.0.0.1:{port}/metrics" in line
    base = f"http://127.0.0.1:{port}"
    status, content_type, text = _get(f"{base}/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    assert _gauge(text, "dagwerk_runs", status="running") == 1.0
    assert _gauge(text, "dagwerk_queue_depth", queue="default") == 1.0
    # The pass at start ran (nothing to repair; no worker serves the queued task).
    assert _gauge(text, "dagwerk_backstop_passes_total", outcome="ran") == 1.0
    status, content_type, body = _get(f"{base}/healthz")
    # The server works, but nothing will work the queue: unhealthy, and why.
    assert status == 503 and content_type == "application/json"
    health = json.loads(body)
    assert health["status"] == "unhealthy" and health["database_reachable"] is True
    assert health["problems"] == [
        "deliveries are waiting and no worker is live (no worker has been seen)"
    ]
    assert health["workers_live"] == 0 and health["last_worker_seen_seconds_ago"] is None
    assert health["backstop_enabled"] is True
    assert health["backstop_age_seconds"] is not None
    assert _get(f"{base}/nope")[0] == 404
    assert served.terminate() == 0
    with pytest.raises(OSError):  # the port is closed once the process is gone
        urllib.request.urlopen(f"{base}/healthz", timeout=5)


def test_gd_worker_metrics_port_counts_the_tasks_it_ran_and_stops_on_sigterm(
    tmp_path: Path, spawn: list[_Process]
) -> None:
    (tmp_path / "served_plugins.py").write_text(PLUGINS, encoding="utf-8")
    pipeline = tmp_path / "served.yaml"
    pipeline.write_text(PIPELINE, encoding="utf-8")
    db = tmp_path / "worker.db"
    port = _free_port()
    worker = _Process(
        [
            "worker",
            "--db",
            f"sqlite:///{db}",
            "--pipeline",
            str(pipeline),
            "--metrics-port",
            str(port),
            "--concurrency",
            "2",
        ],
        tmp_path,
    )
    spawn.append(worker)
    assert f"http://127.0.0.1:{port}/metrics" in worker.wait_for_line("metrics on ")
    base = f"http://127.0.0.1:{port}"
    with Engine(f"sqlite:///{db}") as engine:
        from dagwerk.pipeline_file import load_pipeline

        run_id = engine.submit(load_pipeline(pipeline))
        result = engine.wait(run_id, timeout=120)
        assert result.status is RunStatus.COMPLETED
        ran = len(engine.list_tasks(run_id))
    assert ran == 4  # fan + three work tasks
    status, _, text = _get(f"{base}/metrics")
    assert status == 200
    assert _total(text, "dagwerk_tasks_started_total") == ran
    assert _total(text, "dagwerk_tasks_completed_total") == ran
    assert _total(text, "dagwerk_tasks_failed_total") == 0
    assert _gauge(text, "dagwerk_runs", status="completed") == 1.0
    status, _, body = _get(f"{base}/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    assert worker.terminate() == 0
    assert "Traceback" not in "".join(worker.stderr)


def _node(slug: str) -> DagNode:
    return DagNode(slug=slug, plugin=slug)
