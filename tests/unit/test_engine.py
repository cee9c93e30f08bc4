"""The Engine facade on memory:// and on a SQLite file: run, fail, retry, cancel, resume.

Work is done with ``engine.worker(...).run_until_idle()`` in the test thread
where the test needs to see intermediate states, so nothing here sleeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import dagwerk
from dagwerk import (
    DagNode,
    EdgeSource,
    Engine,
    InputEdge,
    InputMode,
    RunStatus,
    TaskContext,
    TaskInputs,
)
from dagwerk.constants import TaskStatus
from dagwerk.engine import (
    DEFAULT_REGISTRY,
    ResumeRejectedError,
    RunExistsError,
    RunNotFoundError,
    RunWaitTimeoutError,
    UnknownNodeError,
)
from dagwerk.errors import GraphValidationError
from dagwerk.models import RuntimeSource
from dagwerk.pipeline_file import parse_pipeline
from dagwerk.retry import RetryRejectedError
from dagwerk.runtime.errors import UnknownPluginError
from dagwerk.schema import RunInputError
from dagwerk.store import InvalidStoreValueError

NODES = [
    DagNode(slug="load", plugin="load"),
    DagNode(
        slug="upper",
        plugin="upper",
        input_mode=InputMode.EACH,
        edges=(InputEdge(name="rows", source="load"),),
        bindings={"title": EdgeSource(edge="rows", field="title")},
    ),
]


@pytest.fixture(params=["memory", "sqlite"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'engine.db'}"
    with Engine(url, execution_root=tmp_path) as opened:

        @opened.plugin("load")
        def load(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, object]]:
            return [{"title": str(t)} for t in inputs.parameters.get("titles", ())]

        @opened.plugin("upper")
        def upper(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            title = str(inputs.parameters["title"])
            if title == "boom":
                raise RuntimeError("cannot shout boom")
            return {"title": title.upper()}

        yield opened


def _titles(result: dagwerk.RunResult, slug: str) -> list[str]:
    return sorted(str(out.fields["title"]) for out in result.outputs[slug])


def test_run_returns_the_outputs_of_every_node(engine: Engine) -> None:
    result = engine.run(NODES, input={"titles": ["a", "b"]}, workers=2, timeout=30)
    assert result.status is RunStatus.COMPLETED and result.ok
    assert result.error is None
    assert _titles(result, "load") == ["a", "b"]
    assert _titles(result, "upper") == ["A", "B"]
    # Each output carries .id, .fields and .data.
    first = result.outputs["upper"][0]
    assert first.id and dict(first.data) == {}
    assert result.to_json()["status"] == "completed"


def test_a_failing_plugin_fails_the_run_with_its_error(engine: Engine) -> None:
    result = engine.run(NODES, input={"titles": ["a", "boom"]}, timeout=30)
    assert result.status is RunStatus.FAILED
    assert result.error is not None and "cannot shout boom" in result.error


def test_retry_reopens_a_failed_run_and_keeps_successful_nodes(engine: Engine) -> None:
    calls: list[str] = []

    @engine.plugin("upper")
    def upper(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        calls.append(str(inputs.parameters["title"]))
        if len(calls) == 1:
            raise RuntimeError("first call fails")
        return {"title": str(inputs.parameters["title"]).upper()}

    run_id = engine.submit(NODES, input={"titles": ["a"]})
    worker = engine.worker(concurrency=1)
    worker.run_until_idle()
    assert engine.result(run_id).status is RunStatus.FAILED
    retried = engine.retry(run_id, boundary=["upper"])
    assert retried.retry_count == 1
    assert [engine.nodes(run_id)[i].slug for i in retried.affected_nodes] == ["upper"]
    worker.run_until_idle()
    result = engine.result(run_id)
    assert result.status is RunStatus.COMPLETED
    assert _titles(result, "upper") == ["A"]
    assert calls == ["a", "a"]


def test_retry_of_a_running_run_is_rejected(engine: Engine) -> None:
    run_id = engine.submit(NODES, input={"titles": ["a"]})
    with pytest.raises(RetryRejectedError):
        engine.retry(run_id)
    with pytest.raises(UnknownNodeError, match="no node 'nope'"):
        engine.retry(run_id, boundary=["nope"])


def test_cancel_stops_a_run_once(engine: Engine) -> None:
    run_id = engine.submit(NODES, input={"titles": ["a"]})
    assert engine.cancel(run_id, reason="changed my mind") is True
    assert engine.cancel(run_id) is False
    assert engine.worker(concurrency=1).run_until_idle() >= 0
    result = engine.result(run_id)
    assert result.status is RunStatus.CANCELLED
    assert all(task.status is not TaskStatus.COMPLETED for task in engine.list_tasks(run_id))
    with pytest.raises(RunNotFoundError):
        engine.cancel("no-such-run")


def test_resume_queues_a_new_attempt_that_sees_the_wait(engine: Engine) -> None:
    seen: list[str | None] = []

    @engine.plugin("upper")
    def ask(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        seen.append(ctx.resumed_from_wait_id)
        if ctx.resumed_from_wait_id is None:
            ctx.wait("approval")
        return {"title": "approved"}

    run_id = engine.submit(NODES, input={"titles": ["a"]})
    worker = engine.worker(concurrency=1)
    worker.run_until_idle()
    (waiting,) = [t for t in engine.list_tasks(run_id) if t.status is TaskStatus.WAITING]
    assert waiting.active_wait_id == "approval"
    with pytest.raises(ResumeRejectedError, match="cannot be resumed under 'other'"):
        engine.resume(waiting.task_id, "other")
    resumed = engine.resume(waiting.task_id, "approval")
    assert resumed.waiting_attempt_id == waiting.attempt_id
    worker.run_until_idle()
    assert engine.result(run_id).status is RunStatus.COMPLETED
    assert seen == [None, "approval"]


def test_wait_times_out_without_touching_the_run(engine: Engine) -> None:
    run_id = engine.submit(NODES, input={"titles": ["a"]})
    with pytest.raises(RunWaitTimeoutError):
        engine.wait(run_id, timeout=0.01)
    assert engine.get_run(run_id) is not None
    assert engine.progress(run_id).status is RunStatus.RUNNING


def test_submit_refuses_an_existing_run_id(engine: Engine) -> None:
    engine.submit(NODES, input={"titles": []}, run_id="same")
    with pytest.raises(RunExistsError):
        engine.submit(NODES, run_id="same")


def test_submit_lays_input_over_pipeline_defaults(engine: Engine) -> None:
    pipeline = parse_pipeline(
        "defaults: {titles: [x], other: 1}\n"
        "failure_policy: continue_others\n"
        "nodes:\n  - {slug: load, plugin: load}\n"
    )
    run_id = engine.submit(pipeline, input={"titles": ["y"]})
    record = engine.get_run(run_id)
    assert record is not None and record.failure_policy.value == "continue_others"
    engine.worker(concurrency=1).run_until_idle()
    assert _titles(engine.result(run_id), "load") == ["y"]


def test_module_level_plugin_and_import_path_are_found(tmp_path: Path) -> None:
    @dagwerk.plugin("test_engine_shared")
    def shared(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        return {"from": "default registry"}

    nodes = [
        DagNode(slug="a", plugin="test_engine_shared"),
        # Any importable function can be named by import path.
        DagNode(slug="b", plugin="tests_engine_plugins:shout"),
    ]
    (tmp_path / "tests_engine_plugins.py").write_text(
        "def shout(inputs, ctx):\n    return {'from': 'import path'}\n", encoding="utf-8"
    )
    import sys

    sys.path.append(str(tmp_path))
    try:
        with Engine("memory://", execution_root=tmp_path) as engine:
            result = engine.run(nodes, timeout=30)
    finally:
        sys.path.remove(str(tmp_path))
    assert result.ok
    assert result.outputs["a"][0].fields["from"] == "default registry"
    assert result.outputs["b"][0].fields["from"] == "import path"
    assert "test_engine_shared" in DEFAULT_REGISTRY


def test_an_unknown_plugin_is_refused_before_the_run_is_stored(tmp_path: Path) -> None:
    with Engine("memory://", execution_root=tmp_path) as engine:
        with pytest.raises(UnknownPluginError, match=r"nobody_registered_this.*--plugins"):
            engine.run([DagNode(slug="a", plugin="nobody_registered_this")], timeout=30)
        assert engine.list_runs() == []


def test_a_worker_leaves_a_task_it_has_no_plugin_for_to_a_worker_that_has_it(
    tmp_path: Path,
) -> None:
    # A worker without the plugin never leases the task (nothing is failed,
    # no delivery is spent); a worker with it runs the task to completion.
    with Engine(f"sqlite:///{tmp_path / 'd.db'}", execution_root=tmp_path) as engine:
        run_id = engine.submit([DagNode(slug="a", plugin="only_elsewhere")])
        lacking = engine.worker(concurrency=1)
        assert lacking.run_until_idle() == 0
        (task,) = engine.list_tasks(run_id)
        assert task.status is TaskStatus.QUEUED
        other = Engine(f"sqlite:///{tmp_path / 'd.db'}", execution_root=tmp_path)
        with other:
            other.plugin("only_elsewhere")(lambda inputs, ctx: {"ok": True})
            assert other.worker(concurrency=1).run_until_idle() == 1
        result = engine.result(run_id)
    assert result.ok and result.outputs["a"][0].fields["ok"] is True


def test_run_refuses_an_unknown_plugin_before_storing_with_did_you_mean(tmp_path: Path) -> None:
    with Engine("memory://", execution_root=tmp_path) as engine:
        engine.plugin("score_order")(lambda inputs, ctx: {})
        nodes = [
            DagNode(slug="a", plugin="scroe_order"),
            DagNode(slug="b", plugin="no_such_module_here:fn"),
        ]
        with pytest.raises(UnknownPluginError) as caught:
            engine.run(nodes, timeout=30)
        assert engine.list_runs() == []
    message = str(caught.value)
    assert "node 'a': no plugin is registered as 'scroe_order'; did you mean 'score_order'?" in (
        message
    )
    assert "node 'b': plugin 'no_such_module_here:fn': cannot import module" in message


def test_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with Engine() as engine:
        assert engine.url == "sqlite:///dagwerk.db"
    assert (tmp_path / "dagwerk.db").exists()
    from dagwerk.errors import DagwerkError

    # An unreachable server is a typed store error, not a traceback (after
    # the reconnect window: 30 s by default, short here).
    with pytest.raises(DagwerkError, match="cannot connect"):
        Engine("postgresql://127.0.0.1:1/dagwerk", reconnect_timeout=0.5)
    with pytest.raises(InvalidStoreValueError, match="unsupported database URL"):
        Engine("mysql://localhost/x")


def test_top_level_names_are_exported_lazily() -> None:
    for name in (
        "Engine",
        "DagNode",
        "InputEdge",
        "InputMode",
        "EdgeSource",
        "ExpressionSource",
        "TaskInputs",
        "TaskContext",
        "EmittedOutput",
        "RunStatus",
        "plugin",
        "load_pipeline",
    ):
        assert getattr(dagwerk, name) is not None, name
    with pytest.raises(AttributeError):
        dagwerk.NoSuchName  # noqa: B018


def test_list_runs_newest_first_and_by_status(engine: Engine) -> None:
    first = engine.submit(NODES, input={"titles": ["a"]})
    second = engine.submit(NODES, input={"titles": ["a"]})
    engine.cancel(first)
    assert [r.run_id for r in engine.list_runs()][:2] == [second, first]
    assert [r.run_id for r in engine.list_runs(status="cancelled")] == [first]
    assert [r.run_id for r in engine.list_runs(limit=1)] == [second]


def test_list_attempts_counts_a_retry(engine: Engine) -> None:
    result = engine.run(NODES, input={"titles": ["boom"]}, timeout=30)
    (failed,) = [t for t in engine.list_tasks(result.run_id) if t.status is TaskStatus.FAILED]
    (attempt,) = engine.list_attempts(failed.task_id)
    assert attempt.number == 1 and attempt.error is not None and "boom" in attempt.error


def test_rerun_runs_a_completed_node_again(engine: Engine) -> None:
    calls: list[str] = []

    @engine.plugin("upper")
    def upper(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        calls.append(ctx.task_id)
        return {"title": "again"}

    result = engine.run(NODES, input={"titles": ["a"]}, timeout=30)
    assert result.ok
    engine.rerun(result.run_id, nodes=["upper"])
    engine.worker(concurrency=1).run_until_idle()
    assert engine.result(result.run_id).status is RunStatus.COMPLETED
    assert len(calls) == 2


def test_submit_refuses_a_missing_required_input_before_storing(engine: Engine) -> None:
    nodes = [
        DagNode(
            slug="greet",
            plugin="load",
            bindings={"topic": RuntimeSource(key="topic", required=True)},
        )
    ]
    with pytest.raises(RunInputError, match="missing required input"):
        engine.submit(nodes, input={}, run_id="needs-topic")
    assert engine.store.get_run("needs-topic") is None
    assert engine.submit(nodes, input={"topic": "dags"}, run_id="has-topic") == "has-topic"


def test_submit_refuses_an_invalid_graph_before_storing(engine: Engine) -> None:
    cyclic = [
        DagNode(
            slug="a",
            plugin="load",
            input_mode=InputMode.ALL,
            edges=(InputEdge(name="x", source="b"),),
        ),
        DagNode(
            slug="b",
            plugin="load",
            input_mode=InputMode.ALL,
            edges=(InputEdge(name="y", source="a"),),
        ),
    ]
    with pytest.raises(GraphValidationError, match="cycle"):
        engine.submit(cyclic, run_id="cyclic")
    assert engine.store.get_run("cyclic") is None
