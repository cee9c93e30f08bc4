"""A run's result is read in a bounded number of statements, whatever the
number of its nodes: every node's outputs come from one read
(``RunOutputsStore.get_run_outputs``), not two reads per node."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from dagwerk import DagNode, Engine, InputEdge, InputMode, RunStatus, TaskContext, TaskInputs


def _chain(length: int) -> list[DagNode]:
    nodes = [DagNode(slug="n0", plugin="step")]
    for n in range(1, length):
        edge = InputEdge(name="prev", source=f"n{n - 1}")
        nodes.append(DagNode(slug=f"n{n}", plugin="step", input_mode=InputMode.EACH, edges=(edge,)))
    return nodes


def test_a_long_chains_result_is_a_few_statements_with_every_output(
    tmp_path: Path, statements: Counter[str]
) -> None:
    with Engine(f"sqlite:///{tmp_path / 'chain.db'}", execution_root=tmp_path) as engine:

        @engine.plugin("step")
        def step(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            return {"at": ctx.node_index}

        done = engine.run(_chain(30), workers=1, timeout=120)
        assert done.status is RunStatus.COMPLETED, done.error
        statements.clear()
        result = engine.result(done.run_id)
    assert sum(statements.values()) <= 4, statements
    assert [result.outputs[f"n{n}"][0].fields["at"] for n in range(30)] == list(range(30))
    assert result.outputs == done.outputs
