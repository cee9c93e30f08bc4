"""What an :class:`Engine` tells about a stored run beyond its result: the
launches of its nodes, why each node has (not) run, its place among
composite runs and its budget use; through the Engine and through
``dagwerk show``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from dagwerk.backends.memory import MemoryStore
from dagwerk.budgets import Budget
from dagwerk.cli import cli
from dagwerk.constants import InputMode, NodeDisposition, RunStatus
from dagwerk.engine import (
    Engine,
    RunLineage,
    RunNotFoundError,
    RunTree,
    UnsupportedOperationError,
)
from dagwerk.models import DagNode, InputEdge, TaskInputs
from dagwerk.runtime.children import ChildPipeline
from dagwerk.runtime.context import TaskContext

NODES = [
    DagNode(slug="a", plugin="a"),
    DagNode(
        slug="b", plugin="b", input_mode=InputMode.EACH, edges=(InputEdge(name="a", source="a"),)
    ),
]
LEAF = (DagNode(slug="leaf", plugin="leaf"),)
MIDDLE = (DagNode(slug="middle", plugin="middle"),)


@pytest.fixture(params=["memory", "sqlite"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'engine.db'}"
    with Engine(url, execution_root=tmp_path) as opened:

        @opened.plugin("a")
        def a(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, object]]:
            return [{"n": 1}, {"n": 2}]

        @opened.plugin("b")
        def b(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            return {"done": True}

        yield opened


def _composite(engine: Engine) -> str:
    """Root run ``root`` whose task starts ``kid``, whose task starts ``grandkid``."""

    @engine.plugin("leaf")
    def leaf(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        return {"v": 1}

    def waits_for(child: ChildPipeline, run_id: str):  # type: ignore[no-untyped-def]
        def plugin(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            result = ctx.child_result()
            if result is None:
                ctx.run_child(child, run_id=run_id)
            assert result is not None
            return {"child": result.status.value}

        return plugin

    engine.plugin("middle")(waits_for(ChildPipeline(LEAF), "grandkid"))
    engine.plugin("top")(waits_for(ChildPipeline(MIDDLE), "kid"))
    result = engine.run(
        [DagNode(slug="top", plugin="top")],
        run_id="root",
        timeout=60,
        budgets=Budget(max_output_bytes=10_000),
    )
    assert result.status is RunStatus.COMPLETED
    return result.run_id


# --- node launches -----------------------------------------------------------------


def test_node_launches_are_the_active_launches_by_node(engine: Engine) -> None:
    run_id = engine.submit(NODES)
    (root,) = engine.node_launches(run_id).values()  # b is not planned before a completes
    assert (root.node_index, root.disposition, len(root.task_ids)) == (
        0,
        NodeDisposition.LAUNCHED,
        1,
    )
    engine.worker(concurrency=1).run_until_idle()
    launches = engine.node_launches(run_id)
    assert sorted(launches) == [0, 1]
    assert len(launches[1].task_ids) == 2  # one task per output of a
    assert all(launch.complete for launch in launches.values())


def test_node_launches_of_an_unknown_run_raise(engine: Engine) -> None:
    with pytest.raises(RunNotFoundError):
        engine.node_launches("nope")


# --- diagnose --------------------------------------------------------------------------


def test_diagnose_names_a_stall_and_why_each_node_waits(engine: Engine) -> None:
    stalled = engine.submit(NODES)
    healthy = engine.submit(NODES)
    (row,) = engine.store.list_deliveries(stalled)
    assert engine.store.ack_delivery(row.delivery_id)  # a lost delivery
    diagnosis = engine.diagnose(stalled)
    assert diagnosis.run_id == stalled and diagnosis.status is RunStatus.RUNNING
    assert diagnosis.stall is not None and diagnosis.stall.held_nodes == (0, 1)
    assert "delivery is missing" in diagnosis.stall.reason
    assert [node.slug for node in diagnosis.nodes] == ["a", "b"]
    assert diagnosis.nodes[1].reason == "waiting on node a"
    fine = engine.diagnose(healthy)
    assert not fine.stalled
    assert fine.nodes[0].reason == "queued for a worker"


def test_diagnose_of_an_unknown_run_raises(engine: Engine) -> None:
    with pytest.raises(RunNotFoundError):
        engine.diagnose("nope")


# --- lineage and budget use ----------------------------------------------------------


def test_lineage_is_the_tree_of_child_runs_and_the_link_to_the_parent(engine: Engine) -> None:
    run_id = _composite(engine)
    root = engine.lineage(run_id)
    assert root == RunLineage(
        link=None,
        children=(
            RunTree(
                "kid",
                RunStatus.COMPLETED,
                (RunTree("grandkid", RunStatus.COMPLETED),),
            ),
        ),
    )
    grandkid = engine.lineage("grandkid")
    assert grandkid.children == ()
    assert grandkid.link is not None
    assert (grandkid.link.parent_run_id, grandkid.link.root_run_id) == ("kid", "root")
    # At most max_runs runs, the run itself included.
    assert engine.lineage(run_id, max_runs=2).children == (RunTree("kid", RunStatus.COMPLETED),)


def test_budget_usage_lists_the_accounts_a_run_draws_on(engine: Engine) -> None:
    run_id = _composite(engine)
    (usage,) = engine.budget_usage(run_id)
    assert usage.account_run_id == "root"
    assert 0 < usage.used_output_bytes <= 10_000
    assert [u.account_run_id for u in engine.budget_usage("grandkid")] == ["root"]
    plain = engine.submit(NODES)
    assert engine.budget_usage(plain) == ()


def test_lineage_and_budget_usage_of_an_unknown_run_raise(engine: Engine) -> None:
    with pytest.raises(RunNotFoundError):
        engine.lineage("nope")
    with pytest.raises(RunNotFoundError):
        engine.budget_usage("nope")


class _StoreWithoutComposites(MemoryStore):
    """A store that keeps neither child runs nor budgets."""

    create_child_run = None  # type: ignore[assignment]
    try_wait_for_child = None  # type: ignore[assignment]
    get_run_link = None  # type: ignore[assignment]
    list_child_runs = None  # type: ignore[assignment]
    try_set_run_budget = None  # type: ignore[assignment]
    get_run_budget = None  # type: ignore[assignment]
    try_admit_task = None  # type: ignore[assignment]


@pytest.fixture
def plain_store(monkeypatch: pytest.MonkeyPatch) -> _StoreWithoutComposites:
    store = _StoreWithoutComposites()
    monkeypatch.setattr("dagwerk.engine._engine.open_store", lambda url, **options: store)
    return store


def test_a_store_without_child_runs_has_no_lineage_and_no_budget_use(
    plain_store: _StoreWithoutComposites, tmp_path: Path
) -> None:
    with Engine("memory://", execution_root=tmp_path) as engine:
        run_id = engine.submit(NODES)
        with pytest.raises(UnsupportedOperationError, match="DagChildStore"):
            engine.lineage(run_id)
        assert engine.budget_usage(run_id) == ()
        # dagwerk show reads the same engine: no child tree, no budgets.
        shown = CliRunner().invoke(cli, ["show", run_id, "--db", "memory://", "--json"])
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.output)
    assert (document["parent"], document["children"], document["budgets"]) == (None, None, [])


# --- the CLI ---------------------------------------------------------------------------


def test_show_prints_the_engines_launches_and_diagnosis(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with Engine(url, execution_root=tmp_path) as engine:
        run_id = engine.submit(NODES)
        launches = engine.node_launches(run_id)
        diagnosis = engine.diagnose(run_id)
    runner = CliRunner()
    shown = json.loads(runner.invoke(cli, ["show", run_id, "--db", url, "--json"]).output)
    assert [n["disposition"] for n in shown["nodes"]] == [
        launches[0].disposition.value,
        None,
    ]
    assert shown["nodes"][0]["generation"] == launches[0].generation
    why = json.loads(runner.invoke(cli, ["show", run_id, "--why", "--db", url, "--json"]).output)
    assert why["nodes"] == [
        {"node": n.slug, "state": n.state.value, "reason": n.reason} for n in diagnosis.nodes
    ]
    missing = runner.invoke(cli, ["show", "nope", "--why", "--db", url])
    assert missing.exit_code != 0
    assert "nope" in missing.output


def test_show_json_has_the_engines_lineage_and_budget_use(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with Engine(url, execution_root=tmp_path) as engine:
        run_id = _composite(engine)
        usage = [u.to_json() for u in engine.budget_usage(run_id)]
    document = json.loads(CliRunner().invoke(cli, ["show", run_id, "--db", url, "--json"]).output)
    assert document["children"] == [
        {
            "run_id": "kid",
            "status": "completed",
            "children": [{"run_id": "grandkid", "status": "completed", "children": []}],
        }
    ]
    assert document["budgets"] == usage


def test_monitoring_gives_the_metrics_and_health_of_the_engines_store() -> None:
    from dagwerk.health import HealthState
    from dagwerk.metrics import Metrics

    engine = Engine("memory://")
    metrics, health = engine.monitoring()
    assert isinstance(metrics, Metrics) and isinstance(health, HealthState)
    assert metrics.store is engine.store and health.store is engine.store
    assert health.backstop is None
