"""``dagwerk runs --stalled`` and ``dagwerk show RUN --why`` (gated dispatch)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dagwerk.cli import cli
from dagwerk.constants import InputMode
from dagwerk.engine import Engine
from dagwerk.models import DagNode, InputEdge

NODES = [
    DagNode(slug="a", plugin="a"),
    DagNode(
        slug="b", plugin="b", input_mode=InputMode.EACH, edges=(InputEdge(name="a", source="a"),)
    ),
]


def test_runs_stalled_and_show_why_name_the_held_nodes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with Engine(url, execution_root=tmp_path) as engine:
        run_id = engine.submit(NODES)
        fine = engine.submit(NODES)
        (row,) = [d for d in engine.store.list_deliveries(run_id)]
        assert engine.store.ack_delivery(row.delivery_id)  # a lost delivery
    runner = CliRunner()
    listed = runner.invoke(cli, ["runs", "--stalled", "--db", url, "--json"])
    assert listed.exit_code == 0, listed.output
    (stalled,) = json.loads(listed.output)
    assert stalled["run_id"] == run_id and stalled["run_id"] != fine
    assert stalled["held_nodes"] == ["a", "b"]
    assert "delivery is missing" in stalled["reason"]
    why = runner.invoke(cli, ["show", run_id, "--why", "--db", url])
    assert why.exit_code == 0, why.output
    assert "b: pending - waiting on node a" in why.output
    assert "stalled:" in why.output
    healthy = runner.invoke(cli, ["show", fine, "--why", "--db", url, "--json"])
    document = json.loads(healthy.output)
    assert document["stalled"] is False
    assert document["nodes"][0] == {"node": "a", "state": "queued", "reason": "queued for a worker"}
