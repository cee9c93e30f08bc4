"""Graph validation and dependency queries (GV-01..GV-20, LM-05..LM-07)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagwerk.constants import (
    MAX_INPUT_EDGES_PER_NODE,
    MAX_NODE_BINDING_EVALUATIONS,
    MAX_NODE_BINDINGS,
    CorrelationMode,
    InputMode,
    InputRole,
)
from dagwerk.errors import GraphValidationError
from dagwerk.graph import (
    build_children,
    build_slug_to_index_map,
    downstream_closure,
    find_binding_problem,
    find_ready_nodes,
    find_root_nodes,
    resolve_dependency_indices,
    validate_graph,
    validate_pipeline,
)
from dagwerk.limits import Limits
from dagwerk.models import (
    DagNode,
    EdgeSource,
    ExpressionSource,
    InputEdge,
    LiteralSource,
    PlannedEdgeInput,
    RuntimeSource,
)


def root(slug: str = "root", **kwargs: Any) -> DagNode:
    return DagNode(slug=slug, plugin="p", **kwargs)


def child(
    slug: str,
    *sources: str,
    mode: InputMode | None = InputMode.EACH,
    **kwargs: Any,
) -> DagNode:
    edges = tuple(InputEdge(name=f"e{i}", source=source) for i, source in enumerate(sources))
    return DagNode(slug=slug, plugin="p", edges=edges, input_mode=mode, **kwargs)


def rejection(nodes: list[DagNode], **kwargs: Any) -> GraphValidationError:
    with pytest.raises(GraphValidationError) as info:
        validate_graph(nodes, **kwargs)
    assert isinstance(info.value, ValueError)
    return info.value


# --- GV-01 / GV-02 ---------------------------------------------------------


def test_gv_01_empty_pipeline_is_rejected_but_an_empty_root_query_is_not() -> None:
    error = rejection([])
    assert "pipeline has no nodes" in str(error)
    assert error.rule == "empty_pipeline"
    assert find_root_nodes([]) == []


def test_gv_02_slug_and_plugin_are_required() -> None:
    with pytest.raises(ValueError, match="slug"):
        DagNode(plugin="p")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="slug"):
        DagNode(slug="", plugin="p")
    with pytest.raises(ValueError, match="plugin"):
        DagNode(slug="a", plugin="")


def test_gv_02_duplicate_slugs_are_rejected_naming_the_slug() -> None:
    error = rejection([root("fetch"), root("other"), root("fetch")])
    assert "duplicate node slug" in str(error)
    assert (error.node, error.field, error.rule) == ("fetch", "slug", "duplicate_slug")
    with pytest.raises(GraphValidationError, match="duplicate node slug"):
        build_slug_to_index_map([root("a"), root("a")])


def test_gv_02_an_empty_slug_that_bypassed_validation_is_rejected() -> None:
    sneaky = DagNode.model_construct(slug="", plugin="p")
    error = rejection([root("a"), sneaky])
    assert error.node == "Node 2"
    assert error.field == "slug"
    with pytest.raises(GraphValidationError) as info:
        build_slug_to_index_map([sneaky])
    assert info.value.rule == "empty_slug"


def test_slug_map_indexes_every_node() -> None:
    assert build_slug_to_index_map([root("a"), root("b")]) == {"a": 0, "b": 1}


# --- GV-03 -----------------------------------------------------------------


@pytest.mark.parametrize("legacy", ["depends_on", "fan_mode", "unexpected"])
def test_gv_03_unknown_and_legacy_fields_are_rejected(legacy: str) -> None:
    with pytest.raises(ValueError, match=legacy):
        DagNode.model_validate({"slug": "a", "plugin": "p", legacy: ["x"]})


# --- GV-04 / GV-05 ---------------------------------------------------------


def test_gv_04_unknown_source_is_rejected_with_the_edge_path() -> None:
    nodes = [root("a"), child("b", "a", "missing", mode=InputMode.ALL)]
    error = rejection(nodes)
    assert "references unknown source" in str(error)
    assert "missing" in str(error)
    assert (error.node, error.field, error.rule) == ("b", "edges[1].source", "unknown_source")
    with pytest.raises(GraphValidationError, match="references unknown source"):
        resolve_dependency_indices(nodes)


def test_gv_04_sources_may_follow_their_consumer() -> None:
    assert validate_graph([child("consumer", "producer"), root("producer")]) == [[1], []]


def test_gv_05_edges_from_one_source_make_one_dependency_in_first_seen_order() -> None:
    consumer = DagNode(
        slug="consumer",
        plugin="p",
        input_mode=InputMode.ALL,
        edges=(
            InputEdge(name="b1", source="b"),
            InputEdge(name="a1", source="a"),
            InputEdge(name="b2", source="b", role=InputRole.SIDE),
            InputEdge(name="a2", source="a", required=False),
        ),
    )
    nodes = [root("a"), root("b"), consumer]
    assert validate_graph(nodes) == [[], [], [1, 0]]
    assert resolve_dependency_indices(nodes) == [[], [], [1, 0]]
    # Four routing inputs remain on the validated copy.
    assert len(validate_pipeline(nodes).nodes[2].edges) == 4


# --- GV-06 .. GV-11 --------------------------------------------------------


def test_gv_06_edge_names_are_unique_within_a_node() -> None:
    node = DagNode(
        slug="c",
        plugin="p",
        input_mode=InputMode.EACH,
        edges=(
            InputEdge(name="same", source="r"),
            InputEdge(name="same", source="r", role=InputRole.SIDE, required=False),
        ),
    )
    error = rejection([root("r"), node])
    assert "duplicate edge name" in str(error)
    assert (error.node, error.field, error.rule) == ("c", "edges[1].name", "duplicate_edge_name")


@pytest.mark.parametrize("mode", [InputMode.EACH, InputMode.BY_CORRELATION])
def test_gv_07_a_root_must_use_all_input_mode(mode: InputMode) -> None:
    error = rejection([root("r", input_mode=mode)])
    assert "must use ALL input mode" in str(error)
    assert (error.node, error.field, error.rule) == ("r", "input_mode", "root_mode")


@pytest.mark.parametrize("mode", [None, InputMode.ALL])
def test_gv_07_a_root_may_omit_its_mode_or_declare_all(mode: InputMode | None) -> None:
    node = root("r", input_mode=mode)
    assert validate_graph([node]) == [[]]
    assert node.input_mode is mode
    assert validate_pipeline([node]).nodes[0].input_mode is InputMode.ALL


@pytest.mark.parametrize("role", [InputRole.MAIN, InputRole.SIDE])
def test_gv_08_every_non_root_must_declare_an_input_mode(role: InputRole) -> None:
    node = DagNode(slug="c", plugin="p", edges=(InputEdge(name="x", source="r", role=role),))
    error = rejection([root("r"), node])
    assert "must declare an input mode" in str(error)
    assert (error.node, error.field, error.rule) == ("c", "input_mode", "missing_input_mode")


@pytest.mark.parametrize(
    "edges",
    [
        (InputEdge(name="one", source="r"), InputEdge(name="two", source="r")),
        (InputEdge(name="only", source="r", required=False),),
        (InputEdge(name="side", source="r", role=InputRole.SIDE),),
    ],
    ids=["two-main", "optional-main", "side-only"],
)
def test_gv_09_each_requires_exactly_one_required_main_edge(
    edges: tuple[InputEdge, ...],
) -> None:
    node = DagNode(slug="c", plugin="p", input_mode=InputMode.EACH, edges=edges)
    error = rejection([root("r"), node])
    assert "requires exactly one required main edge" in str(error)
    assert (error.node, error.rule) == ("c", "each_main_edge")


def test_gv_09_each_accepts_side_edges_next_to_its_main_edge() -> None:
    node = DagNode(
        slug="c",
        plugin="p",
        input_mode=InputMode.EACH,
        edges=(
            InputEdge(name="main", source="r"),
            InputEdge(name="side", source="s", role=InputRole.SIDE, required=False),
        ),
    )
    assert validate_graph([root("r"), root("s"), node]) == [[], [], [0, 1]]


def test_gv_10_by_correlation_requires_a_main_edge() -> None:
    side_only = DagNode(
        slug="c",
        plugin="p",
        input_mode=InputMode.BY_CORRELATION,
        edges=(InputEdge(name="side", source="r", role=InputRole.SIDE),),
    )
    error = rejection([root("r"), side_only])
    assert (error.node, error.rule) == ("c", "by_correlation_main_edge")

    optional_mains = DagNode(
        slug="c",
        plugin="p",
        input_mode=InputMode.BY_CORRELATION,
        edges=(
            InputEdge(name="left", source="r", required=False),
            InputEdge(name="right", source="r", required=False),
        ),
    )
    assert validate_graph([root("r"), optional_mains]) == [[], [0]]


def test_gv_11_all_mode_cannot_inherit_a_correlation_id() -> None:
    error = rejection([root("r", correlation_mode=CorrelationMode.INHERIT)])
    assert "cannot inherit a correlation ID" in str(error)
    assert (error.node, error.field, error.rule) == ("r", "correlation_mode", "inherit_correlation")

    fan_in = child("c", "r", mode=InputMode.ALL, correlation_mode=CorrelationMode.INHERIT)
    assert rejection([root("r"), fan_in]).rule == "inherit_correlation"

    each = child("c", "r", correlation_mode=CorrelationMode.INHERIT)
    assert validate_graph([root("r"), each]) == [[], [0]]


# --- GV-12 / LM-07 ---------------------------------------------------------


def consumer_with(binding: Any) -> list[DagNode]:
    node = DagNode(
        slug="c",
        plugin="p",
        input_mode=InputMode.EACH,
        edges=(InputEdge(name="records", source="r"),),
        bindings={"value": binding},
    )
    return [root("r"), node]


def test_gv_12_edge_bindings_must_name_an_edge_of_their_node() -> None:
    error = rejection(consumer_with(EdgeSource(edge="typo", field="x")))
    assert "unknown edge" in str(error)
    assert (error.node, error.field, error.rule) == (
        "c",
        "bindings.value.edge",
        "binding_reference",
    )
    # The source slug is not an edge name; only edge names address edges.
    assert rejection(consumer_with(EdgeSource(edge="r", field="x"))).rule == "binding_reference"
    assert validate_graph(consumer_with(EdgeSource(edge="records", field="x"))) == [[], [0]]


@pytest.mark.parametrize(
    ("binding", "field"),
    [
        (ExpressionSource(expression="{ghost.value}"), "bindings.value.expression"),
        (EdgeSource(edge="records", field="x", when="{ghost.on}"), "bindings.value.when"),
        (
            ExpressionSource(expression="{list(records.a, ghost.b)}"),
            "bindings.value.expression",
        ),
    ],
)
def test_gv_12_expression_and_when_namespaces_must_be_edges_or_input(
    binding: Any, field: str
) -> None:
    error = rejection(consumer_with(binding))
    assert "unknown edges" in str(error)
    assert "ghost" in str(error)
    assert (error.field, error.rule) == (field, "binding_reference")


@pytest.mark.parametrize(
    ("binding", "field"),
    [
        (ExpressionSource(expression="{records.value | nosuchpipe}"), "bindings.value.expression"),
        (ExpressionSource(expression="{records.value | upper(x)}"), "bindings.value.expression"),
        (ExpressionSource(expression="{input.}"), "bindings.value.expression"),
        (ExpressionSource(expression="{list(.value)}"), "bindings.value.expression"),
        (LiteralSource(value=True, when="{records.value"), "bindings.value.when"),
    ],
    ids=["unknown-pipe", "arity", "empty-key", "empty-namespace", "unclosed-when"],
)
def test_gv_12_expression_and_when_syntax_is_checked(binding: Any, field: str) -> None:
    error = rejection(consumer_with(binding))
    assert "error" in str(error)
    assert (error.node, error.field, error.rule) == ("c", field, "binding_reference")


def test_gv_12_valid_references_to_edges_and_input_pass() -> None:
    binding = ExpressionSource(
        expression="{records.title | trim}-{input.suffix}", when="{input.enabled}"
    )
    assert validate_graph(consumer_with(binding)) == [[], [0]]
    assert find_binding_problem(validate_pipeline(consumer_with(binding)).nodes[1]) is None


def one_ref_bindings(count: int) -> dict[str, Any]:
    return {f"v{i}": ExpressionSource(expression=f"{{input.v{i}}}") for i in range(count)}


def test_lm_07_node_binding_step_budget_accepts_its_exact_limit() -> None:
    exact = MAX_NODE_BINDING_EVALUATIONS // 2  # each binding: 1 + one reference
    assert validate_graph([root("r", bindings=one_ref_bindings(exact))]) == [[]]

    error = rejection([root("r", bindings=one_ref_bindings(exact + 1))])
    assert f"bindings require {2 * exact + 2} evaluations" in str(error)
    assert (error.field, error.rule, error.limit) == (
        "bindings",
        "binding_budget",
        MAX_NODE_BINDING_EVALUATIONS,
    )


def test_lm_07_when_clauses_count_towards_the_budget() -> None:
    bindings: dict[str, Any] = {
        f"v{i}": LiteralSource(value=i, when=f"{{input.on{i}}}") for i in range(32)
    }
    assert validate_graph([root("r", bindings=bindings)]) == [[]]
    bindings["extra"] = LiteralSource(value=0)
    assert rejection([root("r", bindings=bindings)]).rule == "binding_budget"


def test_lm_07_the_step_budget_is_an_engine_setting() -> None:
    nodes = [root("r", bindings=one_ref_bindings(3))]  # 6 steps
    assert validate_graph(nodes, limits=Limits(max_node_binding_evaluations=6)) == [[]]
    error = rejection(nodes, limits=Limits(max_node_binding_evaluations=5))
    assert error.limit == 5


# --- LM-05 / LM-06 ---------------------------------------------------------


def test_lm_05_a_node_holds_at_most_64_edges() -> None:
    def edges(count: int) -> tuple[InputEdge, ...]:
        return tuple(InputEdge(name=f"e{i}", source="r") for i in range(count))

    ok = DagNode(
        slug="c", plugin="p", input_mode=InputMode.ALL, edges=edges(MAX_INPUT_EDGES_PER_NODE)
    )
    assert validate_graph([root("r"), ok]) == [[], [0]]
    with pytest.raises(ValueError, match="edges"):
        ok.edges = edges(MAX_INPUT_EDGES_PER_NODE + 1)
    sneaky = DagNode.model_construct(
        slug="c",
        plugin="p",
        input_mode=InputMode.ALL,
        edges=edges(MAX_INPUT_EDGES_PER_NODE + 1),
    )
    error = rejection([root("r"), sneaky])
    assert (error.node, error.field, error.rule) == ("c", "edges", "invalid_field")


def test_lm_06_a_node_holds_at_most_64_bindings() -> None:
    bindings = {f"b{i}": LiteralSource(value=i) for i in range(MAX_NODE_BINDINGS)}
    node = root("r", bindings=bindings)
    assert validate_graph([node]) == [[]]
    # The dict is the caller's and can be grown behind pydantic's back.
    node.bindings["one_too_many"] = LiteralSource(value=0)
    error = rejection([node])
    assert (error.field, error.rule) == ("bindings", "invalid_field")
    assert "64" in str(error)


# --- GV-13 -----------------------------------------------------------------


def test_gv_13_a_two_node_cycle_is_rejected_with_its_members() -> None:
    error = rejection([child("a", "b"), child("b", "a"), root("c")])
    assert "cycle detected involving node 'a'" in str(error)
    assert error.rule == "cycle"
    assert error.cycle == ("a", "b")
    assert error.node == "a"
    assert error.field == "edges[0].source"


def test_gv_13_a_self_loop_is_a_cycle() -> None:
    error = rejection([root("r"), child("loop", "loop")])
    assert error.cycle == ("loop",)
    assert "cycle detected involving node 'loop'" in str(error)


def test_gv_13_the_reported_cycle_excludes_nodes_that_only_hang_off_it() -> None:
    # downstream depends on the ring but is not part of it.
    nodes = [
        child("downstream", "x"),
        child("x", "z"),
        child("y", "x"),
        child("z", "y"),
    ]
    error = rejection(nodes)
    assert set(error.cycle) == {"x", "y", "z"}
    assert error.cycle[0] == "x"  # lowest index on the cycle
    assert error.cycle == ("x", "y", "z")  # data-flow order: x feeds y feeds z


def test_gv_13_a_1500_node_chain_validates_without_recursion() -> None:
    nodes = [child(f"n{i}", f"n{i + 1}") for i in range(1_499)]
    nodes.append(root("n1499"))
    dependencies = validate_graph(nodes)
    assert dependencies[0] == [1]
    assert dependencies[-1] == []
    assert find_root_nodes(nodes) == [1_499]


def test_gv_13_a_1500_node_ring_is_rejected_without_recursion() -> None:
    nodes = [child(f"n{i}", f"n{(i + 1) % 1_500}") for i in range(1_500)]
    error = rejection(nodes)
    assert "cycle detected involving node 'n0'" in str(error)
    assert len(error.cycle) == 1_500
    assert len(str(error)) < 500


# --- GV-14 -----------------------------------------------------------------


def test_gv_14_model_revalidation_precedes_slug_uniqueness() -> None:
    broken = DagNode.model_construct(slug="z", plugin="p", input_mode="nonsense")  # type: ignore[arg-type]
    assert rejection([root("a"), root("a"), broken]).rule == "invalid_field"


def test_gv_14_slug_uniqueness_precedes_unknown_sources() -> None:
    assert rejection([child("a", "ghost"), root("a")]).rule == "duplicate_slug"


def test_gv_14_unknown_sources_precede_node_rules() -> None:
    nodes = [root("r", input_mode=InputMode.EACH), child("c", "ghost")]
    assert rejection(nodes).rule == "unknown_source"


def test_gv_14_duplicate_edge_names_precede_mode_rules_within_a_node() -> None:
    node = DagNode(
        slug="c",
        plugin="p",
        edges=(InputEdge(name="x", source="r"), InputEdge(name="x", source="r")),
    )
    assert rejection([root("r"), node]).rule == "duplicate_edge_name"


def test_gv_14_every_node_rule_precedes_binding_references() -> None:
    bad_binding = root("first", bindings={"v": ExpressionSource(expression="{ghost.x}")})
    bad_mode = DagNode(slug="second", plugin="p", edges=(InputEdge(name="x", source="first"),))
    error = rejection([bad_binding, bad_mode])
    assert (error.node, error.rule) == ("second", "missing_input_mode")


def test_gv_14_binding_references_precede_the_cycle_check() -> None:
    nodes = [
        child("a", "b"),
        child("b", "a", bindings={"v": EdgeSource(edge="nope", field="x")}),
    ]
    assert rejection(nodes).rule == "binding_reference"


# --- GV-15 -----------------------------------------------------------------


def test_gv_15_validation_normalises_copies_without_mutating_callers() -> None:
    node = root("r")
    binding = {"source": "literal", "value": {"enabled": True}}
    node.bindings["value"] = binding  # type: ignore[assignment]
    nodes = [node]

    assert validate_graph(nodes) == [[]]
    assert nodes == [node]
    assert node.bindings["value"] is binding  # type: ignore[comparison-overlap]
    assert binding == {"source": "literal", "value": {"enabled": True}}
    assert node.input_mode is None
    copy = validate_pipeline(nodes).nodes[0]
    assert isinstance(copy.bindings["value"], LiteralSource)

    assert find_root_nodes(nodes) == [0]
    assert node.bindings["value"] is binding  # type: ignore[comparison-overlap]


def test_gv_15_a_malformed_raw_binding_is_a_bindings_error() -> None:
    node = root("malformed")
    node.bindings["value"] = {"source": "literal", "unexpected": True}  # type: ignore[assignment]
    error = rejection([node])
    assert "bindings" in str(error)
    assert error.node == "malformed"
    assert error.field == "bindings.value.unexpected"
    assert error.rule == "invalid_field"


def test_gv_15_a_raw_edge_binding_is_checked_against_edge_names() -> None:
    nodes = consumer_with(LiteralSource(value=1))
    raw = {"source": "edge", "edge": "missing", "field": "value"}
    nodes[1].bindings["value"] = raw  # type: ignore[assignment]
    assert "unknown edge" in str(rejection(nodes))
    assert nodes[1].bindings["value"] is raw  # type: ignore[comparison-overlap]


def test_gv_15_entries_that_are_not_nodes_are_rejected() -> None:
    error = rejection([root("r"), {"slug": "x", "plugin": "p"}])  # type: ignore[list-item]
    assert error.node == "Node 2"


# --- GV-16 -----------------------------------------------------------------


def test_gv_16_ready_nodes_and_downstream_closure() -> None:
    dependencies = ((), (0,), (0,), (1, 2))
    assert find_ready_nodes(dependencies, set(), set()) == [0]
    assert find_ready_nodes(dependencies, {0}, {0}) == [1, 2]
    assert find_ready_nodes(dependencies, {0, 1}, {0, 1, 2}) == []
    assert find_ready_nodes(dependencies, {0, 1, 2}, {0, 1, 2}) == [3]
    assert downstream_closure(dependencies, (1,)) == {1, 3}
    assert downstream_closure(dependencies, [0]) == {0, 1, 2, 3}
    assert downstream_closure(dependencies, ()) == set()


def test_gv_16_a_closure_boundary_must_name_a_node() -> None:
    with pytest.raises(GraphValidationError, match="boundary index"):
        downstream_closure(((), (0,)), (2,))
    with pytest.raises(GraphValidationError):
        downstream_closure(((), (0,)), (True,))


def test_gv_16_validate_graph_returns_parents_and_build_children_inverts_them() -> None:
    nodes = [root("a"), child("b", "a"), child("c", "a"), child("d", "b", "c", mode=InputMode.ALL)]
    dependencies = validate_graph(nodes)
    assert dependencies == [[], [0], [0], [1, 2]]
    assert build_children(dependencies) == [[1, 2], [3], [3], []]
    assert find_root_nodes(nodes) == [0]


def test_build_children_rejects_unknown_parents_and_ignores_repeats() -> None:
    assert build_children([[], [0, 0]]) == [[1], []]
    with pytest.raises(GraphValidationError):
        build_children([[1]])


# --- GV-18 .. GV-20 (model rules the graph relies on) ----------------------


def test_gv_18_nodes_validate_on_assignment_and_on_copy() -> None:
    node = root("r")
    with pytest.raises(ValueError, match="input_mode"):
        node.input_mode = False  # type: ignore[assignment]
    with pytest.raises(ValueError, match="correlation_mode"):
        node.correlation_mode = "invalid"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="input_mode"):
        node.model_copy(update={"input_mode": False})


@pytest.mark.parametrize(
    "name",
    [
        "",
        "input",
        "has space",
        "9records",
        "-records",
        "records.value",
        "records/child",
        "récords",
        "records\n",
    ],
)
def test_gv_19_edge_names_share_one_grammar(name: str) -> None:
    with pytest.raises(ValueError):
        InputEdge(name=name, source="r")
    with pytest.raises(ValueError):
        EdgeSource(edge=name, field="x")
    with pytest.raises(ValueError):
        PlannedEdgeInput(edge=name, source_index=0, role=InputRole.MAIN)


@pytest.mark.parametrize("name", ["records", "_x", "a-b_9", "Input"])
def test_gv_19_valid_edge_names_are_accepted(name: str) -> None:
    assert InputEdge(name=name, source="r").name == name


def test_gv_20_binding_names_and_when_text_must_not_be_empty() -> None:
    with pytest.raises(ValueError):
        root("r", bindings={"": LiteralSource(value=1)})
    with pytest.raises(ValueError):
        RuntimeSource(key="k", when="")


# --- properties ------------------------------------------------------------


@st.composite
def acyclic_pipelines(draw: st.DrawFn) -> tuple[list[DagNode], list[list[int]], list[int]]:
    """A random DAG: a node may only read from nodes earlier in a hidden order.

    The list order is a random permutation of that order, so sources often
    follow their consumers. Returns (nodes, expected parents, hidden order).
    """
    count = draw(st.integers(min_value=1, max_value=12))
    parents_by_rank: list[list[int]] = []
    for rank in range(count):
        chosen = draw(st.lists(st.integers(0, rank - 1), max_size=3)) if rank else []
        parents_by_rank.append(chosen)
    placement = draw(st.permutations(range(count)))  # rank -> list index
    nodes: list[DagNode | None] = [None] * count
    expected: list[list[int]] = [[] for _ in range(count)]
    for rank, chosen in enumerate(parents_by_rank):
        edges = tuple(
            InputEdge(
                name=f"e{i}", source=f"n{source}", role=InputRole.SIDE if i else InputRole.MAIN
            )
            for i, source in enumerate(chosen)
        )
        nodes[placement[rank]] = DagNode(
            slug=f"n{rank}",
            plugin="p",
            edges=edges,
            input_mode=InputMode.ALL if edges else None,
        )
        for source in chosen:
            if placement[source] not in expected[placement[rank]]:
                expected[placement[rank]].append(placement[source])
    return [node for node in nodes if node is not None], expected, list(placement)


@settings(max_examples=150, deadline=None)
@given(acyclic_pipelines())
def test_gv_13_random_dags_validate(
    pipeline: tuple[list[DagNode], list[list[int]], list[int]],
) -> None:
    nodes, expected, _placement = pipeline
    assert validate_graph(nodes) == expected
    assert find_root_nodes(nodes) == [i for i, parents in enumerate(expected) if not parents]


@settings(max_examples=150, deadline=None)
@given(acyclic_pipelines(), st.data())
def test_gv_13_a_back_edge_is_rejected_as_a_cycle_through_it(
    pipeline: tuple[list[DagNode], list[list[int]], list[int]], data: st.DataObject
) -> None:
    nodes, expected, _placement = pipeline
    ancestor = data.draw(st.integers(0, len(nodes) - 1), label="ancestor")
    descendants = sorted(downstream_closure(expected, (ancestor,)))
    descendant = data.draw(st.sampled_from(descendants), label="descendant")
    # ancestor now also reads from its own descendant: every cycle uses this edge.
    target = nodes[ancestor]
    back = InputEdge(name="back", source=nodes[descendant].slug, role=InputRole.SIDE)
    mode = target.input_mode or InputMode.ALL
    nodes[ancestor] = target.model_copy(update={"edges": (*target.edges, back), "input_mode": mode})

    error = rejection(nodes)
    assert error.rule == "cycle"
    assert error.node in error.cycle
    assert f"cycle detected involving node '{error.node}'" in str(error)
    assert {target.slug, nodes[descendant].slug} <= set(error.cycle)
    # Consecutive members really feed each other, and the cycle closes.
    index = build_slug_to_index_map(nodes)
    dependencies = resolve_dependency_indices(nodes)
    ring = [index[slug] for slug in error.cycle]
    for position, member in enumerate(ring):
        feeder = ring[position - 1]
        assert feeder in dependencies[member]


def test_lm_05_lm_06_engine_limits_can_tighten_edge_and_binding_counts() -> None:
    wide = child("c", "a", "b", mode=InputMode.ALL, bindings={"x": LiteralSource(value=1)})
    nodes = [root("a"), root("b"), wide]
    assert validate_graph(nodes, limits=Limits(max_input_edges_per_node=2)) == [[], [], [0, 1]]
    error = rejection(nodes, limits=Limits(max_input_edges_per_node=1))
    assert (error.node, error.field, error.rule, error.limit) == ("c", "edges", "too_many_edges", 1)
    error = rejection(nodes, limits=Limits(max_node_bindings=0))
    assert (error.field, error.rule, error.limit) == ("bindings", "too_many_bindings", 0)
    assert "has 1 bindings; maximum is 0" in str(error)
