"""The frozen run topology (GV-07, GV-15, GV-16, GV-17)."""

from __future__ import annotations

import pytest

from dagwerk.constants import CorrelationMode, InputMode, InputRole
from dagwerk.errors import GraphValidationError
from dagwerk.models import (
    DagNode,
    EdgeSource,
    InputEdge,
    LiteralSource,
    NodeDefinition,
)
from dagwerk.topology import FrozenNode, RunTopology


def diamond() -> list[DagNode]:
    return [
        DagNode(slug="load", plugin="load"),
        DagNode(
            slug="left",
            plugin="p",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="records", source="load"),),
            bindings={"title": EdgeSource(edge="records", field="title")},
        ),
        DagNode(
            slug="right",
            plugin="p",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="records", source="load"),),
        ),
        DagNode(
            slug="join",
            plugin="p",
            input_mode=InputMode.BY_CORRELATION,
            edges=(
                InputEdge(name="a", source="left"),
                InputEdge(name="b", source="right"),
                InputEdge(name="cfg", source="load", role=InputRole.SIDE, required=False),
            ),
        ),
    ]


def test_gv_16_topology_holds_parents_children_and_slug_index() -> None:
    topology = RunTopology.build(diamond())
    assert topology.dependencies == ((), (0,), (0,), (1, 2, 0))
    assert topology.children == ((1, 2, 3), (3,), (3,), ())
    assert dict(topology.slug_to_index) == {"load": 0, "left": 1, "right": 2, "join": 3}
    assert topology.roots == (0,)
    assert topology.ready_nodes(set(), set()) == [0]
    assert topology.ready_nodes({0}, {0}) == [1, 2]
    assert topology.downstream_closure((1,)) == {1, 3}
    assert dict(topology.source_indices(3)) == {"a": 1, "b": 2, "cfg": 0}


def test_gv_07_a_root_reads_all_in_the_topology_while_the_caller_keeps_none() -> None:
    root = DagNode(slug="root", plugin="p")
    topology = RunTopology.build([root])
    assert root.input_mode is None
    assert topology.nodes[0].input_mode is InputMode.ALL


def test_gv_17_topology_copies_nodes_and_later_caller_changes_do_not_leak() -> None:
    nodes = [DagNode(slug="source", plugin="p", bindings={"v": LiteralSource(value={"on": True})})]
    topology = RunTopology.build(nodes)
    nodes[0].slug = "changed"
    nodes[0].bindings["other"] = LiteralSource(value=False)
    nodes.append(DagNode(slug="late", plugin="p"))

    assert len(topology.nodes) == 1
    assert topology.nodes[0].slug == "source"
    assert "other" not in topology.nodes[0].bindings
    assert "changed" not in topology.slug_to_index


def test_gv_17_topology_nodes_bindings_and_index_are_immutable() -> None:
    topology = RunTopology.build(diamond())
    node = topology.nodes[1]
    with pytest.raises(AttributeError):
        node.slug = "changed"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        node.input_mode = InputMode.ALL  # type: ignore[misc]
    with pytest.raises(TypeError):
        node.bindings["other"] = LiteralSource(value=False)  # type: ignore[index]
    with pytest.raises(TypeError):
        topology.slug_to_index["changed"] = 0  # type: ignore[index]
    with pytest.raises(AttributeError):
        topology.nodes = ()  # type: ignore[misc]
    assert isinstance(topology.nodes, tuple)
    assert all(isinstance(parents, tuple) for parents in topology.dependencies)
    assert all(isinstance(kids, tuple) for kids in topology.children)


def test_gv_17_topology_nodes_satisfy_the_node_definition_protocol() -> None:
    topology = RunTopology.build(diamond())
    for node in topology.nodes:
        assert isinstance(node, NodeDefinition)
        assert isinstance(node.input_mode, InputMode)
        assert node.correlation_mode is CorrelationMode.DEFAULT


def test_gv_17_an_invalid_mode_that_bypassed_validation_is_rejected() -> None:
    invalid = DagNode.model_construct(slug="root", plugin="p", input_mode=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="input_mode") as info:
        RunTopology.build([invalid])
    assert isinstance(info.value, GraphValidationError)
    assert (info.value.node, info.value.field) == ("root", "input_mode")


def test_gv_17_build_applies_every_graph_rule() -> None:
    with pytest.raises(GraphValidationError, match="pipeline has no nodes"):
        RunTopology.build([])
    with pytest.raises(GraphValidationError, match="cycle detected") as info:
        RunTopology.build(ring())
    assert info.value.cycle == ("a", "b")


def ring() -> list[DagNode]:
    """Two nodes, each the other's source: a cycle."""
    return [
        DagNode(
            slug=name,
            plugin="p",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="up", source=other),),
        )
        for name, other in (("a", "b"), ("b", "a"))
    ]


def test_gv_15_topology_normalises_raw_bindings_without_touching_the_caller() -> None:
    node = DagNode(slug="root", plugin="p")
    binding = {"source": "literal", "value": {"enabled": True}}
    node.bindings["value"] = binding  # type: ignore[assignment]

    topology = RunTopology.build([node])

    frozen = topology.nodes[0].bindings["value"]
    assert isinstance(frozen, LiteralSource)
    assert frozen.value == {"enabled": True}
    assert node.bindings["value"] is binding  # type: ignore[comparison-overlap]


def test_direct_construction_protects_the_index_too() -> None:
    topology = RunTopology(
        nodes=(),
        slug_to_index={"a": 0},
        dependencies=[[]],  # type: ignore[arg-type]
        children=[[]],  # type: ignore[arg-type]
    )
    assert topology.dependencies == ((),)
    with pytest.raises(TypeError):
        topology.slug_to_index["b"] = 1  # type: ignore[index]


def test_frozen_nodes_round_trip_to_dag_nodes() -> None:
    topology = RunTopology.build(diamond())
    copies = [node.to_dag_node() for node in topology.nodes if isinstance(node, FrozenNode)]
    assert len(copies) == 4
    again = RunTopology.build(copies)
    assert again == topology
    assert copies[0].input_mode is InputMode.ALL
    hash(topology.nodes[1])  # frozen nodes can key caches


def test_a_parsed_pipeline_builds_the_same_topology_without_a_second_validation(
    node_validations: list[object],
) -> None:
    # A store that just parsed a stored definition passes parsed=True: the
    # nodes are not validated again, and the topology is the same.
    stored = [node.model_dump(mode="json") for node in diamond()]
    parsed = [DagNode.model_validate(item) for item in stored]
    expected = RunTopology.build([DagNode.model_validate(item) for item in stored])
    node_validations.clear()
    assert RunTopology.build(parsed, parsed=True) == expected
    assert node_validations == []
    assert RunTopology.build(parsed) == expected
    assert len(node_validations) == len(parsed)  # the default re-validates each node


def test_parsed_still_checks_the_graph() -> None:
    with pytest.raises(GraphValidationError, match="cycle"):
        RunTopology.build(ring(), parsed=True)
