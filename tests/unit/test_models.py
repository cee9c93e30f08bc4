"""Model contracts: GV-03, GV-18..GV-20, CR-04, LM-05/06/12/20/21/30, IM-14, FS-05, FS-10."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from dagwerk.constants import (
    MAX_FILTER_MEMBERSHIP_VALUES,
    MAX_FILTER_RULES_PER_EDGE,
    MAX_INPUT_EDGES_PER_NODE,
    MAX_NODE_BINDINGS,
    MAX_OUTPUT_ID_LENGTH,
    MAX_OUTPUT_REFS_PER_PLAN,
    MAX_TASK_PLAN_BYTES,
    SEED_LIMIT_VALUES,
    FilterOperator,
    InputMode,
    LaunchCreateStatus,
    NodeDisposition,
)
from dagwerk.json import FrozenDict, ReadOnlyDict, canonical_json_bytes
from dagwerk.models import (
    DagNode,
    EdgeFilter,
    EdgeSource,
    EmittedOutput,
    ExpressionSource,
    FilterRule,
    InputEdge,
    LaunchCreateResult,
    LiteralSource,
    NodeLaunch,
    OutputRef,
    PlannedEdgeInput,
    PlanningSnapshot,
    ResolvedOutput,
    RuntimeSource,
    SecretSource,
    Selection,
    TaskContext,
    TaskInputPlan,
    emitted_output,
    task_plan_size,
)

# --- GV-03 ------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [{"depends_on": ["load"]}, {"fan_mode": "each"}, {"unknown": 1}],
)
def test_gv_03_dag_node_rejects_unknown_and_legacy_fields(extra: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="extra_forbidden"):
        DagNode(slug="node", plugin="plugin", **extra)
    with pytest.raises(ValidationError, match="extra_forbidden"):
        DagNode.model_validate({"slug": "node", "plugin": "plugin", **extra})


def test_gv_03_frozen_models_forbid_unknown_fields_too() -> None:
    with pytest.raises(ValidationError, match="extra_forbidden"):
        InputEdge(name="records", source="load", unknown=True)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="extra_forbidden"):
        OutputRef.model_validate({"id": "o", "data": {}})


# --- GV-18 ------------------------------------------------------------------


def test_gv_18_dag_node_validates_assignment() -> None:
    node = DagNode(slug="node", plugin="plugin")
    for name, value in (
        ("input_mode", False),
        ("input_mode", "sideways"),
        ("slug", ""),
        ("edges", ({"name": "input", "source": "x"},)),
        ("bindings", {"": {"source": "literal", "value": 1}}),
    ):
        with pytest.raises(ValidationError):
            setattr(node, name, value)
    assert node.input_mode is None and node.slug == "node"
    node.input_mode = "each"  # type: ignore[assignment]
    assert node.input_mode is InputMode.EACH


def test_gv_18_dag_node_model_copy_revalidates_the_update() -> None:
    node = DagNode(slug="node", plugin="plugin", bindings={"a": LiteralSource(value=1)})
    with pytest.raises(ValidationError):
        node.model_copy(update={"input_mode": "bogus"})
    with pytest.raises(ValidationError):
        node.model_copy(update={"plugin": ""})
    copied = node.model_copy(update={"edges": [{"name": "records", "source": "load"}]})
    assert isinstance(copied.edges, tuple) and isinstance(copied.edges[0], InputEdge)
    # The copy owns its bindings dict.
    copied.bindings["b"] = LiteralSource(value=2)
    assert "b" not in node.bindings


def test_a_plain_dag_node_copy_equals_a_validated_one_and_stays_independent() -> None:
    node = DagNode(
        slug="node",
        plugin="plugin",
        edges=[{"name": "records", "source": "load"}],
        bindings={"a": LiteralSource(value=1)},
        retry={"max_attempts": 3},
        priority=2,
    )
    copied = node.model_copy()
    validated = DagNode.model_validate(node.model_dump())
    assert copied == validated == node
    assert copied.model_fields_set == validated.model_fields_set
    assert copied.bindings is not node.bindings
    copied.bindings["b"] = LiteralSource(value=2)
    assert "b" not in node.bindings
    # Still a validating model of its own: assignment checks the value and
    # changes only the copy.
    copied.priority = 5
    assert (copied.priority, node.priority) == (5, 2)
    with pytest.raises(ValidationError):
        copied.plugin = ""


# --- GV-19 ------------------------------------------------------------------

_EDGE_NAME_MODELS: tuple[Callable[[str], object], ...] = (
    lambda name: InputEdge(name=name, source="source"),
    lambda name: EdgeSource(edge=name, field="value"),
    lambda name: PlannedEdgeInput(edge=name, source_index=0, role="main"),
)


@pytest.mark.parametrize("name", ["records", "_settings", "records-2", "R", "a_b-c9", "inputs"])
def test_gv_19_edge_names_share_one_grammar(name: str) -> None:
    for build in _EDGE_NAME_MODELS:
        model = build(name)
        assert name in (getattr(model, "name", None), getattr(model, "edge", None))


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
        "\nrecords",
    ],
)
def test_gv_19_invalid_or_reserved_edge_names_are_rejected(name: str) -> None:
    for build in _EDGE_NAME_MODELS:
        with pytest.raises(ValidationError):
            build(name)


# --- GV-20 ------------------------------------------------------------------


def test_gv_20_binding_names_must_not_be_empty() -> None:
    with pytest.raises(ValidationError, match="binding names"):
        DagNode(slug="node", plugin="plugin", bindings={"": LiteralSource(value=True)})
    node = DagNode(slug="node", plugin="plugin", bindings={"x": LiteralSource(value=True)})
    assert list(node.bindings) == ["x"]


@pytest.mark.parametrize(
    "build",
    [
        lambda when: EdgeSource(edge="records", field="f", when=when),
        lambda when: LiteralSource(value=True, when=when),
        lambda when: RuntimeSource(key="k", when=when),
        lambda when: SecretSource(name="token", when=when),
        lambda when: ExpressionSource(expression="{input.x}", when=when),
    ],
)
def test_gv_20_when_text_must_not_be_empty(build: Callable[[str | None], Any]) -> None:
    with pytest.raises(ValidationError, match="too_short"):
        build("")
    assert build(None).when is None
    assert build("{input.flag}").when == "{input.flag}"


# --- CR-04 / LM-12 -------------------------------------------------------------

_ID_CONSTRUCTORS: tuple[Callable[[str], Any], ...] = (
    lambda value: OutputRef(id=value),
    lambda value: OutputRef(id="output", correlation_id=value),
    lambda value: EmittedOutput(id=value),
    lambda value: ResolvedOutput(id=value),
    lambda value: PlannedEdgeInput(
        edge="records", source_index=0, role="main", output_ids=(value,)
    ),
    lambda value: TaskInputPlan(generation=1, correlation_id=value),
)


def test_lm_12_output_id_limit_keeps_the_seed_value() -> None:
    assert MAX_OUTPUT_ID_LENGTH == 512


@pytest.mark.parametrize("build", _ID_CONSTRUCTORS)
def test_cr_04_ids_accept_the_exact_limit_and_round_trip(build: Callable[[str], Any]) -> None:
    for value in ("x", "o" * MAX_OUTPUT_ID_LENGTH, "é" * MAX_OUTPUT_ID_LENGTH, " / ?#"):
        model = build(value)
        assert type(model).model_validate_json(model.model_dump_json()) == model


@pytest.mark.parametrize("build", _ID_CONSTRUCTORS)
def test_cr_04_ids_reject_empty_and_overlong_values(build: Callable[[str], Any]) -> None:
    with pytest.raises(ValidationError, match=f"at most {MAX_OUTPUT_ID_LENGTH} characters"):
        build("o" * (MAX_OUTPUT_ID_LENGTH + 1))
    with pytest.raises(ValidationError, match="at least 1 character"):
        build("")


@pytest.mark.parametrize("model", [OutputRef(id="output"), TaskInputPlan(generation=1)])
def test_cr_04_correlation_ids_must_not_be_empty_even_through_model_copy(model: Any) -> None:
    with pytest.raises(ValidationError, match="correlation_id"):
        model.model_copy(update={"correlation_id": ""})
    assert model.model_copy(update={"correlation_id": "c"}).correlation_id == "c"


@pytest.mark.parametrize("value", [1, None, b"id"])
def test_cr_04_ids_are_strings_only(value: object) -> None:
    if value is None:
        with pytest.raises(ValidationError):
            OutputRef(id=value)
        return
    with pytest.raises(ValidationError):
        OutputRef(id=value)
    with pytest.raises(ValidationError):
        OutputRef(id="output", correlation_id=value)


# --- LM-30 ------------------------------------------------------------------


def _launch(**changes: Any) -> NodeLaunch:
    values: dict[str, Any] = {
        "id": "launch",
        "run_id": "run",
        "node_index": 0,
        "plugin_name": "plugin",
        "generation": 1,
        "disposition": NodeDisposition.FILTERED,
        "complete": True,
    }
    values.update(changes)
    return NodeLaunch(**values)


_STRUCTURAL_INTEGERS: tuple[Callable[[object], object], ...] = (
    lambda v: Selection(field="score", limit=v),
    lambda v: PlannedEdgeInput(edge="records", source_index=v, role="main"),
    lambda v: TaskInputPlan(generation=v),
    lambda v: TaskInputPlan.model_validate({"schema_version": v, "generation": 1}),
    lambda v: PlanningSnapshot(
        token="t",
        generation=v,
        outputs_by_edge={},
        source_dispositions={},
    ),
    lambda v: _launch(node_index=v),
    lambda v: _launch(generation=v),
    lambda v: TaskContext(run_id="run", node_index=v, generation=1),
    lambda v: TaskContext(run_id="run", node_index=0, generation=v),
)


@pytest.mark.parametrize("invalid", [True, False, "1", 1.0, None])
@pytest.mark.parametrize("build", _STRUCTURAL_INTEGERS)
def test_lm_30_structural_integers_are_strict(
    build: Callable[[object], object], invalid: object
) -> None:
    with pytest.raises(ValidationError):
        build(invalid)
    assert build(1) is not None


def test_lm_30_structural_integers_are_not_negative() -> None:
    for build in _STRUCTURAL_INTEGERS:
        with pytest.raises(ValidationError):
            build(-1)
    with pytest.raises(ValidationError):
        Selection(field="score", limit=0)


@pytest.mark.parametrize("version", [0, 2, "1", 1.0, True])
def test_lm_30_task_plans_accept_only_schema_version_1(version: object) -> None:
    with pytest.raises(ValidationError, match="schema_version"):
        TaskInputPlan.model_validate({"schema_version": version, "generation": 1})
    assert TaskInputPlan.model_validate({"schema_version": 1, "generation": 1}).schema_version == 1


# --- IM-14 ------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"disposition": NodeDisposition.LAUNCHED, "task_ids": (), "complete": False},
        {"disposition": NodeDisposition.LAUNCHED, "task_ids": ("a", "a")},
        {"disposition": NodeDisposition.LAUNCHED, "task_ids": ("a", "")},
        {"disposition": NodeDisposition.SKIPPED, "task_ids": ("task",)},
        {"disposition": NodeDisposition.FILTERED, "complete": False},
        {"disposition": NodeDisposition.FAILED, "error": ""},
        {"disposition": NodeDisposition.FAILED, "complete": False, "error": "boom"},
        {"disposition": NodeDisposition.UPSTREAM_FAILED, "complete": False},
        {"disposition": NodeDisposition.UPSTREAM_FAILED, "task_ids": ("task",)},
        {"id": ""},
        {"run_id": ""},
        {"plugin_name": ""},
    ],
)
def test_im_14_node_launch_rejects_invalid_disposition_state(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _launch(**changes)


@pytest.mark.parametrize(
    "disposition",
    [
        NodeDisposition.SKIPPED,
        NodeDisposition.FILTERED,
        NodeDisposition.FAILED,
        NodeDisposition.UPSTREAM_FAILED,
    ],
)
def test_im_14_zero_task_launches_are_complete_on_creation(disposition: NodeDisposition) -> None:
    error = "source failed" if disposition is NodeDisposition.FAILED else ""
    launch = _launch(disposition=disposition, error=error)
    assert launch.task_ids == () and launch.complete


def test_im_14_launched_nodes_own_tasks_and_may_be_incomplete() -> None:
    launch = _launch(disposition=NodeDisposition.LAUNCHED, task_ids=("t1", "t2"), complete=False)
    assert launch.task_ids == ("t1", "t2") and not launch.complete
    assert _launch(disposition=NodeDisposition.LAUNCHED, task_ids=("t1",)).complete


def test_im_14_launch_create_result_carries_a_launch_unless_stale() -> None:
    launch = _launch()
    assert LaunchCreateResult(status=LaunchCreateStatus.STALE).launch is None
    with pytest.raises(ValidationError):
        LaunchCreateResult(status=LaunchCreateStatus.STALE, launch=launch)
    for status in (LaunchCreateStatus.CREATED, LaunchCreateStatus.ALREADY_EXISTS):
        assert LaunchCreateResult(status=status, launch=launch).launch == launch
        with pytest.raises(ValidationError):
            LaunchCreateResult(status=status)


# --- FS-05 / FS-10 --------------------------------------------------------------


@pytest.mark.parametrize("operator", [FilterOperator.IN, FilterOperator.NOT_IN])
def test_fs_05_membership_rules_hold_at_most_256_candidates(operator: FilterOperator) -> None:
    values = list(range(MAX_FILTER_MEMBERSHIP_VALUES))
    rule = FilterRule(field="value", operator=operator, value=values)
    assert rule.value == tuple(values)
    with pytest.raises(ValidationError, match="membership filter"):
        FilterRule(field="value", operator=operator, value=[*values, -1])


def test_fs_05_the_candidate_limit_applies_only_to_membership_lists() -> None:
    long_list = list(range(MAX_FILTER_MEMBERSHIP_VALUES + 1))
    assert FilterRule(field="v", operator=FilterOperator.EQ, value=long_list).value == tuple(
        long_list
    )
    assert FilterRule(field="v", operator=FilterOperator.IN, value="x" * 1000).value == "x" * 1000
    with pytest.raises(ValidationError, match="membership filter"):
        FilterRule(field="v", operator=FilterOperator.EQ, value=1).model_copy(
            update={"operator": FilterOperator.IN, "value": long_list}
        )


def test_fs_10_edge_filters_hold_at_most_64_rules() -> None:
    assert MAX_FILTER_RULES_PER_EDGE == 64
    rule = FilterRule(field="value", operator=FilterOperator.EQ, value=True)
    assert len(EdgeFilter(rules=(rule,) * MAX_FILTER_RULES_PER_EDGE).rules) == 64
    with pytest.raises(ValidationError, match="too_long"):
        EdgeFilter(rules=(rule,) * (MAX_FILTER_RULES_PER_EDGE + 1))


def test_filter_rule_and_selection_fields_must_not_be_empty() -> None:
    with pytest.raises(ValidationError):
        FilterRule(field="", operator=FilterOperator.EXISTS)
    with pytest.raises(ValidationError):
        Selection(field="")
    with pytest.raises(ValidationError):
        FilterRule(field="f", operator="approximately")


# --- LM-05 / LM-06 ---------------------------------------------------------------


def test_lm_05_nodes_and_plans_hold_at_most_64_edges() -> None:
    assert MAX_INPUT_EDGES_PER_NODE == 64
    edges = [InputEdge(name=f"edge_{i}", source="s") for i in range(MAX_INPUT_EDGES_PER_NODE + 1)]
    assert len(DagNode(slug="n", plugin="p", edges=edges[:-1]).edges) == 64
    with pytest.raises(ValidationError, match="too_long"):
        DagNode(slug="n", plugin="p", edges=edges)

    planned = [
        PlannedEdgeInput(edge=f"edge_{i}", source_index=0, role="main")
        for i in range(MAX_INPUT_EDGES_PER_NODE + 1)
    ]
    assert len(TaskInputPlan(generation=1, edges=planned[:-1]).edges) == 64
    with pytest.raises(ValidationError, match="too_long"):
        TaskInputPlan(generation=1, edges=planned)


def test_lm_06_nodes_hold_at_most_64_bindings() -> None:
    assert MAX_NODE_BINDINGS == 64
    bindings = {f"p{i}": LiteralSource(value=i) for i in range(MAX_NODE_BINDINGS)}
    node = DagNode(slug="n", plugin="p", bindings=bindings)
    assert len(node.bindings) == 64
    with pytest.raises(ValidationError, match="too_long"):
        DagNode(slug="n", plugin="p", bindings={**bindings, "extra": LiteralSource()})
    with pytest.raises(ValidationError, match="too_long"):
        node.bindings = {**bindings, "extra": LiteralSource()}


# --- LM-20 / LM-21 (dagwerk's limits, above the seed's) -------------------------


def test_lm_20_lm_21_dagwerk_raises_the_seed_plan_limits() -> None:
    seed_refs = SEED_LIMIT_VALUES["max_output_refs_per_plan"]
    seed_bytes = SEED_LIMIT_VALUES["max_task_plan_bytes"]
    assert (seed_refs, seed_bytes) == (5_000, 524_288)
    assert seed_refs <= MAX_OUTPUT_REFS_PER_PLAN
    assert seed_bytes <= MAX_TASK_PLAN_BYTES


def test_lm_20_plans_reference_at_most_the_output_limit() -> None:
    half = MAX_OUTPUT_REFS_PER_PLAN // 2
    first = tuple(f"o{i}" for i in range(half))
    second = tuple(f"o{i}" for i in range(MAX_OUTPUT_REFS_PER_PLAN - half))
    edges = [
        {"edge": "left", "source_index": 0, "role": "main", "output_ids": first},
        {"edge": "right", "source_index": 1, "role": "side", "output_ids": second},
    ]
    plan = TaskInputPlan.model_validate({"generation": 1, "edges": edges})
    assert sum(len(edge.output_ids) for edge in plan.edges) == MAX_OUTPUT_REFS_PER_PLAN
    edges[1]["output_ids"] = (*second, "one-more")
    with pytest.raises(ValidationError, match=r"references \d+ outputs"):
        TaskInputPlan.model_validate({"generation": 1, "edges": edges})


def test_lm_21_plans_serialise_to_at_most_the_byte_limit() -> None:
    base = task_plan_size(TaskInputPlan(generation=1, parameters={"payload": ""}), limit=1 << 30)
    exact = TaskInputPlan(generation=1, parameters={"payload": "x" * (MAX_TASK_PLAN_BYTES - base)})
    assert len(canonical_json_bytes(exact.model_dump(mode="json"))) == MAX_TASK_PLAN_BYTES
    with pytest.raises(ValidationError, match=f"{MAX_TASK_PLAN_BYTES}-byte limit"):
        TaskInputPlan(generation=1, parameters={"payload": "x" * (MAX_TASK_PLAN_BYTES - base + 1)})
    # The size counts secret references and the correlation ID as well
    # (a five-byte "ccc" replaces the four-byte null).
    with pytest.raises(ValidationError, match=f"{MAX_TASK_PLAN_BYTES}-byte limit"):
        exact.model_copy(update={"correlation_id": "ccc"})
    assert exact.model_copy(update={"correlation_id": "cc"}).correlation_id == "cc"
    with pytest.raises(ValidationError, match=f"{MAX_TASK_PLAN_BYTES}-byte limit"):
        exact.model_copy(update={"secret_refs": {"t": "s"}})


# --- frozen models, model_copy, plans and outputs --------------------------------


@pytest.mark.parametrize(
    ("model", "field", "value"),
    [
        (OutputRef(id="o"), "id", "other"),
        (OutputRef(id="o"), "fields", {}),
        (InputEdge(name="records", source="load"), "required", False),
        (FilterRule(field="f", operator=FilterOperator.EQ), "value", 1),
        (TaskInputPlan(generation=1), "generation", 2),
        (_launch(), "complete", False),
        (TaskContext(run_id="r", node_index=0, generation=0), "run_id", "x"),
    ],
)
def test_frozen_models_reject_assignment(model: Any, field: str, value: object) -> None:
    before = model.model_dump()
    with pytest.raises(ValidationError, match="frozen"):
        setattr(model, field, value)
    assert model.model_dump() == before


def test_model_copy_revalidates_and_freezes_updates() -> None:
    ref = OutputRef(id="output").model_copy(update={"fields": {"items": [1, 2]}})
    assert isinstance(ref.fields, FrozenDict) and ref.fields["items"] == (1, 2)
    plan = TaskInputPlan(generation=1).model_copy(update={"parameters": {"n": {"v": [1]}}})
    assert isinstance(plan.parameters["n"], FrozenDict)
    with pytest.raises(TypeError, match="immutable"):
        plan.parameters["n"] |= {"changed": True}

    with pytest.raises(ValidationError):
        OutputRef(id="output").model_copy(update={"id": ""})
    with pytest.raises(ValidationError):
        TaskInputPlan(generation=1).model_copy(update={"generation": True})
    with pytest.raises(ValidationError):
        Selection(field="s").model_copy(update={"limit": 0})
    with pytest.raises(ValidationError):
        _launch().model_copy(update={"disposition": NodeDisposition.LAUNCHED})
    with pytest.raises(ValidationError):
        OutputRef(id="o").model_copy(update={"unknown": 1})
    # Without an update the copy is equal.
    assert OutputRef(id="o").model_copy() == OutputRef(id="o")


def test_task_plans_reject_parameter_and_secret_target_overlap() -> None:
    with pytest.raises(ValidationError, match="targets overlap"):
        TaskInputPlan(generation=1, parameters={"token": "x"}, secret_refs={"token": "svc"})
    plan = TaskInputPlan(generation=1, parameters={"a": 1}, secret_refs={"token": "svc"})
    with pytest.raises(ValidationError, match="targets overlap"):
        plan.model_copy(update={"parameters": {"token": None}})


@pytest.mark.parametrize("refs", [{"": "svc"}, {"token": ""}])
def test_task_plans_reject_empty_secret_targets_and_names(refs: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="must not be empty"):
        TaskInputPlan(generation=1, secret_refs=refs)


def test_task_plan_secret_refs_are_a_read_only_copy() -> None:
    source = {"token": "svc"}
    plan = TaskInputPlan(generation=1, secret_refs=source)
    source["other"] = "x"
    assert dict(plan.secret_refs) == {"token": "svc"}
    with pytest.raises(TypeError):
        plan.secret_refs["other"] = "x"  # type: ignore[index]


def test_task_plans_reject_duplicate_edges_and_output_ids() -> None:
    edge = PlannedEdgeInput(edge="records", source_index=0, role="main", output_ids=("a",))
    with pytest.raises(ValidationError, match="edge names must be unique"):
        TaskInputPlan(generation=1, edges=(edge, edge))
    with pytest.raises(ValidationError, match="duplicate output IDs"):
        PlannedEdgeInput(edge="records", source_index=0, role="main", output_ids=("a", "a"))
    # The same output may appear on different edges.
    other = edge.model_copy(update={"edge": "again"})
    assert TaskInputPlan(generation=1, edges=(edge, other)).edges[1].output_ids == ("a",)


@pytest.mark.parametrize("model", [EmittedOutput, ResolvedOutput])
def test_output_data_is_a_read_only_copy(model: type[Any]) -> None:
    source: dict[str, object] = {"path": "/tmp/x", "rows": [1, 2]}
    output = model(id="o", data=source)
    source["path"] = "/elsewhere"
    source["extra"] = True
    assert dict(output.data) == {"path": "/tmp/x", "rows": [1, 2]}
    assert isinstance(output.data, dict)
    with pytest.raises(TypeError, match="immutable"):
        output.data["path"] = "changed"
    # Data is not routing JSON: any Python value is kept, and not size-limited.
    marker = object()
    assert model(id="o", data={"handle": marker}).data["handle"] is marker
    assert len(model(id="o", data={"blob": "x" * 200_000}).data["blob"]) == 200_000
    assert model(id="o").model_dump()["data"] == {}
    with pytest.raises(ValidationError):
        model(id="o", data=[("a", 1)])


# --- emitted_output: EmittedOutput without pydantic's per-call work ---------------------------


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        value = {"in": value}
    return value


_FIELD_CASES: list[Any] = [
    {},
    {"n": 1},
    {"a": "x", "b": [1, 2.5, None, True], "c": {"d": {"e": "f"}}},
    {"big": 10**40, "neg": -0.0},
    {"s": "x" * 200},
    {"nan": float("nan")},  # not JSON
    {"inf": float("inf")},
    {1: "non-string key"},
    {"obj": object()},
    _nested(20),  # past the depth limit
    {"huge": "x" * 70_000},  # past the fields byte limit
    {f"k{i}": i for i in range(600)},  # past the key limit
]


@pytest.mark.parametrize("fields", _FIELD_CASES)
@pytest.mark.parametrize("output_id", ["t/0", "", "x" * 300, "x" * 5000])
def test_emitted_output_equals_validation_or_raises_the_same(output_id: str, fields: Any) -> None:
    try:
        expected = EmittedOutput(id=output_id, fields=fields)
    except ValidationError as exc:
        with pytest.raises(ValidationError) as raised:
            emitted_output(output_id, fields)
        assert raised.value.errors(include_url=False, include_context=False) == exc.errors(
            include_url=False, include_context=False
        )
        return
    built = emitted_output(output_id, fields)
    assert built == expected
    assert built.model_fields_set == expected.model_fields_set
    assert isinstance(built.fields, FrozenDict)
    assert type(built.data) is type(expected.data) is ReadOnlyDict
    assert built.model_dump_json() == expected.model_dump_json()


JSON_VALUE_SCHEMA = {
    "anyOf": [
        {"type": "boolean"},
        {"type": "integer"},
        {"type": "number"},
        {"type": "string"},
        {"items": {"$ref": "#/$defs/JsonValue"}, "type": "array"},
        {"additionalProperties": {"$ref": "#/$defs/JsonValue"}, "type": "object"},
        {"type": "null"},
    ]
}


@pytest.mark.parametrize(
    ("model", "fields"),
    [(LiteralSource, ["value"]), (RuntimeSource, ["default"]), (FilterRule, ["value"])],
)
@pytest.mark.parametrize("mode", ["validation", "serialization"])
def test_json_valued_fields_refer_to_one_json_value_definition(
    model: type[Any], fields: list[str], mode: str
) -> None:
    schema = model.model_json_schema(mode=mode)
    assert schema["$defs"]["JsonValue"] == JSON_VALUE_SCHEMA
    for name in fields:
        assert schema["properties"][name]["$ref"] == "#/$defs/JsonValue"


def test_the_pipeline_schema_names_the_json_value_type_once() -> None:
    from dagwerk.pipeline_file import pipeline_json_schema

    schema = pipeline_json_schema()
    assert schema["$defs"]["JsonValue"] == JSON_VALUE_SCHEMA
    literal = schema["$defs"]["LiteralSource"]["properties"]["value"]
    assert literal["$ref"] == "#/$defs/JsonValue"
    text = json.dumps(schema)
    assert text.count('"anyOf": [{"type": "boolean"}, {"type": "integer"}') == 1
