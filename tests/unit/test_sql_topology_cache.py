"""The SQL store builds a run's topology with the first parse of its stored
definition: the nodes it just validated are not validated again,
and a worker's first reconcile of the run finds the graph built."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.errors import GraphValidationError
from dagwerk.testing.helpers import chain, child


def test_the_first_parse_builds_the_topology_validating_each_node_once(
    tmp_path: Path, node_validations: list[object]
) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with SqliteStore(url) as submitter:
        assert submitter.create_run("run-1", chain(50))
    node_validations.clear()
    with SqliteStore(url) as worker:  # a process with nothing cached
        node = worker.get_run_node("run-1", 3)
        assert node is not None and node.slug == "n3"
        assert "run-1" in worker._topologies
        topology = worker.get_run_topology("run-1")
        assert topology is not None and topology.children[3] == (4,)
    assert len(node_validations) == 50  # the parse only
    with SqliteStore(url) as again:
        assert again.get_run_topology("run-1") == topology


def test_a_definition_that_fails_the_graph_checks_still_parses(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with SqliteStore(url) as submitter:
        assert submitter.create_run("bad", [child("a", "b"), child("b", "a")])  # a cycle
    with SqliteStore(url) as worker:
        nodes = worker.get_run_nodes("bad")
        assert nodes is not None and [n.slug for n in nodes] == ["a", "b"]
        assert "bad" not in worker._topologies
        with pytest.raises(GraphValidationError, match="cycle"):
            worker.get_run_topology("bad")
