"""What ``dagwerk run`` and ``dagwerk outputs`` print for a pipeline file of the user's own."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dagwerk.cli import cli

NESTED_PLUGINS = """
import dagwerk

@dagwerk.plugin("nested_customers")
def customers(inputs, ctx):
    return [
        {
            "customer": "c1",
            "orders": [{"order_id": 1, "amount": 3.5}, {"order_id": 2, "amount": 1}],
            "tags": ("new", "eu"),
        }
    ]
"""

NESTED_PIPELINE = """
name: nested
plugins: [nested_output_plugins]
nodes:
  - slug: customers
    plugin: nested_customers
"""

EXPECTED_FIELDS = {
    "customer": "c1",
    "orders": [{"order_id": 1, "amount": 3.5}, {"order_id": 2, "amount": 1}],
    "tags": ["new", "eu"],
}


def _pipeline(tmp_path: Path, module: str, plugins: str, pipeline: str) -> str:
    (tmp_path / f"{module}.py").write_text(plugins, encoding="utf-8")
    path = tmp_path / "pipeline.yaml"
    path.write_text(pipeline, encoding="utf-8")
    return str(path)


def test_run_and_outputs_print_nested_outputs_as_json(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path, "nested_output_plugins", NESTED_PLUGINS, NESTED_PIPELINE)
    db = f"sqlite:///{tmp_path / 'nested.db'}"
    runner = CliRunner()
    ran = runner.invoke(cli, ["run", pipeline, "--db", db])
    assert ran.exit_code == 0, ran.output
    (line,) = [line for line in ran.stdout.splitlines() if " -> " in line]
    assert line.startswith("  customers -> ")
    assert json.loads(line.removeprefix("  customers -> ")) == EXPECTED_FIELDS
    assert "FrozenDict" not in ran.stdout

    as_json = runner.invoke(cli, ["run", pipeline, "--db", db, "--json"])
    document = json.loads(as_json.stdout)
    (output,) = document["outputs"]["customers"]
    assert output["fields"] == EXPECTED_FIELDS
    run_id = document["run_id"]

    listed = runner.invoke(cli, ["outputs", run_id, "--db", db])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.splitlines()[:2] == [f"run {run_id}: completed", "customers (1 output):"]
    assert json.loads(listed.stdout.splitlines()[2]) == EXPECTED_FIELDS

    picked = runner.invoke(cli, ["outputs", run_id, "--node", "customers", "--db", db, "--json"])
    assert picked.exit_code == 0, picked.output
    (output,) = json.loads(picked.stdout)["outputs"]["customers"]
    assert output["fields"] == EXPECTED_FIELDS and output["data"] == {}

    unknown = runner.invoke(cli, ["outputs", run_id, "--node", "nope", "--db", db])
    assert unknown.exit_code == 2
    assert "has no node 'nope' (nodes: customers)" in unknown.stderr


LOGGING_PLUGINS = """
import dagwerk

@dagwerk.plugin("logging_say")
def say(inputs, ctx):
    ctx.logger.info("hello from the plugin")
    ctx.logger.debug("a detail")
    return {"said": True}
"""

LOGGING_PIPELINE = """
name: logging
plugins: [logging_plugins]
nodes:
  - slug: say
    plugin: logging_say
"""


def test_run_and_worker_print_task_logger_messages_by_level(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path, "logging_plugins", LOGGING_PLUGINS, LOGGING_PIPELINE)
    db = f"sqlite:///{tmp_path / 'logging.db'}"
    runner = CliRunner()
    ran = runner.invoke(cli, ["run", pipeline, "--db", db])
    assert ran.exit_code == 0, ran.output
    (line,) = [line for line in ran.stderr.splitlines() if "hello from the plugin" in line]
    assert " INFO dagwerk.task.logging_say: hello from the plugin" in line
    assert "a detail" not in ran.stderr

    debug = runner.invoke(cli, ["run", pipeline, "--db", db, "--log-level", "debug"])
    assert "a detail" in debug.stderr
    quiet = runner.invoke(cli, ["run", pipeline, "--db", db, "--log-level", "off"])
    assert "hello from the plugin" not in quiet.stderr

    submitted = runner.invoke(cli, ["submit", pipeline, "--db", db])
    assert submitted.exit_code == 0, submitted.output
    worked = runner.invoke(cli, ["worker", "--pipeline", pipeline, "--db", db, "--burst"])
    assert worked.exit_code == 0, worked.output
    assert "INFO dagwerk.task.logging_say: hello from the plugin" in worked.stderr
    warning = runner.invoke(
        cli, ["run", pipeline, "--db", db], env={"DAGWERK_LOG_LEVEL": "warning"}
    )
    assert warning.exit_code == 0 and "hello from the plugin" not in warning.stderr


def test_runs_and_show_name_the_pipeline(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path, "nested_output_plugins", NESTED_PLUGINS, NESTED_PIPELINE)
    db = f"sqlite:///{tmp_path / 'named.db'}"
    runner = CliRunner()
    run_id = json.loads(runner.invoke(cli, ["run", pipeline, "--db", db, "--json"]).stdout)[
        "run_id"
    ]
    listed = runner.invoke(cli, ["runs", "--db", db])
    assert listed.exit_code == 0, listed.output
    header, row = listed.stdout.splitlines()[1:3]
    assert header.split()[:3] == ["run", "pipeline", "status"]
    assert row.split()[:3] == [run_id, "nested", "completed"]
    (record,) = json.loads(runner.invoke(cli, ["runs", "--db", db, "--json"]).stdout)
    assert record["pipeline"] == "nested"
    shown = runner.invoke(cli, ["show", run_id, "--db", db])
    assert shown.stdout.startswith(f"run {run_id} (nested): completed (nodes 1/1, ")
