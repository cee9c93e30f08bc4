"""Engines in one process sharing a SQLite file, and the example pipelines via Engine.run."""

from __future__ import annotations

from pathlib import Path

from dagwerk import DagNode, Engine, RunStatus, TaskContext, TaskInputs
from dagwerk.pipeline_file import load_pipeline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pipelines"


def test_one_engine_submits_another_works_and_the_first_waits(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    with (
        Engine(url, execution_root=tmp_path) as submitter,
        Engine(url, execution_root=tmp_path) as serving,
    ):

        @serving.plugin("hello")
        def hello(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            return {"greeting": f"hello {inputs.parameters['name']}"}

        run_id = submitter.submit([DagNode(slug="hi", plugin="hello")], input={"name": "ada"})
        worker = serving.worker(concurrency=2)
        worker.start()
        result = submitter.wait(run_id, timeout=60)
        worker.stop()
    assert result.status is RunStatus.COMPLETED
    assert result.outputs["hi"][0].fields["greeting"] == "hello ada"


def test_the_etl_example_runs_to_completion(tmp_path: Path) -> None:
    pipeline = load_pipeline(EXAMPLES / "etl.yaml")
    with Engine(f"sqlite:///{tmp_path / 'etl.db'}", execution_root=tmp_path) as engine:
        result = engine.run(pipeline, workers=2, timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    (report,) = result.outputs["report"]
    assert report.fields["heading"] == "Largest orders since 2024-01-01"
    # The three largest orders that passed the filter, largest first.
    assert str(report.fields["text"]).startswith("order o-5: Conference Table (3100 EUR)")
    assert len(result.outputs["top"]) == 3


def test_the_flaky_example_succeeds_on_its_third_attempt(tmp_path: Path) -> None:
    pipeline = load_pipeline(EXAMPLES / "flaky.yaml")
    with Engine(f"sqlite:///{tmp_path / 'flaky.db'}", execution_root=tmp_path) as engine:
        result = engine.run(pipeline, workers=1, timeout=120)
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.outputs["fetch"][0].fields["attempts"] == 3


def test_an_each_node_below_an_all_node_is_told_how_to_start_groups(tmp_path: Path) -> None:
    from dagwerk import InputEdge

    nodes = [
        DagNode(slug="rows", plugin="rows"),
        DagNode(
            slug="batch",
            plugin="rows",
            input_mode="all",
            edges=(InputEdge(name="r", source="rows"),),
        ),
        DagNode(
            slug="each",
            plugin="one",
            input_mode="each",
            edges=(InputEdge(name="b", source="batch"),),
        ),
    ]
    with Engine(f"sqlite:///{tmp_path / 'c.db'}", execution_root=tmp_path) as engine:

        @engine.plugin("rows")
        def rows(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, object]]:
            return [{"n": 1}, {"n": 2}]

        @engine.plugin("one")
        def one(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            return {"ok": True}

        failed = engine.run(nodes, timeout=60)
        assert failed.status is RunStatus.FAILED
        assert failed.error is not None
        assert "give node 'each' correlation_mode: new" in failed.error
        fixed = [*nodes[:2], nodes[2].model_copy(update={"correlation_mode": "new"})]
        assert engine.run(fixed, timeout=60).status is RunStatus.COMPLETED
