"""Durable tasks as a user writes them first, on memory, SQLite and PostgreSQL:
the straight-line child snippet completes with one child run, recursion ends
at the depth limit, an approval completes after ``dagwerk resume``, ``show``
lists the recorded steps and waits, and a charge made in ``ctx.step`` happens
once although a real ``dagwerk worker`` is killed (SIGKILL) after it."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

from dagwerk import DagNode, Engine, RunStatus, TaskContext, TaskInputs
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.cli import cli
from dagwerk.constants import TaskStatus
from dagwerk.runtime.children import ChildPipeline
from dagwerk.runtime.worker import Worker
from dagwerk.testing.cli import DagwerkCli
from dagwerk.testing.postgres import fresh_schema_url
from dagwerk.testing.waits import wait_until

CHILD = [DagNode(slug="leaf", plugin="leaf")]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'durable.db'}"
    else:
        with fresh_schema_url(request.getfixturevalue("postgres_url"), "durable") as found:
            yield found


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database the CLI's engine and the test's engine share."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'durable.db'}"
    else:
        with fresh_schema_url(request.getfixturevalue("postgres_url"), "durable") as found:
            yield found


def _engine(url: str, tmp_path: Path) -> Engine:
    options: dict[str, Any] = {"pool_size": 2} if url.startswith("postgres") else {}
    return Engine(url, execution_root=tmp_path, **options)


def test_the_issue_snippet_completes_with_one_child_run(url: str, tmp_path: Path) -> None:
    with _engine(url, tmp_path) as engine:

        @engine.plugin("leaf")
        def leaf(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            return {"value": inputs.parameters["x"] * 10}  # type: ignore[operator]

        @engine.plugin("parent")
        def parent(inputs, ctx):  # type: ignore[no-untyped-def]
            child = ctx.start_child(CHILD, input={"x": 4})
            outcome = ctx.wait_for_child(
                child
            )  # parks the task; the resumed attempt runs from the top
            return {"value": outcome.outputs["leaf"][0]["fields"]["value"]}

        result = engine.run([DagNode(slug="parent", plugin="parent")], timeout=60)
        assert result.status is RunStatus.COMPLETED, result.error
        (output,) = engine.result(result.run_id).outputs["parent"]
        assert output.fields == {"value": 40}
        assert len(engine.store.list_child_runs(result.run_id)) == 1


def test_recursion_ends_at_the_depth_limit_and_show_names_it(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'rec.db'}"
    nodes = [DagNode(slug="rec", plugin="rec")]
    with Engine(db, execution_root=tmp_path) as engine:

        @engine.plugin("rec")
        def rec(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            pipeline = ChildPipeline(tuple(nodes), allow_recursion=True, max_recursion=100)
            outcome = ctx.wait_for_child(ctx.start_child(pipeline))
            return {"status": outcome.status.value}

        started = time.monotonic()
        result = engine.run(nodes, timeout=60)
        assert time.monotonic() - started < 30
        assert result.status is RunStatus.FAILED
        run_ids = [result.run_id]
        while kids := engine.store.list_child_runs(run_ids[-1]):
            run_ids.extend(kids)
        assert len(run_ids) == 9  # depths 0..8; the default limit is 8
        assert {engine.result(r).status for r in run_ids} == {RunStatus.FAILED}
    shown = CliRunner().invoke(cli, ["show", result.run_id, "--db", db])
    assert shown.exit_code == 0, shown.output
    assert "child_depth_exceeded" in shown.output and "limit of 8" in shown.output


def test_recursion_without_allow_recursion_fails_the_root_naming_the_rule(
    tmp_path: Path,
) -> None:
    nodes = [DagNode(slug="rec", plugin="rec")]
    with Engine("memory://", execution_root=tmp_path) as engine:

        @engine.plugin("rec")
        def rec(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            outcome = ctx.wait_for_child(ctx.start_child(nodes))
            return {"status": outcome.status.value}

        result = engine.run(nodes, timeout=60)
        assert result.status is RunStatus.FAILED
        assert "child_recursion_refused" in (result.error or "")


_APPROVAL_PLUGINS = """\
import dagwerk


@dagwerk.plugin("approve")
def approve(inputs, ctx):
    answer = ctx.wait("approval")
    return {"approved": answer["ok"]}
"""

_APPROVAL_PIPELINE = """\
name: approval
plugins: [approval_plugins]
nodes:
  - slug: approve
    plugin: approve
"""


def test_approval_completes_after_dagwerk_resume(tmp_path: Path) -> None:
    (tmp_path / "approval_plugins.py").write_text(_APPROVAL_PLUGINS, encoding="utf-8")
    pipeline = tmp_path / "approval.yaml"
    pipeline.write_text(_APPROVAL_PIPELINE, encoding="utf-8")
    run = DagwerkCli(tmp_path)
    submitted = run.json("submit", str(pipeline))
    run_id = submitted["run_id"]
    burst = run("worker", "--pipeline", str(pipeline), "--burst")
    assert burst.returncode == 0, burst.stderr
    (task,) = run.json("show", run_id)["tasks"]
    assert task["status"] == "waiting" and task["waiting_on"] == "approval"
    resumed = run("resume", task["task_id"], "approval", "--response", '{"ok": true}')
    assert resumed.returncode == 0, resumed.stderr
    burst = run("worker", "--pipeline", str(pipeline), "--burst")
    assert burst.returncode == 0, burst.stderr
    shown = run.json("show", run_id)
    assert shown["run"]["status"] == "completed"
    (task,) = shown["tasks"]
    assert [(w["wait_id"], w["state"], w["response"]) for w in task["wait_history"]] == [
        ("approval", "resolved", {"ok": True})
    ]
    outputs = run.json("outputs", run_id)
    assert json.dumps(outputs).count('"approved": true') == 1
    text = run("show", run_id)
    assert "recorded steps and waits" in text.stdout
    assert "approval" in text.stdout and "resolved" in text.stdout


def test_show_lists_recorded_steps_and_waits(shared_url: str, tmp_path: Path) -> None:
    url = shared_url
    with _engine(url, tmp_path) as engine:

        @engine.plugin("pay")
        def pay(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            receipt = ctx.step("charge", lambda: {"charge_id": "ch_1"})
            ctx.wait("confirm")
            return {"charge": receipt["charge_id"]}

        run_id = engine.submit([DagNode(slug="pay", plugin="pay")])
        worker = engine.worker(concurrency=1)
        worker.run_until_idle()
        (task,) = engine.list_tasks(run_id)
        engine.resume(task.task_id, "confirm")
        worker.run_until_idle()
        assert engine.result(run_id).status is RunStatus.COMPLETED
    shown = CliRunner().invoke(cli, ["show", run_id, "--db", url, "--json"])
    assert shown.exit_code == 0, shown.output
    (described,) = json.loads(shown.output)["tasks"]
    assert [(s["name"], s["result"]) for s in described["steps"]] == [
        ("charge", {"charge_id": "ch_1"})
    ]
    assert [(w["wait_id"], w["state"]) for w in described["wait_history"]] == [
        ("confirm", "resolved")
    ]
    text = CliRunner().invoke(cli, ["show", run_id, "--db", url])
    assert text.exit_code == 0, text.output
    assert "charge" in text.output and "ch_1" in text.output and "confirm" in text.output


# --- a charge in a step survives SIGKILL of a real worker process ------------------------

_CARD_PLUGINS = """\
import os
import threading
from pathlib import Path

import dagwerk


@dagwerk.plugin("checkout")
def checkout(inputs, ctx):
    card = Path(os.environ["CARD_DIR"])

    def charge(cents):
        with (card / "charges").open("a", encoding="utf-8") as ledger:
            ledger.write(f"{cents} by attempt {ctx.attempt}\\n")
        return {"charge_id": f"ch-{ctx.attempt}", "cents": cents}

    receipt = ctx.step("charge", charge, 500)
    (card / f"charged-{ctx.attempt}").write_text("yes", encoding="utf-8")
    # Holds the task until the test releases it (it kills this worker first).
    pause = threading.Event()
    while not (card / "release").exists():
        pause.wait(0.02)
    return {"charge": receipt["charge_id"]}
"""


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("card_plugins_in_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")
def test_a_step_charges_once_although_the_worker_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugins = tmp_path / "card_plugins.py"
    plugins.write_text(_CARD_PLUGINS, encoding="utf-8")
    card = tmp_path / "card"
    card.mkdir()
    run = DagwerkCli(tmp_path)
    with Engine(run.db, execution_root=tmp_path) as engine:
        run_id = engine.submit([DagNode(slug="checkout", plugin="checkout")])
    with (tmp_path / "worker.err").open("wb") as errors:
        worker = subprocess.Popen(
            run.argv("worker", "--plugins", str(plugins), "--concurrency", "1"),
            cwd=tmp_path,
            env=run.env({"CARD_DIR": str(card)}),
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
        try:
            wait_until((card / "charged-1").exists, "the first charge", timeout=60)
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
    assert worker.returncode == -signal.SIGKILL
    (card / "release").write_text("go", encoding="utf-8")
    module = _load(plugins)
    # The killed worker's lease runs out: this store's clock is an hour later.
    later = SqliteStore(run.db, clock=lambda: time.time() + 3600)
    monkeypatch.setenv("CARD_DIR", str(card))
    try:
        recovering = Worker(later, {"checkout": module.checkout}, execution_root=tmp_path)
        try:
            recovering.run_until_idle()
        finally:
            recovering.stop()
        assert later.get_run_status(run_id) is RunStatus.COMPLETED
        (task,) = later.list_tasks(run_id)
        assert task.status is TaskStatus.COMPLETED and task.attempt_number == 2
        (output,) = later.resolve_outputs(run_id, later.get_output_ids(run_id, 0)).values()
        assert output.fields == {"charge": "ch-1"}  # the first attempt's recorded charge
    finally:
        later.close()
    assert (card / "charges").read_text(encoding="utf-8").splitlines() == ["500 by attempt 1"]
