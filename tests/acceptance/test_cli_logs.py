"""Task logs through the ``dagwerk`` command: ``dagwerk logs`` (text, --json,
filters, --follow of a running run) and a failed task's last lines in
``dagwerk show``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dagwerk.testing.cli import DagwerkCli

_PIPELINE = """\
name: logged
plugins: [logged_plugins]
nodes:
  - slug: talk
    plugin: talk
  - slug: fail
    plugin: fail
    input_mode: each
    edges:
      - {name: talk, source: talk}
"""

_PLUGINS = """\
import logging
import os
import time
from pathlib import Path

import dagwerk


@dagwerk.plugin("talk")
def talk(inputs, ctx):
    ctx.logger.info("talking \\x1b[31m in colour")
    logging.getLogger("lib").warning("library line")
    gate = os.environ.get("LOGGED_GATE")
    if gate:
        while not Path(gate).exists():
            time.sleep(0.02)
    return {"ok": True}


@dagwerk.plugin("fail")
def fail(inputs, ctx):
    for n in range(8):
        ctx.logger.info("step %d", n)
    try:
        raise KeyError("missing")
    except KeyError:
        ctx.logger.exception("giving up")
    raise RuntimeError("fail node broke")
"""


@pytest.fixture
def cli(tmp_path: Path) -> DagwerkCli:
    (tmp_path / "logged_plugins.py").write_text(_PLUGINS, encoding="utf-8")
    (tmp_path / "logged.yaml").write_text(_PIPELINE, encoding="utf-8")
    return DagwerkCli(tmp_path, "logs.db")


def _finished_run(cli: DagwerkCli) -> str:
    submitted = cli("submit", "logged.yaml", "--run-id", "run-logged")
    assert submitted.returncode == 0, submitted.stderr
    worked = cli("worker", "--pipeline", "logged.yaml", "--burst")
    assert worked.returncode == 0, worked.stderr
    return "run-logged"


def test_logs_prints_each_attempts_lines_and_filters(cli: DagwerkCli) -> None:
    run_id = _finished_run(cli)
    shown = cli("logs", run_id)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout.splitlines()
    assert any("INFO" in line and "talk#1 dagwerk.task.talk: talking" in line for line in out)
    # A control character a plugin logged is shown escaped, never sent to the terminal.
    assert "\x1b" not in shown.stdout and "\\x1b[31m" in shown.stdout
    assert any("WARNING" in line and "talk#1 lib: library line" in line for line in out)
    assert any("fail#1 dagwerk.task.fail: giving up" in line for line in out)
    assert any(line.startswith("    KeyError: 'missing'") for line in out)
    only = cli("logs", run_id, "--node", "talk")
    assert only.returncode == 0, only.stderr
    assert "step 0" not in only.stdout and "library line" in only.stdout
    missing = cli("logs", run_id, "--node", "nope")
    assert missing.returncode != 0 and "nope" in missing.stderr

    result = cli("logs", run_id, "--json", "--node", "fail", "--attempt", "1")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(text) for text in result.stdout.splitlines()]
    assert [line["message"] for line in lines[:2]] == ["step 0", "step 1"]
    last = lines[-1]
    assert last["level"] == "ERROR" and last["node"] == "fail" and last["attempt"] == 1
    assert "KeyError: 'missing'" in last["traceback"]
    ids = [line["line_id"] for line in lines]
    assert ids == sorted(ids)


def test_show_prints_a_failed_tasks_last_lines_next_to_its_error(cli: DagwerkCli) -> None:
    run_id = _finished_run(cli)
    shown = cli("show", run_id)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "RuntimeError: fail node broke" in text
    assert "last log lines of task" in text and "(fail, attempt 1)" in text
    tail = text.split("last log lines of task", 1)[1]
    assert "giving up" in tail and "step 7" in tail and "step 0" not in tail
    described = cli.json("show", run_id)
    failed = next(t for t in described["tasks"] if t["node"] == "fail")
    assert [line["message"] for line in failed["log_tail"]][-1] == "giving up"
    talked = next(t for t in described["tasks"] if t["node"] == "talk")
    assert talked["log_tail"] is None


def test_follow_streams_a_running_runs_lines_until_it_ends(cli: DagwerkCli, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    env = {"LOGGED_GATE": str(gate)}
    submitted = cli("submit", "logged.yaml", "--run-id", "run-follow")
    assert submitted.returncode == 0, submitted.stderr
    worker = subprocess.Popen(
        cli.argv("worker", "--pipeline", "logged.yaml", "--burst"),
        cwd=cli.cwd,
        env=cli.env(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    follow = subprocess.Popen(
        cli.argv("logs", "run-follow", "--follow", "--json"),
        cwd=cli.cwd,
        env=cli.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert follow.stdout is not None
        # The running task's first lines arrive while it still runs.
        first = json.loads(follow.stdout.readline())
        assert first["message"].startswith("talking")
        assert follow.poll() is None
        gate.write_text("open")
        rest = follow.stdout.read()
        assert follow.wait(timeout=60) == 0
        messages = [json.loads(text)["message"] for text in rest.splitlines()]
        assert messages[0] == "library line" and messages[-1] == "giving up"
        assert worker.wait(timeout=60) == 0
    finally:
        for process in (worker, follow):
            if process.poll() is None:
                process.kill()
                process.wait()
        if follow.stdout is not None:
            follow.stdout.close()
