"""Planning: input modes, snapshot checks, limits and correlation (IM, CR, LM)."""

from __future__ import annotations

import gc
import re
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dagwerk.pipes as pipes_module
from dagwerk.bindings import canonical_size
from dagwerk.constants import (
    CorrelationMode,
    FilterOperator,
    InputMode,
    InputRole,
    NodeDisposition,
    SortOrder,
)
from dagwerk.errors import PlanningError
from dagwerk.filter import apply_filter, apply_selection
from dagwerk.json import FrozenDict, canonical_json_bytes, freeze_json
from dagwerk.limits import Limits
from dagwerk.models import (
    DagNode,
    EdgeFilter,
    EdgeSource,
    ExpressionSource,
    FilterRule,
    InputEdge,
    LiteralSource,
    OutputRef,
    PlanningSnapshot,
    RuntimeSource,
    SecretSource,
    Selection,
    TaskInputPlan,
    output_ref_routing_size,
    task_plan_size,
)
from dagwerk.planning import (
    PlanConstruction,
    _routing_size,
    construct_task_plans,
    correlation_id_for_output,
    resolve_correlation_mode,
)
from dagwerk.topology import RunTopology

LAUNCHED = NodeDisposition.LAUNCHED


def output(output_id: str, correlation_id: str | None = "c1", **fields: object) -> OutputRef:
    return OutputRef(id=output_id, fields=fields, correlation_id=correlation_id)


def snapshot(
    outputs_by_edge: Mapping[str, tuple[OutputRef, ...]],
    *,
    dispositions: dict[str, NodeDisposition] | None = None,
    runtime: dict[str, object] | None = None,
    generation: int = 4,
) -> PlanningSnapshot:
    return PlanningSnapshot(
        token="snapshot",
        generation=generation,
        outputs_by_edge=outputs_by_edge,
        source_dispositions=(
            dispositions if dispositions is not None else dict.fromkeys(outputs_by_edge, LAUNCHED)
        ),
        runtime_inputs=runtime or {},
    )


def consumer(
    mode: InputMode | None,
    *edges: InputEdge,
    bindings: dict[str, object] | None = None,
    correlation: CorrelationMode = CorrelationMode.DEFAULT,
) -> DagNode:
    return DagNode(
        slug="consume",
        plugin="consume",
        input_mode=mode,
        edges=edges or (InputEdge(name="items", source="scan"),),
        bindings=bindings or {},
        correlation_mode=correlation,
    )


def plan(
    node: DagNode,
    outputs_by_edge: Mapping[str, tuple[OutputRef, ...]],
    *,
    limits: Limits | None = None,
    **kwargs: object,
) -> PlanConstruction:
    return construct_task_plans(
        node,
        source_indices={name: index for index, name in enumerate(outputs_by_edge)},
        snapshot=snapshot(outputs_by_edge, **kwargs),  # type: ignore[arg-type]
        limits=limits,
    )


def ids(result: PlanConstruction, edge: str) -> list[tuple[str, ...]]:
    assert result.disposition == LAUNCHED, result.error
    return [next(e.output_ids for e in p.edges if e.edge == edge) for p in result.plans]


def assert_failed(result: PlanConstruction, text: str) -> None:
    assert result.disposition == NodeDisposition.FAILED
    assert result.plans == ()
    assert text in result.error, result.error


# --- IM-01 / IM-02 ------------------------------------------------------------


def test_im_01_root_creates_one_plan_with_the_complete_run_input() -> None:
    """IM-01/BD-07: one edgeless plan at the snapshot generation with all run input."""
    root = DagNode(slug="root", plugin="scan", bindings={"renamed": RuntimeSource(key="source")})
    runtime = {"source": "s3://in", "enabled": False, "limit": 0, "options": {"v": [1, 2]}}
    result = construct_task_plans(
        root, source_indices={}, snapshot=snapshot({}, runtime=runtime, generation=7)
    )
    assert result.disposition == LAUNCHED
    (only,) = result.plans
    assert only.generation == 7
    assert only.edges == ()
    assert only.correlation_id is None
    assert only.parameters == {**runtime, "options": {"v": (1, 2)}, "renamed": "s3://in"}


def test_im_01_topology_root_plans_like_a_dag_node() -> None:
    """IM-01: a frozen topology root (mode ALL) plans the same single plan."""
    topology = RunTopology.build([DagNode(slug="root", plugin="scan")])
    result = construct_task_plans(
        topology.nodes[0], source_indices={}, snapshot=snapshot({}, runtime={"a": 1})
    )
    assert [p.parameters for p in result.plans] == [{"a": 1}]


def test_im_02_non_root_plan_holds_only_bound_runtime_values() -> None:
    """IM-02: unrelated run-input keys are not copied into non-root plans."""
    node = consumer(InputMode.ALL, bindings={"limit": RuntimeSource(key="limit")})
    result = plan(node, {"items": (output("a"),)}, runtime={"limit": 2, "unrelated": "x"})
    assert result.plans[0].parameters == {"limit": 2}


# --- IM-03 --------------------------------------------------------------------


def test_im_03_each_plans_one_task_per_selected_output_and_broadcasts_side() -> None:
    """IM-03: selection order, one output per plan, side edges broadcast, correlation."""
    node = consumer(
        InputMode.EACH,
        InputEdge(name="items", source="scan", selection=Selection(field="rank", limit=3)),
        InputEdge(name="settings", source="cfg", role=InputRole.SIDE),
        bindings={"title": EdgeSource(edge="items", field="title")},
    )
    items = (
        output("x", "cx", rank=3, title="three"),
        output("y", "cy", rank=1, title="one"),
        output("z", "cz", rank=2),
        output("w", "cw", rank=9, title="nine"),
    )
    result = plan(node, {"items": items, "settings": (output("s", None, v=1),)})
    assert ids(result, "items") == [("y",), ("z",), ("x",)]
    assert ids(result, "settings") == [("s",)] * 3
    assert [p.correlation_id for p in result.plans] == ["cy", "cz", "cx"]
    assert [dict(p.parameters) for p in result.plans] == [{"title": "one"}, {}, {"title": "three"}]
    assert [e.source_index for e in result.plans[0].edges] == [0, 1]
    assert [e.role for e in result.plans[0].edges] == [InputRole.MAIN, InputRole.SIDE]


def test_im_03_each_without_selection_keeps_source_order() -> None:
    result = plan(
        consumer(InputMode.EACH), {"items": tuple(output(f"o{n}", f"c{n}") for n in (3, 1, 2))}
    )
    assert ids(result, "items") == [("o3",), ("o1",), ("o2",)]


def test_im_03_each_with_nothing_selected_is_filtered() -> None:
    node = consumer(
        InputMode.EACH,
        InputEdge(
            name="items",
            source="scan",
            filter=EdgeFilter(rules=(FilterRule(field="ok", operator=FilterOperator.EXISTS),)),
        ),
    )
    result = plan(node, {"items": (output("a"),)})
    assert result == PlanConstruction((), NodeDisposition.FILTERED)


# --- IM-04 --------------------------------------------------------------------


def test_im_04_all_plans_one_task_with_each_main_edge_selected() -> None:
    """IM-04: one plan, each main edge with its own selection, no correlation."""
    node = consumer(
        InputMode.ALL,
        InputEdge(name="left", source="a", selection=Selection(field="n", order=SortOrder.DESC)),
        InputEdge(name="right", source="b"),
    )
    result = plan(
        node,
        {"left": (output("l1", n=1), output("l2", n=2)), "right": (output("r1"), output("r2"))},
    )
    assert ids(result, "left") == [("l2",)]
    assert ids(result, "right") == [("r1", "r2")]
    assert result.plans[0].correlation_id is None


def test_im_04_required_empty_main_filters_and_optional_empty_main_runs() -> None:
    """IM-04: required main edge empty → FILTERED; optional empty → one plan."""
    required = consumer(InputMode.ALL, InputEdge(name="items", source="scan"))
    assert plan(required, {"items": ()}).disposition == NodeDisposition.FILTERED
    optional = consumer(InputMode.ALL, InputEdge(name="items", source="scan", required=False))
    assert ids(plan(optional, {"items": ()}), "items") == [()]


# --- IM-05 / IM-06 --------------------------------------------------------------


def by_correlation(*edges: InputEdge) -> DagNode:
    return consumer(InputMode.BY_CORRELATION, *edges)


def test_im_05_required_edges_retain_ids_and_optional_edges_may_be_empty() -> None:
    """IM-05: only IDs present on every required main edge; optional edges may be empty."""
    node = by_correlation(
        InputEdge(name="left", source="a"),
        InputEdge(name="right", source="b"),
        InputEdge(name="extra", source="c", required=False),
    )
    result = plan(
        node,
        {
            "left": (output("l1", "c1"), output("l2", "c2"), output("l3", "c3")),
            "right": (output("r2", "c2"), output("r1", "c1"), output("r1b", "c1")),
            "extra": (output("e2", "c2"), output("e4", "c4")),
        },
    )
    assert [p.correlation_id for p in result.plans] == ["c1", "c2"]
    assert ids(result, "left") == [("l1",), ("l2",)]
    assert ids(result, "right") == [("r1", "r1b"), ("r2",)]
    assert ids(result, "extra") == [(), ("e2",)]


def test_im_05_plan_order_is_plain_string_order() -> None:
    """IM-05: c1, c10, c2 — string order, not numeric."""
    node = by_correlation(InputEdge(name="items", source="a"))
    result = plan(node, {"items": tuple(output(f"o{c}", f"c{c}") for c in (2, 10, 1))})
    assert [p.correlation_id for p in result.plans] == ["c1", "c10", "c2"]


def test_im_05_selection_runs_per_group_and_empty_groups_do_not_count() -> None:
    """IM-05: selection inside each group; a group whose selection is empty is dropped."""
    node = by_correlation(
        InputEdge(name="items", source="a", selection=Selection(field="n", order=SortOrder.DESC)),
        InputEdge(name="other", source="b"),
    )
    result = plan(
        node,
        {
            "items": (
                output("a1", "A", n=1),
                output("a2", "A", n=5),
                output("b1", "B", n=7),
                output("c1", "C"),  # no sortable value: group C is empty
            ),
            "other": (output("x", "A"), output("y", "B"), output("z", "C")),
        },
    )
    assert [p.correlation_id for p in result.plans] == ["A", "B"]
    assert ids(result, "items") == [("a2",), ("b1",)]


def test_im_05_uncorrelated_main_output_fails_but_only_after_filtering() -> None:
    """IM-05: a surviving main-edge output without a correlation ID fails planning."""
    node = by_correlation(InputEdge(name="items", source="a"))
    assert_failed(plan(node, {"items": (output("a", None),)}), "uncorrelated")
    filtered = by_correlation(
        InputEdge(
            name="items",
            source="a",
            filter=EdgeFilter(rules=(FilterRule(field="keep", operator=FilterOperator.EXISTS),)),
        )
    )
    result = plan(filtered, {"items": (output("a", None), output("b", "c", keep=1))})
    assert ids(result, "items") == [("b",)]


def test_im_06_optional_main_edges_form_a_full_outer_join() -> None:
    """IM-06: with only optional main edges every ID is kept; none at all → FILTERED."""
    node = by_correlation(
        InputEdge(name="left", source="a", required=False),
        InputEdge(name="right", source="b", required=False),
    )
    result = plan(node, {"left": (output("l", "c1"),), "right": (output("r", "c2"),)})
    assert [p.correlation_id for p in result.plans] == ["c1", "c2"]
    assert ids(result, "left") == [("l",), ()]
    assert ids(result, "right") == [(), ("r",)]
    assert plan(node, {"left": (), "right": ()}).disposition == NodeDisposition.FILTERED


# --- IM-07 --------------------------------------------------------------------


def test_im_07_side_selection_is_global_and_broadcast() -> None:
    """IM-07: side edges are selected once (not per group) and given to every plan."""
    node = by_correlation(
        InputEdge(name="items", source="a"),
        InputEdge(
            name="best",
            source="b",
            role=InputRole.SIDE,
            selection=Selection(field="score", order=SortOrder.DESC),
        ),
    )
    result = plan(
        node,
        {
            "items": (output("i1", "c1"), output("i2", "c2")),
            "best": (output("s1", "c1", score=1), output("s2", "c2", score=9)),
        },
    )
    assert ids(result, "best") == [("s2",), ("s2",)]


def test_im_07_required_empty_side_edge_filters_before_main_work() -> None:
    """IM-07: a required side edge with nothing selected → FILTERED, even if main would fail."""
    node = by_correlation(
        InputEdge(name="items", source="a"),
        InputEdge(name="cfg", source="b", role=InputRole.SIDE),
    )
    result = plan(node, {"items": (output("i", None),), "cfg": ()})
    assert result.disposition == NodeDisposition.FILTERED


# --- IM-08 / IM-09 --------------------------------------------------------------


def two_edges(optional_second: bool = True) -> DagNode:
    return consumer(
        InputMode.ALL,
        InputEdge(name="items", source="a"),
        InputEdge(name="extra", source="b", required=not optional_second),
    )


def test_im_08_failed_source_fails_even_on_an_optional_edge() -> None:
    result = plan(
        two_edges(),
        {"items": (output("a"),), "extra": ()},
        dispositions={"items": LAUNCHED, "extra": NodeDisposition.FAILED},
    )
    assert_failed(result, "edge 'extra' source launch failed before planning")


@pytest.mark.parametrize("zero", [NodeDisposition.SKIPPED, NodeDisposition.FILTERED])
def test_im_08_required_zero_task_source_cascades_but_optional_is_empty(
    zero: NodeDisposition,
) -> None:
    """IM-08: a required SKIPPED/FILTERED source passes its disposition on."""
    cascaded = plan(
        two_edges(optional_second=False),
        {"items": (output("a"),), "extra": ()},
        dispositions={"items": LAUNCHED, "extra": zero},
    )
    assert cascaded == PlanConstruction((), zero)
    empty = plan(
        two_edges(),
        {"items": (output("a"),), "extra": ()},
        dispositions={"items": LAUNCHED, "extra": zero},
    )
    assert ids(empty, "extra") == [()]


def test_im_08_precedence_failed_then_skipped_then_filtered() -> None:
    node = consumer(
        InputMode.ALL,
        InputEdge(name="a", source="a"),
        InputEdge(name="b", source="b"),
        InputEdge(name="c", source="c", required=False),
    )
    empty: dict[str, tuple[OutputRef, ...]] = {"a": (), "b": (), "c": ()}
    skipped, filtered = NodeDisposition.SKIPPED, NodeDisposition.FILTERED
    result = plan(node, empty, dispositions={"a": filtered, "b": skipped, "c": LAUNCHED})
    assert result.disposition == skipped
    result = plan(
        node, empty, dispositions={"a": filtered, "b": skipped, "c": NodeDisposition.FAILED}
    )
    assert result.disposition == NodeDisposition.FAILED


def test_im_08_required_zero_task_disposition_precedes_optional_overflow() -> None:
    """IM-08: dispositions are applied before output validation."""
    result = plan(
        two_edges(optional_second=False),
        {"items": (output("a"), output("b")), "extra": ()},
        dispositions={"items": LAUNCHED, "extra": NodeDisposition.SKIPPED},
        limits=Limits().with_(max_snapshot_outputs_per_edge=1),
    )
    assert result.disposition == NodeDisposition.SKIPPED


def test_upstream_failed_source_makes_the_consumer_upstream_failed() -> None:
    """dagwerk: an UPSTREAM_FAILED source (continue_others) propagates on any edge."""
    result = plan(
        two_edges(),
        {"items": (output("a"),), "extra": ()},
        dispositions={"items": LAUNCHED, "extra": NodeDisposition.UPSTREAM_FAILED},
    )
    assert result.disposition == NodeDisposition.UPSTREAM_FAILED
    assert result.plans == ()


def test_im_09_zero_task_source_must_not_expose_outputs() -> None:
    result = plan(
        two_edges(),
        {"items": (output("a"),), "extra": (output("b"),)},
        dispositions={"items": LAUNCHED, "extra": NodeDisposition.SKIPPED},
    )
    assert_failed(result, "zero-task source disposition")


def test_im_09_snapshot_and_source_index_edge_sets_must_match() -> None:
    node = two_edges()
    result = construct_task_plans(
        node, source_indices={"items": 0, "extra": 1}, snapshot=snapshot({"items": ()})
    )
    assert_failed(result, "edge set does not match")
    result = construct_task_plans(
        node,
        source_indices={"items": 0},
        snapshot=snapshot({"items": (), "extra": ()}),
    )
    assert_failed(result, "source index edge set")
    result = construct_task_plans(
        node,
        source_indices={"items": 0, "extra": True},
        snapshot=snapshot({"items": (), "extra": ()}),
    )
    assert_failed(result, "source index of edge 'extra'")


# --- IM-10 / LM-14..LM-16 / LM-22 ---------------------------------------------------


def test_im_10_lm_14_per_edge_limit_and_its_exact_boundary() -> None:
    node = consumer(InputMode.ALL)
    limits = Limits().with_(max_snapshot_outputs_per_edge=1)
    assert_failed(
        plan(node, {"items": (output("a"), output("b"))}, limits=limits),
        "edge 'items' has 2 outputs; maximum is 1",
    )
    assert plan(node, {"items": (output("a"),)}, limits=limits).disposition == LAUNCHED


def test_im_10_lm_15_total_limit_and_its_exact_boundary() -> None:
    node = two_edges()
    limits = Limits().with_(max_snapshot_outputs_per_node=1)
    assert_failed(
        plan(node, {"items": (output("a"),), "extra": (output("b"),)}, limits=limits),
        "snapshot contains 2 outputs; maximum is 1",
    )
    assert plan(node, {"items": (output("a"),), "extra": ()}, limits=limits).disposition == LAUNCHED


def test_im_10_lm_16_routing_bytes_exact_boundary_and_overflow() -> None:
    node = consumer(InputMode.ALL)
    outputs = (output("a", title="x"), output("b", None))
    total = sum(output_ref_routing_size(o) for o in outputs)
    exact = plan(node, {"items": outputs}, limits=Limits().with_(max_snapshot_routing_bytes=total))
    assert exact.disposition == LAUNCHED
    over = plan(
        node, {"items": outputs}, limits=Limits().with_(max_snapshot_routing_bytes=total - 1)
    )
    assert_failed(over, f"snapshot routing data is {total} bytes; maximum is {total - 1}")


def test_im_10_duplicate_ids_within_an_edge_fail() -> None:
    assert_failed(
        plan(consumer(InputMode.ALL), {"items": (output("a"), output("a"))}),
        "duplicate output IDs",
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"v": 1}, {"v": 1.0}),
        ({"v": 0.0}, {"v": -0.0}),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        ({"v": [1]}, {"v": [2]}),
    ],
)
def test_im_10_repeated_ids_must_share_the_same_representation(
    first: dict[str, object], second: dict[str, object]
) -> None:
    """IM-10/JS-02: int vs float, 0.0 vs -0.0 and key order are conflicts."""
    result = plan(
        two_edges(),
        {
            "items": (OutputRef(id="id", fields=first, correlation_id="c1"),),
            "extra": (OutputRef(id="id", fields=second, correlation_id="c1"),),
        },
    )
    assert_failed(result, "conflicting values for output 'id'")


def test_im_10_repeated_ids_conflict_on_correlation_and_agree_otherwise() -> None:
    conflict = plan(two_edges(), {"items": (output("id", "c1"),), "extra": (output("id", "c2"),)})
    assert_failed(conflict, "conflicting values for output 'id'")
    same = plan(two_edges(), {"items": (output("id", v=1),), "extra": (output("id", v=1),)})
    assert ids(same, "extra") == [("id",)]


def test_lm_22_run_input_size_is_checked_at_planning() -> None:
    """LM-22: the run input may not exceed the configured bytes (exact size accepted)."""
    runtime = {"text": "x" * 100}
    size = len(canonical_json_bytes(runtime))
    node = consumer(InputMode.ALL)
    fits = plan(
        node, {"items": ()}, runtime=runtime, limits=Limits().with_(max_run_input_bytes=size)
    )
    assert fits.disposition == NodeDisposition.FILTERED  # past the check: nothing to plan
    over = plan(
        node, {"items": ()}, runtime=runtime, limits=Limits().with_(max_run_input_bytes=size - 1)
    )
    assert_failed(over, f"runtime input exceeds the {size - 1}-byte limit")


def test_lm_14_lm_15_seed_limits_are_available() -> None:
    """LM-14/LM-15: Limits.seed() keeps the seed bounds (10,000 per edge)."""
    outputs = tuple(
        OutputRef.model_construct(id=f"o{n}", fields=FrozenDict(), correlation_id=None)
        for n in range(10_001)
    )
    result = plan(consumer(InputMode.ALL), {"items": outputs}, limits=Limits.seed())
    assert_failed(result, "edge 'items' has 10001 outputs; maximum is 10000")


# --- IM-11 / IM-12 / LM-19 / LM-08 -----------------------------------------------


def test_im_11_non_root_without_input_mode_fails_with_the_seed_message() -> None:
    result = plan(consumer(None), {"items": (output("a"),)})
    assert result == PlanConstruction(
        (), NodeDisposition.FAILED, "non-root node 'consume' must declare an input mode"
    )


def many(count: int) -> tuple[OutputRef, ...]:
    return tuple(output(f"item-{n}", f"correlation-{n}") for n in range(count))


@pytest.mark.parametrize("mode", [InputMode.EACH, InputMode.BY_CORRELATION])
def test_im_12_lm_19_plan_count_is_checked_before_bindings(mode: InputMode) -> None:
    """IM-12/LM-19: 201 plans fail under seed limits before any binding runs."""
    node = consumer(mode, bindings={"required": RuntimeSource(key="required", required=True)})
    result = plan(node, {"items": many(201)}, limits=Limits.seed())
    assert_failed(result, "maximum is 200")
    # At the boundary the count passes, so the binding's own error shows.
    assert_failed(plan(node, {"items": many(200)}, limits=Limits.seed()), "required runtime input")


def test_im_12_lm_08_launch_binding_work_is_checked_before_resolution() -> None:
    """IM-12/LM-08: plans × binding steps over the limit fails before resolving."""
    node = consumer(
        InputMode.EACH,
        bindings={"v": ExpressionSource(expression="{input.missing | required}")},
    )
    # Three steps per plan (binding + reference + pipe): 2 plans need 6.
    limits = Limits().with_(max_launch_binding_evaluations=5)
    assert_failed(plan(node, {"items": many(2)}, limits=limits), "binding evaluations")
    exact = Limits().with_(max_launch_binding_evaluations=6)
    assert_failed(plan(node, {"items": many(2)}, limits=exact), "Required value is missing")


def test_lm_07_per_plan_binding_steps_are_limited() -> None:
    """LM-07: 32 one-reference expressions use 64 steps (ok); 33 use 66 (fails)."""

    def node_with(count: int) -> DagNode:
        return consumer(
            InputMode.ALL,
            bindings={f"b{n}": ExpressionSource(expression="{items.v}") for n in range(count)},
        )

    assert plan(node_with(32), {"items": (output("a", v=1),)}).disposition == LAUNCHED
    assert_failed(plan(node_with(33), {"items": (output("a", v=1),)}), "66 evaluations")


def test_lm_09_binding_byte_budget_is_shared_across_plans() -> None:
    """LM-09/BD-09: one plan uses exactly 10 bytes; a second plan exhausts the budget."""
    node = consumer(InputMode.EACH, bindings={"v": ExpressionSource(expression="{items.value}")})
    limits = Limits().with_(max_launch_binding_evaluated_bytes=10)
    one = plan(node, {"items": (output("first", "first", value="abc"),)}, limits=limits)
    assert one.disposition == LAUNCHED
    two = plan(
        node,
        {"items": (output("first", "first", value="abc"), output("second", "s", value="abc"))},
        limits=limits,
    )
    assert_failed(two, "binding evaluation exceeds the 10-byte launch limit")


# --- LM-20 / LM-21 ------------------------------------------------------------------


def test_lm_20_output_references_per_plan() -> None:
    node = consumer(InputMode.ALL)
    limits = Limits().with_(max_output_refs_per_plan=2)
    assert plan(node, {"items": many(2)}, limits=limits).disposition == LAUNCHED
    assert_failed(
        plan(node, {"items": many(3)}, limits=limits),
        "task plan references 3 outputs; maximum is 2",
    )


def test_lm_21_plan_bytes_exact_boundary() -> None:
    """LM-21: a plan of exactly the limit is accepted; one byte less fails."""
    node = consumer(
        InputMode.EACH,
        InputEdge(name="items", source="scan"),
        InputEdge(name="cfg", source="c", role=InputRole.SIDE, required=False),
        bindings={"text": LiteralSource(value="é" * 50), "key": SecretSource(name="vault")},
    )
    outputs = {"items": (output("a", "c"),), "cfg": (output("s", None),)}
    size = task_plan_size(plan(node, outputs).plans[0], limit=1 << 30)
    exact = plan(node, outputs, limits=Limits().with_(max_task_plan_bytes=size))
    assert exact.disposition == LAUNCHED
    assert_failed(
        plan(node, outputs, limits=Limits().with_(max_task_plan_bytes=size - 1)),
        f"task plan exceeds the {size - 1}-byte limit",
    )
    assert_failed(plan(node, outputs, limits=Limits.seed().with_(max_task_plan_bytes=100)), "100")


# --- IM-13 / IM-14 ------------------------------------------------------------------


def test_im_13_when_errors_fail_planning() -> None:
    root = DagNode(
        slug="root",
        plugin="p",
        bindings={"v": RuntimeSource(key="v", when="{input.enabled | required}")},
    )
    result = construct_task_plans(root, source_indices={}, snapshot=snapshot({}, runtime={"v": 1}))
    assert_failed(result, "Required value is missing")


@pytest.mark.parametrize(
    ("expression", "value", "expected"),
    [
        ("{items.value | gt(0)}", 10**1000, True),
        ("{items.value | json_get(key)}", "[" * 20_000 + "0" + "]" * 20_000, None),
    ],
)
def test_im_13_pathological_values_do_not_escape_planning(
    expression: str, value: object, expected: object
) -> None:
    node = consumer(InputMode.ALL, bindings={"out": ExpressionSource(expression=expression)})
    result = plan(node, {"items": (output("a", value=value),)})
    assert result.disposition == LAUNCHED, result.error
    assert result.plans[0].parameters.get("out") == expected


def test_im_13_deep_standard_regex_does_not_escape_planning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if hasattr(pipes_module, "_re_engine"):
        monkeypatch.setattr(pipes_module, "_re_engine", re)
    pattern = "(" * 1_000 + "a" + ")" * 1_000
    node = consumer(
        InputMode.ALL,
        bindings={"m": ExpressionSource(expression=f"{{items.value | match({pattern})}}")},
    )
    result = plan(node, {"items": (output("a", value="a"),)})
    assert result.disposition == LAUNCHED, result.error


def test_im_14_dispositions_carry_plans_only_when_launched() -> None:
    """IM-14: LAUNCHED has ≥1 plan; zero-task dispositions none; FAILED an error."""
    launched = plan(consumer(InputMode.ALL), {"items": (output("a"),)})
    filtered = plan(consumer(InputMode.ALL), {"items": ()})
    failed = plan(consumer(None), {"items": ()})
    assert launched.plans and not launched.error
    assert filtered.plans == () and not filtered.error
    assert failed.plans == () and failed.error


def test_im_13_selection_errors_become_failed_dispositions() -> None:
    """IM-13/FS-09: an unsortable or mixed selection fails planning instead of raising."""
    node = consumer(
        InputMode.EACH, InputEdge(name="items", source="scan", selection=Selection(field="n"))
    )
    assert_failed(plan(node, {"items": (output("a", n=1), output("b", n="2"))}), "mixed")
    assert_failed(plan(node, {"items": (output("a", n=True),)}), "not a sortable")


def test_malformed_nodes_fail_instead_of_raising() -> None:
    """IM-13: definitions that bypassed graph validation still yield FAILED."""
    sides_only = consumer(
        InputMode.EACH, InputEdge(name="cfg", source="c", role=InputRole.SIDE, required=False)
    )
    assert_failed(plan(sides_only, {"cfg": ()}), "exactly one required main edge")
    no_main = consumer(
        InputMode.BY_CORRELATION,
        InputEdge(name="cfg", source="c", role=InputRole.SIDE, required=False),
    )
    assert_failed(plan(no_main, {"cfg": ()}), "requires a main edge")
    each_root = DagNode(slug="root", plugin="p", input_mode=InputMode.EACH)
    result = construct_task_plans(each_root, source_indices={}, snapshot=snapshot({}))
    assert_failed(result, "must use ALL input mode")
    result = construct_task_plans(
        consumer(InputMode.ALL),
        source_indices={"items": 0},
        snapshot=snapshot({"items": ()}),
        is_root=True,
    )
    assert_failed(result, "is_root=True contradicts")
    result = construct_task_plans(
        DagNode(slug="root", plugin="p"), source_indices={}, snapshot=snapshot({}), is_root=True
    )
    assert result.disposition == LAUNCHED


def test_planning_restores_the_cyclic_collector() -> None:
    assert gc.isenabled()
    plan(consumer(InputMode.ALL), {"items": (output("a"),)})
    assert gc.isenabled()
    gc.disable()
    try:
        plan(consumer(InputMode.ALL), {"items": (output("a"),)})
        assert not gc.isenabled()
    finally:
        gc.enable()


# --- CR-01..CR-04 -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "explicit", "is_root", "expected"),
    [
        (None, CorrelationMode.DEFAULT, True, CorrelationMode.NEW),
        (InputMode.ALL, CorrelationMode.DEFAULT, True, CorrelationMode.NEW),
        (InputMode.EACH, CorrelationMode.DEFAULT, False, CorrelationMode.INHERIT),
        (InputMode.BY_CORRELATION, CorrelationMode.DEFAULT, False, CorrelationMode.INHERIT),
        (InputMode.ALL, CorrelationMode.DEFAULT, False, CorrelationMode.NONE),
        (InputMode.ALL, CorrelationMode.NEW, False, CorrelationMode.NEW),
        (InputMode.EACH, CorrelationMode.NONE, False, CorrelationMode.NONE),
        (None, CorrelationMode.INHERIT, True, CorrelationMode.INHERIT),
    ],
)
def test_cr_01_default_correlation_resolution(
    mode: InputMode | None, explicit: CorrelationMode, is_root: bool, expected: CorrelationMode
) -> None:
    node = consumer(mode, correlation=explicit)
    assert resolve_correlation_mode(node, is_root=is_root) == expected


def test_cr_02_output_correlation_follows_the_mode() -> None:
    new = consumer(InputMode.ALL, correlation=CorrelationMode.NEW)
    none = consumer(InputMode.EACH, correlation=CorrelationMode.NONE)
    inherit = consumer(InputMode.EACH)
    kwargs = {"is_root": False, "output_id": "out"}
    assert correlation_id_for_output(new, task_correlation_id="t", **kwargs) == "out"  # type: ignore[arg-type]
    assert correlation_id_for_output(none, task_correlation_id="t", **kwargs) is None  # type: ignore[arg-type]
    assert correlation_id_for_output(inherit, task_correlation_id="t", **kwargs) == "t"  # type: ignore[arg-type]
    for absent in (None, ""):
        with pytest.raises(ValueError, match="no correlation"):
            correlation_id_for_output(inherit, task_correlation_id=absent, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="output ID must not be empty"):
        correlation_id_for_output(new, is_root=False, task_correlation_id="t", output_id="")
    root = DagNode(slug="root", plugin="p")
    assert (
        correlation_id_for_output(root, is_root=True, task_correlation_id=None, output_id="o")
        == "o"
    )


def test_cr_03_plan_correlation_per_mode() -> None:
    """CR-03: EACH → output's ID, BY_CORRELATION → group ID, ALL and root → none."""
    items = {"items": (output("a", "ca"), output("b", "cb"))}
    assert [p.correlation_id for p in plan(consumer(InputMode.EACH), items).plans] == ["ca", "cb"]
    by = plan(consumer(InputMode.BY_CORRELATION), items)
    assert [p.correlation_id for p in by.plans] == ["ca", "cb"]
    assert [p.correlation_id for p in plan(consumer(InputMode.ALL), items).plans] == [None]


def test_cr_03_inherit_without_a_correlation_id_fails() -> None:
    """CR-03: EACH over uncorrelated outputs fails unless the node opts out."""
    items = {"items": (output("a", None),)}
    assert_failed(
        plan(consumer(InputMode.EACH), items), "uses INHERIT but the task has no correlation ID"
    )
    opted_out = plan(consumer(InputMode.EACH, correlation=CorrelationMode.NONE), items)
    assert [p.correlation_id for p in opted_out.plans] == [None]
    assert_failed(
        plan(consumer(InputMode.ALL, correlation=CorrelationMode.INHERIT), items), "INHERIT"
    )


def test_cr_04_correlation_ids_up_to_512_characters_pass_through() -> None:
    long_id = "c" * 512
    result = plan(consumer(InputMode.EACH), {"items": (output("o" * 512, long_id),)})
    assert result.plans[0].correlation_id == long_id
    assert result.plans[0].edges[0].output_ids == ("o" * 512,)
    with pytest.raises(ValueError):
        output("a", "c" * 513)
    with pytest.raises(ValueError):
        output("a", "")


# --- scale (dagwerk goes beyond the seed) -----------------------------------------


def bulk(count: int) -> tuple[OutputRef, ...]:
    return tuple(
        OutputRef.model_construct(
            id=f"out-{n}", fields=FrozenDict({"n": n}), correlation_id=f"out-{n}"
        )
        for n in range(count)
    )


def test_default_limits_plan_100000_each_tasks() -> None:
    """decisions.md: one node fans out to 100,000 tasks under the default Limits()."""
    node = consumer(InputMode.EACH, bindings={"n": EdgeSource(edge="items", field="n")})
    result = plan(node, {"items": bulk(100_000)})
    assert len(result.plans) == 100_000
    assert result.plans[-1].parameters == {"n": 99_999}
    assert result.plans[-1].edges[0].output_ids == ("out-99999",)


def test_default_limits_take_100000_outputs_on_one_all_edge() -> None:
    """decisions.md: a fan-in node consumes 100,000 outputs on one edge."""
    result = plan(consumer(InputMode.ALL), {"items": bulk(100_000)})
    (only,) = result.plans
    assert len(only.edges[0].output_ids) == 100_000
    assert TaskInputPlan.model_validate(only.model_dump()) == only


# --- properties: random snapshots against a plain reference ------------------------

CORRELATIONS = (None, "c1", "c2", "c10", "c3")


@st.composite
def edge_outputs(draw: st.DrawFn, prefix: str) -> tuple[OutputRef, ...]:
    count = draw(st.integers(0, 6))
    result = []
    for n in range(count):
        fields: dict[str, object] = {}
        if draw(st.booleans()):
            fields["n"] = draw(st.one_of(st.none(), st.integers(-3, 3)))
        if draw(st.booleans()):
            fields["k"] = draw(st.text(alphabet='aé"\\\n', max_size=3))
        if draw(st.booleans()):
            fields["flag"] = draw(st.booleans())
        result.append(output(f"{prefix}{n}", draw(st.sampled_from(CORRELATIONS)), **fields))
    return tuple(draw(st.permutations(result)))


@st.composite
def edge_config(draw: st.DrawFn, name: str, role: InputRole, required: bool) -> InputEdge:
    rules = draw(
        st.sampled_from(
            [
                None,
                (FilterRule(field="k", operator=FilterOperator.EXISTS),),
                (FilterRule(field="flag", operator=FilterOperator.EQ, value=True),),
            ]
        )
    )
    selection = draw(
        st.one_of(
            st.none(),
            st.builds(
                Selection,
                field=st.just("n"),
                order=st.sampled_from(SortOrder),
                limit=st.integers(1, 3),
            ),
        )
    )
    return InputEdge(
        name=name,
        source=f"src-{name}",
        role=role,
        required=required,
        filter=EdgeFilter(rules=rules) if rules else None,
        selection=selection,
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[DagNode, dict[str, tuple[OutputRef, ...]]]:
    mode = draw(st.sampled_from(InputMode))
    main_count = 1 if mode == InputMode.EACH else draw(st.integers(1, 2))
    edges = [
        draw(
            edge_config(
                f"m{i}",
                InputRole.MAIN,
                True if mode == InputMode.EACH else draw(st.booleans()),
            )
        )
        for i in range(main_count)
    ]
    if draw(st.booleans()):
        edges.append(draw(edge_config("side", InputRole.SIDE, draw(st.booleans()))))
    bindings: dict[str, object] = {
        "v": EdgeSource(edge="m0", field="n"),
        "lit": LiteralSource(value=[1, "x"]),
    }
    if len(edges) > 1:
        bindings["s"] = EdgeSource(edge=edges[-1].name, field="k")
    if draw(st.booleans()):
        bindings["token"] = SecretSource(name="vault/token")
    correlation = draw(st.sampled_from([CorrelationMode.DEFAULT, CorrelationMode.NONE]))
    node = consumer(mode, *edges, bindings=bindings, correlation=correlation)
    outputs = {edge.name: draw(edge_outputs(f"{edge.name}-")) for edge in edges}
    return node, outputs


def reference_field(outputs: tuple[OutputRef, ...], field: str) -> object:
    values = [o.fields[field] for o in outputs if field in o.fields]
    return None if not values else values[0] if len(values) == 1 else tuple(values)


def reference_plans(node: DagNode, outputs: dict[str, tuple[OutputRef, ...]]) -> object:
    """A direct restatement of IM-03..IM-07, CR-03 and BD-01/BD-02/BD-04."""
    try:
        prepared = {e.name: apply_filter(outputs[e.name], e.filter) for e in node.edges}
        sides = {}
        for e in node.edges:
            if e.role == InputRole.SIDE:
                sides[e.name] = apply_selection(prepared[e.name], e.selection)
                if e.required and not sides[e.name]:
                    return NodeDisposition.FILTERED
        mains = [e for e in node.edges if e.role == InputRole.MAIN]
        groups: list[tuple[str | None, dict[str, tuple[OutputRef, ...]]]] = []
        if node.input_mode == InputMode.EACH:
            chosen = apply_selection(prepared["m0"], mains[0].selection)
            groups = [(o.correlation_id, {"m0": (o,)}) for o in chosen]
        elif node.input_mode == InputMode.ALL:
            selected = {e.name: apply_selection(prepared[e.name], e.selection) for e in mains}
            if any(e.required and not selected[e.name] for e in mains):
                return NodeDisposition.FILTERED
            groups = [(None, selected)]
        else:
            per_edge = {}
            for e in mains:
                if any(o.correlation_id is None for o in prepared[e.name]):
                    return NodeDisposition.FAILED
                by_id: dict[str, list[OutputRef]] = {}
                for o in prepared[e.name]:
                    by_id.setdefault(o.correlation_id, []).append(o)  # type: ignore[arg-type]
                per_edge[e.name] = {
                    c: apply_selection(tuple(g), e.selection) for c, g in by_id.items()
                }
                per_edge[e.name] = {c: g for c, g in per_edge[e.name].items() if g}
            every = set().union(*(set(g) for g in per_edge.values()))
            kept = sorted(
                c for c in every if all(c in per_edge[e.name] for e in mains if e.required)
            )
            groups = [(c, {e.name: per_edge[e.name].get(c, ()) for e in mains}) for c in kept]
        if not groups:
            return NodeDisposition.FILTERED
        inherit = (
            node.correlation_mode == CorrelationMode.DEFAULT and node.input_mode != InputMode.ALL
        )
        result = []
        for correlation_id, selected in groups:
            if inherit and correlation_id is None:
                return NodeDisposition.FAILED
            planned = {e.name: selected.get(e.name, sides.get(e.name, ())) for e in node.edges}
            parameters: dict[str, object] = {"lit": (1, "x")}
            secrets = {"token": "vault/token"} if "token" in node.bindings else {}
            value = reference_field(planned["m0"], "n")
            if value is not None:
                parameters["v"] = value
            if len(node.edges) > 1:
                value = reference_field(planned[node.edges[-1].name], "k")
                if value is not None:
                    parameters["s"] = value
            result.append(
                (
                    correlation_id,
                    [(name, tuple(o.id for o in chosen)) for name, chosen in planned.items()],
                    parameters,
                    secrets,
                )
            )
        return result
    except PlanningError:
        return NodeDisposition.FAILED


def summary(result: PlanConstruction) -> object:
    if result.disposition != LAUNCHED:
        return result.disposition
    return [
        (
            p.correlation_id,
            [(e.edge, e.output_ids) for e in p.edges],
            dict(p.parameters),
            dict(p.secret_refs),
        )
        for p in result.plans
    ]


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_im_03_to_im_07_plans_match_a_reference_on_random_snapshots(
    scenario: tuple[DagNode, dict[str, tuple[OutputRef, ...]]],
) -> None:
    """IM-03..IM-07/CR-03: plan counts, order, edges and parameters equal the reference."""
    node, outputs = scenario
    result = plan(node, outputs)
    assert summary(result) == reference_plans(node, outputs), result.error
    if result.disposition == LAUNCHED:
        assert len(result.plans) >= 1
        assert all(p.generation == 4 for p in result.plans)
        assert [e.source_index for e in result.plans[0].edges] == list(range(len(node.edges)))


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_planned_plans_equal_validated_plans_and_their_size_is_exact(
    scenario: tuple[DagNode, dict[str, tuple[OutputRef, ...]]],
) -> None:
    """Trusted construction builds exactly what pydantic validation builds (LM-20/LM-21)."""
    node, outputs = scenario
    result = plan(node, outputs)
    if result.disposition != LAUNCHED:
        return
    for planned in result.plans:
        validated = TaskInputPlan.model_validate(planned.model_dump())
        assert validated == planned
        assert validated.model_dump_json() == planned.model_dump_json()
        assert planned.model_fields_set == validated.model_fields_set
        constructed = TaskInputPlan.model_construct(**dict(planned))
        assert constructed == planned
        assert planned.__pydantic_extra__ is None and planned.__pydantic_private__ is None
        for edge in planned.edges:
            assert type(edge).model_validate(edge.model_dump()) == edge
    largest = max(task_plan_size(p, limit=1 << 30) for p in result.plans)
    refs = max(sum(len(e.output_ids) for e in p.edges) for p in result.plans)
    tight = Limits().with_(max_task_plan_bytes=largest, max_output_refs_per_plan=refs)
    assert summary(plan(node, outputs, limits=tight)) == summary(result)
    assert_failed(
        plan(node, outputs, limits=tight.with_(max_task_plan_bytes=largest - 1)), "byte limit"
    )
    if refs:
        assert_failed(
            plan(node, outputs, limits=tight.with_(max_output_refs_per_plan=refs - 1)),
            "task plan references",
        )


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(json_values, st.sampled_from([None, "c", 'é\n"', "x" * 40]))
def test_fast_sizes_equal_the_canonical_sizes(value: object, correlation_id: str | None) -> None:
    """The planning size shortcuts agree with the canonical JSON size (JS-05, LM-16)."""
    frozen = freeze_json(value)
    assert canonical_size(frozen) == len(canonical_json_bytes(frozen))
    ref = OutputRef(id="ïd", fields={"v": value}, correlation_id=correlation_id)
    assert _routing_size(ref) == output_ref_routing_size(ref)
