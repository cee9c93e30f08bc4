"""``dagwerk show RUN`` for composite runs: the child tree and budget use,
as text and as ``--json``."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dagwerk.budgets import Budget
from dagwerk.cli import cli
from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.models import DagNode, TaskInputs
from dagwerk.runtime.children import ChildPipeline
from dagwerk.runtime.context import TaskContext

LEAF = (DagNode(slug="leaf", plugin="leaf", cost_estimate=0.25),)
MIDDLE = (DagNode(slug="middle", plugin="middle", cost_estimate=0.25),)


def _tree(tmp_path: Path) -> tuple[str, str]:
    """A root run whose task starts child ``kid``, whose task starts ``grandkid``."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with Engine(url, execution_root=tmp_path) as engine:

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
        engine.plugin("top", cost=0.5)(waits_for(ChildPipeline(MIDDLE), "kid"))
        result = engine.run(
            [DagNode(slug="top", plugin="top")],
            run_id="root",
            timeout=60,
            budgets=Budget(max_cost=2, max_output_bytes=10_000),
        )
        assert result.status is RunStatus.COMPLETED
    return url, result.run_id


def test_show_json_has_the_child_tree_and_budget_use(tmp_path: Path) -> None:
    url, run_id = _tree(tmp_path)
    runner = CliRunner()
    shown = runner.invoke(cli, ["show", run_id, "--db", url, "--json"])
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.output)
    assert document["parent"] is None
    (kid,) = document["children"]
    assert (kid["run_id"], kid["status"]) == ("kid", "completed")
    assert kid["children"] == [{"run_id": "grandkid", "status": "completed", "children": []}]
    (budget,) = document["budgets"]
    assert budget["account"] == "root" and budget["max_cost"] == 2
    # top (0.5, charged once by its resumed attempt) + middle + leaf (0.25 each).
    assert budget["charged_cost"] == 1.0
    assert budget["reserved_cost"] == 0
    assert 0 < budget["used_output_bytes"] <= 10_000
    child = json.loads(runner.invoke(cli, ["show", "grandkid", "--db", url, "--json"]).output)
    assert child["parent"]["run_id"] == "kid"
    assert child["parent"]["root_run_id"] == "root"
    assert [b["account"] for b in child["budgets"]] == ["root"]


def test_show_text_has_the_child_tree_and_budget_table(tmp_path: Path) -> None:
    url, run_id = _tree(tmp_path)
    runner = CliRunner()
    shown = runner.invoke(cli, ["show", run_id, "--db", url])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    tree = lines.index("child runs:")
    assert lines[tree + 1 : tree + 3] == ["  - kid: completed", "    - grandkid: completed"]
    assert "budgets" in shown.output
    budget_row = next(line for line in lines if line.lstrip().startswith("root "))
    assert "1/2" in budget_row  # cost charged / max_cost
    child = runner.invoke(cli, ["show", "grandkid", "--db", url])
    assert "child of run kid" in child.output and "root root" in child.output
