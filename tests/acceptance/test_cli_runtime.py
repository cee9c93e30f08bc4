"""The ``dagwerk`` command as a subprocess against a temporary SQLite file:
run, fail, retry, cancel, resume, dlq, graph, worker shutdown, help and exit codes."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dagwerk.testing.cli import DagwerkCli as Cli

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "examples" / "pipelines"
ETL = str(PIPELINES / "etl.yaml")
FLAKY = str(PIPELINES / "flaky.yaml")
APPROVAL = str(PIPELINES / "approval.yaml")


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def test_run_completes_the_etl_example_and_exits_0(cli: Cli) -> None:
    result = cli("run", ETL)
    assert result.returncode == 0, result.stderr
    assert "completed" in result.stdout
    assert "report -> " in result.stdout and "Conference Table" in result.stdout
    # Progress is plain lines when stdout is not a terminal.
    assert "nodes 7/7" in result.stdout


def test_run_json_and_failure_exit_1_then_retry_and_worker_complete_it(cli: Cli) -> None:
    failed = cli("run", FLAKY, "--json", env={"FLAKY_STORE_DOWN": "1"})
    assert failed.returncode == 1, failed.stderr
    document = json.loads(failed.stdout)
    assert document["status"] == "failed"
    assert "page store is down" in document["error"]
    run_id = document["run_id"]

    shown = cli.json("show", run_id)
    assert shown["run"]["status"] == "failed"
    by_node = {node["slug"]: node for node in shown["nodes"]}
    assert by_node["fetch"]["tasks"] == {"completed": 1}
    assert by_node["store"]["tasks"] == {"failed": 1}

    retried = cli.json("retry", run_id, "--from", "store")
    assert retried == {"run_id": run_id, "retry_count": 1, "nodes": ["store"]}
    worked = cli("worker", "--pipeline", FLAKY, "--burst")
    assert worked.returncode == 0, worked.stderr
    assert cli.json("show", run_id)["run"]["status"] == "completed"
    # A completed run cannot be retried: one line on stderr, exit 1.
    again = cli("retry", run_id)
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1 and "cannot be retried" in again.stderr


def test_submit_then_cancel(cli: Cli) -> None:
    submitted = cli("submit", APPROVAL, "--input", '{"topic": "cancel me"}')
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    cancelled = cli("cancel", run_id, "--reason", "not needed")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cli.json("show", run_id)["run"]["status"] == "cancelled"
    again = cli("cancel", run_id)
    assert again.returncode == 1 and "already cancelled" in again.stderr


def test_a_waiting_task_is_resumed_from_the_command_line(cli: Cli) -> None:
    run_id = cli("submit", APPROVAL, "--input", '{"topic": "dagwerk"}').stdout.strip()
    assert cli("worker", "--pipeline", APPROVAL, "--burst").returncode == 0
    shown = cli.json("show", run_id)
    assert shown["run"]["status"] == "running"
    (wait,) = shown["waits"]
    assert wait["node"] == "review"
    plain = cli("show", run_id)
    assert f"dagwerk resume {wait['task_id']} {wait['wait_id']}" in plain.stdout

    resumed = cli("resume", wait["task_id"], wait["wait_id"])
    assert resumed.returncode == 0, resumed.stderr
    assert cli("worker", "--pipeline", APPROVAL, "--burst").returncode == 0
    finished = cli.json("show", run_id)
    assert finished["run"]["status"] == "completed"
    assert finished["waits"] == []
    # A wait the task never entered is refused: one line, exit 1.
    bad = cli("resume", wait["task_id"], "no-such-wait")
    assert bad.returncode == 1


def test_dead_letters_are_listed_and_reinjected(cli: Cli, tmp_path: Path) -> None:
    from dagwerk.backends.sqlite import SqliteStore

    run_id = cli("submit", ETL, "--run-id", "dlq-run").stdout.strip()
    assert run_id == "dlq-run"
    # A worker that gives up on the delivery parks it in the dead-letter queue.
    store = SqliteStore(cli.db)
    try:
        (leased,) = store.dequeue("test-worker", limit=1, lease_seconds=30)
        assert store.nack(leased.delivery_id, "test-worker", poison=True, reason="test poison")
    finally:
        store.close()

    letters = cli.json("dlq", "list")
    assert [(d["run_id"], d["reason"]) for d in letters] == [("dlq-run", "test poison")]
    plain = cli("dlq", "list")
    assert "test poison" in plain.stdout
    reinjected = cli("dlq", "reinject", letters[0]["dead_letter_id"])
    assert reinjected.returncode == 0, reinjected.stderr
    twice = cli("dlq", "reinject", letters[0]["dead_letter_id"])
    assert twice.returncode == 1 and "was not re-injected" in twice.stderr
    assert cli("worker", "--pipeline", ETL, "--burst").returncode == 0
    assert cli.json("show", "dlq-run")["run"]["status"] == "completed"


def test_graph_draws_the_pipeline(cli: Cli) -> None:
    result = cli("graph", ETL, "--format", "dot")
    assert result.returncode == 0, result.stderr
    assert "digraph" in result.stdout and "extract" in result.stdout


def test_invalid_input_exits_2_with_one_line(cli: Cli, tmp_path: Path) -> None:
    bad_json = cli("run", ETL, "--input", "{not json")
    assert bad_json.returncode == 2
    assert bad_json.stderr.startswith("error: ") and bad_json.stderr.count("\n") == 1
    no_plugin = tmp_path / "orphan.yaml"
    no_plugin.write_text("nodes:\n  - {slug: a, plugin: nobody_has_this}\n", encoding="utf-8")
    orphan = cli("run", str(no_plugin))
    assert orphan.returncode == 2
    assert "no plugin is registered as 'nobody_has_this'" in orphan.stderr
    missing = cli("run", str(tmp_path / "missing.yaml"))
    assert missing.returncode == 2


def test_unknown_run_is_one_line_and_debug_shows_the_traceback(cli: Cli) -> None:
    from dagwerk.engine import Engine

    Engine(cli.db).close()  # the database exists; the run does not
    plain = cli("show", "no-such-run")
    assert plain.returncode == 1
    assert plain.stderr == "error: run 'no-such-run' does not exist\n"
    debug = cli("--debug", "show", "no-such-run")
    assert "Traceback" in debug.stderr


def test_worker_stops_cleanly_on_sigterm(cli: Cli) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "dagwerk", "worker", "--pipeline", ETL],
        cwd=cli.cwd,
        env=cli.env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
        assert "serving" in first
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    assert "stopped" in rest


@pytest.mark.parametrize(
    "command",
    [
        ["run"],
        ["submit"],
        ["worker"],
        ["runs"],
        ["show"],
        ["cancel"],
        ["retry"],
        ["rerun"],
        ["resume"],
        ["dlq"],
        ["dlq", "list"],
        ["dlq", "reinject"],
    ],
)
def test_every_runtime_command_has_help_with_an_example(cli: Cli, command: list[str]) -> None:
    result = cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Example" in result.stdout
    assert "dagwerk " in result.stdout.split("Example", 1)[1]


def test_runs_lists_runs_and_rerun_reopens_a_completed_run(cli: Cli) -> None:
    document = json.loads(cli("run", ETL, "--json").stdout)
    listed = cli.json("runs", "--status", "completed")
    assert [r["run_id"] for r in listed] == [document["run_id"]]
    rerun = cli("rerun", document["run_id"], "--node", "report")
    assert rerun.returncode == 0, rerun.stderr
    assert cli.json("show", document["run_id"])["run"]["status"] == "running"
    assert cli("worker", "--pipeline", ETL, "--burst").returncode == 0
    assert cli.json("show", document["run_id"])["run"]["status"] == "completed"


_FREEZE_PROBE = """
import gc

import dagwerk


@dagwerk.plugin("freeze_probe")
def probe(inputs, ctx):
    return {"frozen": gc.get_freeze_count()}
"""


def test_the_worker_command_freezes_its_start_up_heap(cli: Cli, tmp_path: Path) -> None:
    # The oldest generation's collector passes must not walk the worker's
    # start-up objects (a ~15 ms pass inside a transaction); a plugin
    # sees them frozen.
    from dagwerk.engine import Engine
    from dagwerk.models import DagNode

    (tmp_path / "freeze_probe.py").write_text(_FREEZE_PROBE)
    with Engine(cli.db) as engine:
        run_id = engine.submit([DagNode(slug="probe", plugin="freeze_probe")])
    worked = cli("worker", "--plugins", "freeze_probe", "--burst")
    assert worked.returncode == 0, worked.stderr
    with Engine(cli.db) as engine:
        result = engine.result(run_id)
    assert result.ok, result.error
    (output,) = result.outputs["probe"]
    frozen = output.fields["frozen"]
    assert isinstance(frozen, int) and frozen > 1000, frozen


@pytest.mark.parametrize(("response", "published"), [("true", True), ("false", False)])
def test_the_readme_approval_tour_publishes_only_an_approved_post(
    cli: Cli, response: str, published: bool
) -> None:
    # README, "Run workers in other processes", step by step (a burst worker
    # stands in for the worker terminals).
    submitted = cli("submit", APPROVAL, "--input", '{"topic": "dagwerk 1.0"}')
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    assert cli("worker", "--pipeline", APPROVAL, "--concurrency", "8", "--burst").returncode == 0
    (wait,) = cli.json("show", run_id)["waits"]
    resumed = cli(
        "resume", wait["task_id"], "approval", "--response", f'{{"approved": {response}}}'
    )
    assert resumed.returncode == 0, resumed.stderr
    assert cli("worker", "--pipeline", APPROVAL, "--concurrency", "8", "--burst").returncode == 0
    shown = cli.json("show", run_id)
    assert shown["run"]["status"] == "completed"
    publish = {node["slug"]: node for node in shown["nodes"]}["publish"]
    assert publish["tasks"] == ({"completed": 1} if published else {})
    from dagwerk import Engine

    with Engine(cli.db) as engine:
        posts = [output.fields for output in engine.result(run_id).outputs.get("publish", ())]
    assert posts == ([{"published": "Announcing dagwerk 1.0"}] if published else [])


def test_the_correlation_example_joins_each_customers_orders(cli: Cli) -> None:
    # docs/correlation.md: `dagwerk run examples/pipelines/customers.yaml`.
    result = cli("run", str(PIPELINES / "customers.yaml"), "--json")
    assert result.returncode == 0, result.stderr
    run_id = json.loads(result.stdout)["run_id"]
    from dagwerk import Engine

    with Engine(cli.db) as engine:
        outputs = engine.result(run_id).outputs
    summaries = sorted(
        (dict(o.fields) for o in outputs["summary"]), key=lambda s: str(s["customer"])
    )
    assert summaries == [
        {"customer": "acme", "tier": "gold", "orders": 3, "total": 1175, "large_orders": 1},
        {"customer": "globex", "tier": "silver", "orders": 2, "total": 100, "large_orders": 0},
        {"customer": "initech", "tier": "bronze", "orders": 1, "total": 1300, "large_orders": 1},
    ]
    (report,) = outputs["report"]
    assert (
        str(report.fields["text"]).splitlines()[0] == "acme (gold): 3 orders, 1175 in all, 1 large"
    )


def test_run_of_a_waiting_pipeline_names_the_resume_command_and_ctrl_c_keeps_the_run(
    cli: Cli,
) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "dagwerk", "run", APPROVAL, "--input", '{"topic": "wait"}'],
        cwd=cli.cwd,
        env=cli.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    # A run that never names the wait would block the read below: kill it then.
    guard = threading.Timer(120, process.kill)
    guard.start()
    waiting = ""
    try:
        for line in process.stdout:  # blocks until the run prints the wait
            if line.startswith("waiting: task "):
                waiting = line
                break
    finally:
        guard.cancel()
    assert waiting, "run never said which task waits"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "(node review)" in waiting
    command = waiting.split("resume it from another terminal: ")[1].split(" (add")[0]
    assert command.startswith("dagwerk resume ")
    (line,) = [line for line in err.splitlines() if line.startswith("interrupted: run ")]
    run_id = line.split()[2]
    assert "stays running in the database" in line
    assert f"cancel it: dagwerk cancel {run_id}" in line
    assert cli.json("show", run_id)["run"]["status"] == "running"

    # The printed command, run as printed, resumes the task; a worker finishes the run.
    resumed = cli(*shlex.split(command)[1:], "--response", '{"approved": true}')
    assert resumed.returncode == 0, resumed.stderr
    assert cli("worker", "--pipeline", APPROVAL, "--burst").returncode == 0
    assert cli.json("show", run_id)["run"]["status"] == "completed"
