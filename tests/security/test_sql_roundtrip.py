"""Hostile identifiers through every CLI command and Engine call.

Run IDs, node slugs, plugin names, wait IDs, output IDs, run input keys and
values, resume responses and cancel reasons all carry quotes, a semicolon
with a ``DROP TABLE``, ``--``, backslashes, ``' OR '1'='1`` and non-ASCII
text. Each comes back exactly as it went in (the run, its nodes, tasks,
attempts, waits and outputs), lookups of hostile IDs that do not exist find
nothing, and a control run stored beforehand is unchanged afterwards: were
any value spliced into SQL, a statement would break or touch other rows.
Runs on SQLite and, with ``DAGWERK_TEST_POSTGRES_URL``, on PostgreSQL (the
value holds no NUL, which PostgreSQL text cannot store).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from dagwerk.cli.app import cli
from dagwerk.constants import InputMode, RunStatus, TaskStatus
from dagwerk.engine import Engine, RunNotFoundError
from dagwerk.identifiers import InvalidIdentifierError
from dagwerk.json import FrozenDict
from dagwerk.models import DagNode, EdgeSource, EmittedOutput, InputEdge, TaskInputs
from dagwerk.runtime.context import TaskContext

H = "it's; DROP TABLE dagwerk_runs; -- \\ \\\" \" ' OR '1'='1 ü 🙂 %s %(x)s ?"

SRC, HOLD = f"src {H}", f"hold {H}"
EMIT_PLUGIN, HOLD_PLUGIN = f"emit {H}", f"hold {H}"


def _nodes() -> list[DagNode]:
    return [
        DagNode(slug=SRC, plugin=EMIT_PLUGIN),
        DagNode(
            slug=HOLD,
            plugin=HOLD_PLUGIN,
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="items", source=SRC),),
            bindings={"n": EdgeSource(edge="items", field="n")},
        ),
    ]


def _pipeline_file(tmp_path: Path) -> Path:
    path = tmp_path / "hostile.json"
    path.write_text(
        json.dumps(
            {
                "name": "hostile",
                "nodes": [
                    {"slug": SRC, "plugin": EMIT_PLUGIN},
                    {
                        "slug": HOLD,
                        "plugin": HOLD_PLUGIN,
                        "input_mode": "each",
                        "edges": [{"name": "items", "source": SRC}],
                        "bindings": {"n": {"source": "edge", "edge": "items", "field": "n"}},
                    },
                ],
            }
        )
    )
    return path


def _wait_id(n: int) -> str:
    return f"wait {n} {H}"


def _output_id(n: int) -> str:
    return f"out {n} {H}"


def _engine(url: str, tmp_path: Path) -> Engine:
    options: dict[str, Any] = {"pool_size": 2} if url.startswith("postgres") else {}
    engine = Engine(url, execution_root=tmp_path, **options)

    @engine.plugin(EMIT_PLUGIN)
    def emit(inputs: TaskInputs, ctx: TaskContext) -> list[EmittedOutput]:
        return [EmittedOutput(id=_output_id(n), fields={"n": n, "text": H}) for n in range(2)]

    @engine.plugin(HOLD_PLUGIN)
    def hold(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
        n = int(str(inputs.parameters["n"]))
        if ctx.resumed_from_wait_id is None:
            ctx.wait(_wait_id(n))
        response = ctx.wait_response
        assert isinstance(response, FrozenDict), response
        return {"n": n, "echo": response[H], "wait": ctx.resumed_from_wait_id}

    return engine


def _work(engine: Engine) -> None:
    worker = engine.worker(concurrency=1)
    worker.run_until_idle()


def _snapshot(engine: Engine, run_id: str) -> object:
    run = engine.get_run(run_id)
    assert run is not None
    tasks = engine.list_tasks(run_id, include_invalidated=True)
    return (
        (run.run_id, run.status, run.error, run.retry_count, run.node_count),
        [
            (t.task_id, t.status, t.attempt_id, t.active_wait_id, t.resumed_from_wait_id)
            for t in tasks
        ],
        [engine.list_attempts(t.task_id) for t in tasks],
        {
            slug: [(o.id, dict(o.fields)) for o in outs]
            for slug, outs in engine.result(run_id).outputs.items()
        },
    )


def _waiting(engine: Engine, run_id: str) -> list[tuple[str, str]]:
    return [
        (t.task_id, t.active_wait_id)
        for t in engine.list_tasks(run_id)
        if t.status is TaskStatus.WAITING and t.active_wait_id is not None
    ]


def _check_completed(engine: Engine, run_id: str) -> None:
    run = engine.get_run(run_id)
    assert run is not None and run.run_id == run_id and run.status is RunStatus.COMPLETED, run
    assert [n.slug for n in engine.nodes(run_id)] == [SRC, HOLD]
    assert [n.plugin for n in engine.nodes(run_id)] == [EMIT_PLUGIN, HOLD_PLUGIN]
    outputs = engine.result(run_id).outputs
    assert sorted(o.id for o in outputs[SRC]) == [_output_id(0), _output_id(1)]
    assert {o.fields["text"] for o in outputs[SRC]} == {H}
    assert sorted((o.fields["echo"], o.fields["wait"]) for o in outputs[HOLD]) == [
        (H, _wait_id(0)),
        (H, _wait_id(1)),
    ]
    for task in engine.list_tasks(run_id):
        assert task.run_id == run_id and task.task_id.startswith(run_id)


def _resume_all(engine: Engine, run_id: str) -> None:
    waiting = _waiting(engine, run_id)
    assert sorted(w for _, w in waiting) == [_wait_id(0), _wait_id(1)]
    for task_id, wait_id in waiting:
        engine.resume(task_id, wait_id, {H: H})


def _strings(value: object) -> set[str]:
    """Every string in a JSON document, keys included."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.add(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, [*args, "--db", url], catch_exceptions=False)


def test_hostile_ids_round_trip_through_the_engine_api(store_url: str, tmp_path: Path) -> None:
    engine = _engine(store_url, tmp_path)
    try:
        control = engine.submit(_nodes(), {"k": "v"}, run_id="control-run")
        _work(engine)
        _resume_all(engine, control)
        _work(engine)
        before = _snapshot(engine, control)

        # A run ID outside the safe alphabet is refused before anything is
        # stored; the hostile text still reaches SQL as input, slugs, wait IDs
        # and reasons below.
        hostile_run = f"run {H}"
        with pytest.raises(InvalidIdentifierError):
            engine.submit(_nodes(), {H: H}, run_id=hostile_run)
        assert engine.get_run(hostile_run) is None
        run_id = "run-hostile"
        assert engine.submit(_nodes(), {H: H}, run_id=run_id) == run_id
        _work(engine)
        _resume_all(engine, run_id)
        _work(engine)
        _check_completed(engine, run_id)
        assert engine.progress(run_id).status is RunStatus.COMPLETED
        assert engine.list_dead_letters(run_id) == []
        attempts = [a for t in engine.list_tasks(run_id) for a in engine.list_attempts(t.task_id)]
        assert {a.resumed_from_wait_id for a in attempts} == {None, _wait_id(0), _wait_id(1)}

        # Re-run the waiting node: new waits under the same hostile IDs.
        engine.rerun(run_id, [HOLD])
        _work(engine)
        _resume_all(engine, run_id)
        _work(engine)
        _check_completed(engine, run_id)

        # Cancel with a hostile reason, then retry the cancelled run.
        other = "other-hostile"
        engine.submit(_nodes(), {}, run_id=other)
        _work(engine)
        assert engine.cancel(other, reason=H)
        cancelled = engine.get_run(other)
        assert (
            cancelled is not None
            and cancelled.status is RunStatus.CANCELLED
            and H in (cancelled.error or "")
        )
        engine.retry(other)
        _work(engine)
        _resume_all(engine, other)
        _work(engine)
        _check_completed(engine, other)

        for ghost in ("' OR '1'='1", "x'; DELETE FROM dagwerk_runs; --", "run %s", "\\'"):
            assert engine.get_run(ghost) is None
            assert engine.store.list_tasks(ghost) == []
            with pytest.raises(RunNotFoundError):
                engine.result(ghost)
        assert sorted(r.run_id for r in engine.list_runs()) == sorted(
            ["control-run", run_id, other]
        )
        assert _snapshot(engine, control) == before
    finally:
        engine.close()


def test_hostile_ids_round_trip_through_every_cli_command(store_url: str, tmp_path: Path) -> None:
    engine = _engine(store_url, tmp_path)
    try:
        engine.submit(_nodes(), {"k": "v"}, run_id="control-run")
        _work(engine)
        _resume_all(engine, "control-run")
        _work(engine)
        before = _snapshot(engine, "control-run")
        pipeline = str(_pipeline_file(tmp_path))
        refused = _cli(
            store_url, "submit", pipeline, "--no-plugin-check", "--run-id", f"cli {H}", "--json"
        )
        assert refused.exit_code == 2, refused.output
        assert json.loads(refused.output)["error"]["code"] == "identifier_invalid"
        assert engine.get_run(f"cli {H}") is None
        run_id = "cli-hostile"

        submitted = _cli(
            store_url,
            "submit",
            pipeline,
            # The plugins are the test engine's, not this process's registry.
            "--no-plugin-check",
            "--run-id",
            run_id,
            "--input",
            json.dumps({H: H}),
            "--json",
        )
        assert submitted.exit_code == 0, submitted.output
        assert json.loads(submitted.output)["run_id"] == run_id
        listed = _cli(store_url, "runs", "--json")
        assert listed.exit_code == 0, listed.output
        assert run_id in {r["run_id"] for r in json.loads(listed.output)}
        _work(engine)
        shown = _cli(store_url, "show", run_id, "--json")
        assert shown.exit_code == 0, shown.output
        texts = _strings(json.loads(shown.output))
        assert {run_id, SRC, HOLD, _wait_id(0), _wait_id(1)} <= texts
        for task_id, wait_id in _waiting(engine, run_id):
            resumed = _cli(store_url, "resume", task_id, wait_id, "--response", json.dumps({H: H}))
            assert resumed.exit_code == 0, resumed.output
        _work(engine)
        _check_completed(engine, run_id)
        for args in (
            ["show", run_id],
            ["show", run_id, "--why"],
            ["runs"],
            ["dlq", "list", "--run", run_id, "--json"],
        ):
            result = _cli(store_url, *args)
            assert result.exit_code == 0, (args, result.output)
        assert json.loads(_cli(store_url, "dlq", "list", "--run", run_id, "--json").output) == []

        rerun = _cli(store_url, "rerun", run_id, "--node", HOLD)
        assert rerun.exit_code == 0, rerun.output
        _work(engine)
        cancelled = _cli(store_url, "cancel", run_id, "--reason", H)
        assert cancelled.exit_code == 0, cancelled.output
        record = engine.get_run(run_id)
        assert (
            record is not None
            and record.status is RunStatus.CANCELLED
            and H in (record.error or "")
        )
        retried = _cli(store_url, "retry", run_id, "--json")
        assert retried.exit_code == 0, retried.output
        _work(engine)
        _resume_all(engine, run_id)
        _work(engine)
        _check_completed(engine, run_id)

        # `run` works a one-node pipeline to the end in its own process.
        single = tmp_path / "single.json"
        single.write_text(
            json.dumps({"name": "one", "nodes": [{"slug": SRC, "plugin": EMIT_PLUGIN}]})
        )
        plugins = tmp_path / "hostile_plugins.py"
        plugins.write_text(
            "import dagwerk\n"
            "from dagwerk.models import EmittedOutput\n"
            f"H = {H!r}\n"
            f"@dagwerk.plugin({EMIT_PLUGIN!r})\n"
            "def emit(inputs, ctx):\n"
            "    return [EmittedOutput(id=f'out {n} {H}', fields={'n': n, 'text': H})\n"
            "            for n in range(2)]\n"
        )
        ran_id = "ran-hostile"
        env = {k: v for k, v in os.environ.items() if k != "DAGWERK_DB"}
        ran = subprocess.run(
            [
                sys.executable,
                "-m",
                "dagwerk",
                "run",
                str(single),
                "--plugins",
                str(plugins),
                "--run-id",
                ran_id,
                "--db",
                store_url,
                "--json",
                "--timeout",
                "60",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        assert {ran_id, SRC, _output_id(0), _output_id(1), H} <= _strings(json.loads(ran.stdout))
        ran_outputs = engine.result(ran_id).outputs[SRC]
        assert sorted(o.id for o in ran_outputs) == [_output_id(0), _output_id(1)]
        # The plugins are the test engine's: validate checks the file alone.
        for args in (
            ["validate", pipeline, "--no-plugin-check"],
            ["graph", pipeline, "--format", "dot"],
        ):
            static = CliRunner().invoke(cli, args, catch_exceptions=False)
            assert static.exit_code == 0, static.output

        # Hostile IDs that match nothing: clean refusals, nothing touched.
        for ghost in ("' OR '1'='1", "x'; DELETE FROM dagwerk_runs; --"):
            for args in (
                ["show", ghost],
                ["cancel", ghost],
                ["retry", ghost],
                ["dlq", "reinject", ghost],
            ):
                result = _cli(store_url, *args)
                assert result.exit_code != 0, (args, result.output)
                assert "Traceback" not in result.output
            ghost_resume = _cli(store_url, "resume", ghost, ghost)
            assert ghost_resume.exit_code != 0 and "Traceback" not in ghost_resume.output
        assert sorted(r.run_id for r in engine.list_runs()) == sorted(
            ["control-run", run_id, ran_id]
        )
        assert _snapshot(engine, "control-run") == before
    finally:
        engine.close()
