"""OpenTelemetry traces (the ``otel`` extra): one run worked by two worker
processes is one trace, rooted at the submitter's span; a process that has
not set up OpenTelemetry never imports it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "trace_processes.py")


def _spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def test_one_run_over_two_worker_processes_is_one_trace(tmp_path: Path) -> None:
    db = str(tmp_path / "traced.db")
    submitted = subprocess.run(
        [sys.executable, SCRIPT, "submit", db, str(tmp_path / "submit.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    run_id = submitted.stdout.strip()
    workers = [
        subprocess.Popen(
            [sys.executable, SCRIPT, "work", db, str(tmp_path / f"work{i}.jsonl"), run_id],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=180)
        assert worker.returncode == 0, err
    submit_spans = _spans(tmp_path / "submit.jsonl")
    per_worker = [_spans(tmp_path / f"work{i}.jsonl") for i in range(2)]
    every = submit_spans + [span for spans in per_worker for span in spans]

    (app,) = [s for s in submit_spans if s["name"] == "app.request"]
    (submit,) = [s for s in submit_spans if s["name"] == "dagwerk.submit"]
    assert submit["parent_id"] == app["span_id"]
    assert submit["attributes"]["dagwerk.run_id"] == run_id
    # One trace, whatever process made the span.
    assert {span["trace_id"] for span in every} == {app["trace_id"]}

    attempts = [s for s in every if s["name"] == "dagwerk.attempt"]
    assert sorted(s["attributes"]["dagwerk.node"] for s in attempts) == [f"n{i}" for i in range(6)]
    for span in attempts:
        assert span["parent_id"] == submit["span_id"]
        assert span["attributes"]["dagwerk.run_id"] == run_id
        assert span["attributes"]["dagwerk.attempt"] == 1
        assert span["attributes"]["dagwerk.outcome"] == "ok"
        assert span["attributes"]["dagwerk.task_id"].startswith(run_id)
        children = sorted(s["name"] for s in every if s["parent_id"] == span["span_id"])
        assert children == [
            "dagwerk.execute",
            "dagwerk.prepare",
            "dagwerk.settle",
            "dagwerk.wait",
        ]
        execute = next(
            s for s in every if s["parent_id"] == span["span_id"] and s["name"] == "dagwerk.execute"
        )
        assert execute["end"] - execute["start"] >= 150_000_000  # the plugin's 0.2 s
    # Both worker processes ran attempts of the run.
    assert all(any(s["name"] == "dagwerk.attempt" for s in spans) for spans in per_worker)

    (run,) = [s for s in every if s["name"] == "dagwerk.run"]
    assert run["parent_id"] == submit["span_id"]
    assert run["attributes"] == {"dagwerk.run_id": run_id, "dagwerk.outcome": "completed"}
    assert run["start"] <= min(s["start"] for s in attempts)
    # The run ends within the settlement of its last attempt.
    assert run["end"] >= max(s["end"] for s in every if s["name"] == "dagwerk.execute")
    assert any(s["name"] == "dagwerk.store.batch" for s in every)


def test_a_failed_attempt_carries_its_error(tmp_path: Path) -> None:
    script = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import trace_processes
exporter = trace_processes._provider()
from dagwerk.engine import Engine
from dagwerk.models import DagNode

def broken(inputs, ctx):
    raise ValueError("it broke")

with Engine("memory://", execution_root={str(tmp_path)!r}) as engine:
    engine.plugin("broken")(broken)
    engine.run([DagNode(slug="b", plugin="broken")], timeout=60)
trace_processes._dump(exporter, {str(tmp_path / "spans.jsonl")!r})
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    spans = _spans(tmp_path / "spans.jsonl")
    (attempt,) = [s for s in spans if s["name"] == "dagwerk.attempt"]
    assert attempt["attributes"]["dagwerk.outcome"] == "error"
    assert attempt["attributes"]["dagwerk.error"] == "ValueError: it broke"
    assert attempt["error"]
    (run,) = [s for s in spans if s["name"] == "dagwerk.run"]
    assert run["attributes"]["dagwerk.outcome"] == "failed" and run["error"]
    (submit,) = [s for s in spans if s["name"] == "dagwerk.submit"]
    assert attempt["parent_id"] == run["parent_id"] == submit["span_id"]


def _traced_run(tmp_path: Path, url: str, body: str) -> list[dict[str, Any]]:
    """The spans of a traced process that runs ``body`` with ``engine`` open
    on ``url`` (``memory`` or ``sqlite``) and a plugin ``noop`` registered."""
    db = "memory://" if url == "memory" else f"sqlite:///{tmp_path / 'traced.db'}"
    script = f"""
import sys, time
sys.path.insert(0, {str(HERE)!r})
import trace_processes
exporter = trace_processes._provider()
from dagwerk.engine import Engine
from dagwerk.models import DagNode

def noop(inputs, ctx):
    return {{}}

with Engine({db!r}, execution_root={str(tmp_path)!r}) as engine:
    engine.plugin("noop")(noop)
{textwrap.indent(textwrap.dedent(body), "    ")}
trace_processes._dump(exporter, {str(tmp_path / "spans.jsonl")!r})
"""
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return _spans(tmp_path / "spans.jsonl")


def _children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in spans if s["parent_id"] == parent["span_id"]}


@pytest.mark.parametrize("url", ["memory", "sqlite"])
def test_the_queue_wait_runs_from_the_enqueue_to_the_claim(tmp_path: Path, url: str) -> None:
    body = """
        run_id = engine.submit([DagNode(slug="q", plugin="noop")])
        time.sleep(0.4)  # the delivery waits in the queue with no worker to take it
        worker = engine.worker(concurrency=1)
        worker.start()
        try:
            engine.wait(run_id, timeout=60)
        finally:
            worker.stop()
    """
    spans = _traced_run(tmp_path, url, body)
    (submit,) = [s for s in spans if s["name"] == "dagwerk.submit"]
    (attempt,) = [s for s in spans if s["name"] == "dagwerk.attempt"]
    parts = _children(spans, attempt)
    assert sorted(parts) == ["dagwerk.execute", "dagwerk.prepare", "dagwerk.settle", "dagwerk.wait"]
    wait = parts["dagwerk.wait"]
    # The delivery was enqueued as the run started (after the submit's span);
    # it waited until the worker claimed it.
    assert submit["end"] <= wait["start"], (submit, wait)
    assert wait["end"] - wait["start"] >= 350_000_000
    assert attempt["start"] == wait["start"]
    assert wait["end"] == parts["dagwerk.prepare"]["start"]
    assert parts["dagwerk.prepare"]["end"] == parts["dagwerk.execute"]["start"]


@pytest.mark.parametrize("url", ["memory", "sqlite"])
def test_engine_cancel_ends_the_runs_span(tmp_path: Path, url: str) -> None:
    body = """
        run_id = engine.submit([DagNode(slug="n", plugin="noop")])
        assert engine.cancel(run_id, reason="no longer wanted")
        assert not engine.cancel(run_id)
    """
    spans = _traced_run(tmp_path, url, body)
    (submit,) = [s for s in spans if s["name"] == "dagwerk.submit"]
    (run,) = [s for s in spans if s["name"] == "dagwerk.run"]
    assert run["parent_id"] == submit["span_id"]
    assert run["trace_id"] == submit["trace_id"]
    assert run["attributes"]["dagwerk.outcome"] == "cancelled"
    assert run["attributes"]["dagwerk.run_id"] == submit["attributes"]["dagwerk.run_id"]
    assert run["start"] <= submit["end"] <= run["end"]


@pytest.mark.parametrize("url", ["memory", "sqlite"])
def test_engine_cancel_ends_the_spans_of_the_child_runs_it_cancels(
    tmp_path: Path, url: str
) -> None:
    body = """
        def hold(inputs, ctx):
            ctx.wait("gate")
            return {}

        def parent(inputs, ctx):
            ctx.wait_for_child(ctx.start_child([DagNode(slug="h", plugin="hold")], run_id="kid"))
            return {}

        engine.plugin("hold")(hold)
        engine.plugin("parent")(parent)
        worker = engine.worker(concurrency=2)
        worker.start()
        try:
            run_id = engine.submit([DagNode(slug="p", plugin="parent")])
            deadline = time.monotonic() + 60
            while engine.get_run("kid") is None or not any(
                t.status.value == "waiting" for t in engine.list_tasks("kid")
            ):
                assert time.monotonic() < deadline, "the child run never waited"
                time.sleep(0.02)
            assert engine.cancel(run_id)
        finally:
            worker.stop()
    """
    spans = _traced_run(tmp_path, url, body)
    ended = {
        s["attributes"]["dagwerk.run_id"]: s["attributes"]["dagwerk.outcome"]
        for s in spans
        if s["name"] == "dagwerk.run"
    }
    assert ended.get("kid") == "cancelled", ended
    assert list(ended.values()) == ["cancelled", "cancelled"], ended


def test_without_a_configured_sdk_opentelemetry_is_never_imported(tmp_path: Path) -> None:
    script = f"""
import sys
from dagwerk.engine import Engine
from dagwerk.models import DagNode
import dagwerk.cli

def plugin(inputs, ctx):
    ctx.logger.warning("a line")
    return {{}}

for url in ("memory://", "sqlite:///{tmp_path / "x.db"}"):
    with Engine(url, execution_root={str(tmp_path)!r}) as engine:
        engine.plugin("p")(plugin)
        assert engine.run([DagNode(slug="a", plugin="p")], timeout=60).status.value == "completed"
found = sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry")
assert not found, found
print("clean")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "clean"
