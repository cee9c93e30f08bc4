"""A secret resolved by the worker's secret resolver never leaves the plugin.

After a run whose nodes bind a ``SecretSource``, the secret's value appears
nowhere dagwerk writes or shows: the database (the SQLite file, its WAL and
shared-memory files; every text and JSON column of the PostgreSQL schema),
the log records of the worker (every logger, DEBUG and up), the task plans,
``dagwerk show`` / ``show --json`` / ``show --why`` / ``runs --json``, and
``/metrics`` and ``/healthz``. A marker value passed as ordinary run input is
looked for in the same places and must be found, so the searches are not
vacuous; the plugins' outputs prove the secret reached them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from conftest import postgres_text_dump
from dagwerk.cli.app import cli
from dagwerk.cli.commands_gated import start_health_server
from dagwerk.constants import InputMode, RunStatus
from dagwerk.engine import Engine
from dagwerk.models import DagNode, EdgeSource, InputEdge, RuntimeSource, SecretSource, TaskInputs
from dagwerk.runtime.context import TaskContext


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _nodes() -> list[DagNode]:
    return [
        DagNode(
            slug="fetch",
            plugin="fetch",
            bindings={
                "token": SecretSource(name="api_token"),
                "region": RuntimeSource(key="region", required=True),
            },
        ),
        DagNode(
            slug="use",
            plugin="use",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="rows", source="fetch"),),
            bindings={
                "token": SecretSource(name="api_token"),
                "n": EdgeSource(edge="rows", field="n"),
            },
        ),
    ]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read()).decode()


def test_a_secret_value_appears_in_no_database_log_plan_cli_or_metrics_output(
    store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = f"sk-live-{uuid.uuid4().hex}-Zq9"
    marker = f"region-marker-{uuid.uuid4().hex}"
    caplog.set_level(logging.DEBUG)
    options: dict[str, Any] = {"pool_size": 2} if store_url.startswith("postgres") else {}
    engine = Engine(store_url, execution_root=tmp_path, **options)

    @engine.plugin("fetch")
    def fetch(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, Any]]:
        token = ctx.secrets["api_token"]
        ctx.logger.info(
            "calling the API for %s with a %d-character token",
            inputs.parameters["region"],
            len(token),
        )
        return [{"n": n, "digest": _digest(token)} for n in range(3)]

    @engine.plugin("use")
    def use(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
        return {"n": inputs.parameters["n"], "digest": _digest(ctx.secrets["api_token"])}

    resolved: list[tuple[str, str]] = []

    def resolver(run_id: str, plugin: str) -> dict[str, str]:
        resolved.append((run_id, plugin))
        return {"api_token": secret}

    run_id = engine.submit(_nodes(), {"region": marker})
    worker = engine.worker(concurrency=2, secret_resolver=resolver)
    server, (metrics, _) = start_health_server(engine, port=0, host="127.0.0.1", workers=[worker])
    worker.callbacks = metrics.callbacks(worker.callbacks)
    try:
        worker.start()
        result = engine.wait(run_id, timeout=60)
        exposed: dict[str, str] = {
            "metrics": _get(f"{server.url}/metrics"),
            "healthz": _get(f"{server.url}/healthz"),
        }
    finally:
        worker.stop()
        server.stop()
    assert result.status is RunStatus.COMPLETED, result.error
    # The secret reached both plugins, through the resolver only.
    assert {o.fields["digest"] for outputs in result.outputs.values() for o in outputs} == {
        _digest(secret)
    }
    assert {plugin for _, plugin in resolved} == {"fetch", "use"}

    exposed["plans"] = "\n".join(
        json.dumps(task.plan.model_dump(mode="json")) + repr(task)
        for task in engine.list_tasks(run_id)
    )
    exposed["attempts"] = repr([engine.list_attempts(t.task_id) for t in engine.list_tasks(run_id)])
    runner = CliRunner()
    for args in (
        ["show", run_id],
        ["show", run_id, "--json"],
        ["show", run_id, "--why"],
        ["runs", "--json"],
    ):
        shown = runner.invoke(cli, [*args, "--db", store_url], catch_exceptions=False)
        assert shown.exit_code == 0, shown.output
        exposed[" ".join(args[:1] + args[2:])] = shown.output
    exposed["logs"] = caplog.text + "\n".join(
        f"{record.getMessage()} {record.__dict__}" for record in caplog.records
    )
    if store_url.startswith("sqlite"):
        db = Path(store_url.removeprefix("sqlite:///"))
        for path in sorted(db.parent.glob(db.name + "*")):  # s.db, s.db-wal, s.db-shm
            exposed[f"file {path.name} (open)"] = path.read_bytes().decode("latin-1")
        engine.close()
        exposed["file (closed)"] = db.read_bytes().decode("latin-1")
    else:
        exposed["database"] = postgres_text_dump(store_url)
        engine.close()

    leaks = [
        where for where, text in exposed.items() if secret in text or secret.encode().hex() in text
    ]
    assert leaks == [], f"the secret leaked into {leaks}"
    # The searches see ordinary values: the marker run input is in the database,
    # in the plans' run and in `show --json`, and the log line was captured.
    assert any(
        marker in text for where, text in exposed.items() if "file" in where or where == "database"
    )
    assert marker in exposed["logs"]
    assert "api_token" in exposed["plans"]  # the plan holds the reference, not the value
