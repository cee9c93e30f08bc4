"""Run-input schema, run-input merging, binding checks and plugin metadata.

Contracts RI-01..RI-04 (and the text form of GV-12).
"""

from __future__ import annotations

from typing import Any

import pytest

from dagwerk.constants import MAX_RUN_INPUT_BYTES, InputMode
from dagwerk.errors import DagwerkError, ExpressionError
from dagwerk.json import FrozenDict, canonical_json_bytes
from dagwerk.models import (
    DagNode,
    EdgeSource,
    ExpressionSource,
    InputEdge,
    LiteralSource,
    RuntimeSource,
)
from dagwerk.plugins import PluginInputMeta, PluginMeta, PluginMetadataError
from dagwerk.schema import (
    InputFieldSpec,
    RunInputError,
    get_pipeline_input_schema,
    merge_run_input,
    validate_binding_references,
)
from dagwerk.topology import RunTopology


class UrlPlugin:
    def get_effective_inputs(self) -> list[PluginInputMeta]:
        return [
            PluginInputMeta(
                name="url",
                description="URL",
                source="runtime",
                required=True,
                placeholder="https://",
                default="https://example.test",
            ),
            PluginInputMeta(name="mode", description="Mode", source="config"),
        ]


class TokenPlugin:
    def get_effective_inputs(self) -> list[PluginInputMeta]:
        return [
            PluginInputMeta(name="url", description="Other URL", source="runtime"),
            PluginInputMeta(name="token", description="Token", source="runtime"),
        ]


def no_plugins(_name: str) -> PluginMeta | None:
    return None


# --- RI-04 -----------------------------------------------------------------


def test_ri_04_a_plugin_needs_only_get_effective_inputs() -> None:
    class Minimal:
        def get_effective_inputs(self) -> list[PluginInputMeta]:
            return []

    class NotAPlugin:
        def inputs(self) -> list[PluginInputMeta]:
            return []

    assert isinstance(Minimal(), PluginMeta)
    assert not isinstance(NotAPlugin(), PluginMeta)


def test_ri_04_plugin_input_name_and_source_are_required() -> None:
    with pytest.raises(ValueError, match="name must not be empty") as info:
        PluginInputMeta(name="", description="Missing", source="runtime")
    assert isinstance(info.value, PluginMetadataError)
    assert isinstance(info.value, DagwerkError)
    with pytest.raises(ValueError, match="source must not be empty"):
        PluginInputMeta(name="x", description="Missing", source="")


def test_ri_04_plugin_and_schema_defaults_are_frozen_json() -> None:
    raw: dict[str, Any] = {"values": [1, 2]}
    metadata = PluginInputMeta(name="options", description="Options", source="runtime", default=raw)
    field = InputFieldSpec(name="options", label="Options", default=raw)
    raw["values"].append(3)

    for default in (metadata.default, field.default):
        assert isinstance(default, FrozenDict)
        assert default["values"] == (1, 2)

    with pytest.raises(ValueError, match="not JSON-compatible"):
        PluginInputMeta(name="cb", description="Callback", source="runtime", default=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not JSON-compatible"):
        InputFieldSpec(name="cb", label="Callback", default=float("nan"))
    with pytest.raises(ValueError, match="name must not be empty"):
        InputFieldSpec(name="", label="Nothing")


# --- RI-01 -----------------------------------------------------------------


def test_ri_01_plugin_inputs_come_first_then_bindings_then_expression_inputs() -> None:
    node = DagNode(
        slug="root",
        plugin="fetch",
        bindings={
            "item_count": RuntimeSource(key="count", default=3),
            "labelled": RuntimeSource(key="region", label="Region code", required=True),
            "computed": ExpressionSource(expression="{input.zeta}-{input.alpha}-{input.count}"),
        },
    )
    fields = get_pipeline_input_schema([node], lambda _name: UrlPlugin())
    assert [(f.name, f.label, f.default, f.required) for f in fields] == [
        ("url", "URL", "https://example.test", True),
        ("count", "Item Count", 3, False),
        ("region", "Region code", None, True),
        ("alpha", "Alpha", None, False),
        ("zeta", "Zeta", None, False),
    ]
    assert fields[0].placeholder == "https://"


def test_ri_01_the_first_declaration_of_a_name_wins_across_nodes() -> None:
    plugins: dict[str, PluginMeta] = {"a": UrlPlugin(), "b": TokenPlugin()}
    nodes = [
        DagNode(slug="one", plugin="a"),
        DagNode(slug="two", plugin="b", bindings={"t": RuntimeSource(key="token", default="x")}),
        DagNode(slug="three", plugin="unknown"),
    ]
    fields = get_pipeline_input_schema(nodes, plugins.get)
    assert [(f.name, f.label) for f in fields] == [("url", "URL"), ("token", "Token")]
    assert fields[1].default is None  # the plugin's declaration, not the binding's


def test_ri_01_when_clauses_contribute_input_fields() -> None:
    node = DagNode(
        slug="root",
        plugin="p",
        bindings={"value": LiteralSource(value="on", when="{input.feature_enabled}")},
    )
    assert get_pipeline_input_schema([node], no_plugins) == [
        InputFieldSpec(name="feature_enabled", label="Feature Enabled")
    ]

    duplicate = DagNode(
        slug="root",
        plugin="p",
        bindings={"url": RuntimeSource(key="url", when="{input.use_default_url}")},
    )
    fields = get_pipeline_input_schema([duplicate], lambda _name: UrlPlugin())
    assert [f.name for f in fields] == ["url", "use_default_url"]


@pytest.mark.parametrize(
    ("expression", "message"),
    [("{input.}", "key cannot be empty"), ("{list(.value)}", "namespace cannot be empty")],
)
def test_ri_01_expression_syntax_errors_raise(expression: str, message: str) -> None:
    node = DagNode(slug="root", plugin="p", bindings={"v": ExpressionSource(expression=expression)})
    with pytest.raises(ExpressionError, match=message):
        get_pipeline_input_schema([node], no_plugins)


def test_ri_01_schema_accepts_topology_nodes() -> None:
    node = DagNode(slug="root", plugin="p", bindings={"k": RuntimeSource(key="k")})
    fields = get_pipeline_input_schema(list(RunTopology.build([node]).nodes), no_plugins)
    assert [f.name for f in fields] == ["k"]


# --- RI-02 -----------------------------------------------------------------


def test_ri_02_merge_precedence_and_required_values() -> None:
    fields = [
        InputFieldSpec("count", "Count", required=True, default=1),
        InputFieldSpec("enabled", "Enabled", required=True, default=True),
    ]
    assert merge_run_input(
        fields, {"count": 2, "enabled": True}, {"count": 3, "enabled": False, "extra": "kept"}
    ) == {"count": 3, "enabled": False, "extra": "kept"}
    assert merge_run_input(
        fields, {"count": 2, "enabled": True}, {"count": "", "enabled": None}
    ) == {
        "count": 2,
        "enabled": True,
    }
    assert merge_run_input(fields, {}, {}) == {"count": 1, "enabled": True}
    assert merge_run_input([InputFieldSpec("n", "N", required=True)], {}, {"n": 0}) == {"n": 0}


def test_ri_02_schema_defaults_that_are_empty_are_not_merged() -> None:
    fields = [InputFieldSpec("a", "A", default=""), InputFieldSpec("b", "B", default=0)]
    assert merge_run_input(fields, {}, {}) == {"b": 0}


def test_ri_02_missing_required_input_names_every_label() -> None:
    fields = [
        InputFieldSpec("x", "The X", required=True),
        InputFieldSpec("y", "", required=True, default=""),
        InputFieldSpec("z", "Z"),
    ]
    with pytest.raises(ValueError, match="missing required input: The X, y") as info:
        merge_run_input(fields, {}, {"x": ""})
    assert isinstance(info.value, RunInputError)
    assert info.value.code == "missing_required_input"
    assert info.value.field == "x, y"


@pytest.mark.parametrize("pipeline_default", [None, ""])
def test_ri_02_pipeline_defaults_override_schema_defaults_even_when_empty(
    pipeline_default: object,
) -> None:
    merged = merge_run_input(
        [InputFieldSpec("value", "Value", default="schema")],
        {"value": pipeline_default},
        {"value": None},
    )
    assert merged["value"] == pipeline_default


def test_ri_02_merge_validates_and_freezes_run_input() -> None:
    defaults: dict[str, Any] = {"options": {"values": [1, 2]}}
    supplied: dict[str, Any] = {"labels": ["one", "two"]}
    merged = merge_run_input([], defaults, supplied)
    assert isinstance(merged, FrozenDict)
    assert isinstance(merged["options"], FrozenDict)
    assert merged["labels"] == ("one", "two")

    defaults["options"]["values"].append(3)
    supplied["labels"].append("three")
    assert merged == {"options": {"values": (1, 2)}, "labels": ("one", "two")}
    with pytest.raises(TypeError):
        merged["added"] = True

    with pytest.raises(ValueError, match="not JSON-compatible") as info:
        merge_run_input([], {}, {"callback": object()})
    assert info.value.field == "callback"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="keys must be strings"):
        merge_run_input([], {}, {1: "x"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="JSON object"):
        merge_run_input([], {}, ["not", "a", "mapping"])  # type: ignore[arg-type]


def test_ri_02_the_merged_object_obeys_whole_value_json_limits() -> None:
    # Each value alone is fine; together they exceed 512 object keys.
    supplied = {f"k{i}": {"a": 1} for i in range(300)}
    with pytest.raises(RunInputError, match="JSON limit"):
        merge_run_input([], {}, supplied)


def test_ri_02_run_input_size_boundary_is_exact() -> None:
    envelope = len(canonical_json_bytes({"payload": ""}))
    payload = "x" * (MAX_RUN_INPUT_BYTES - envelope)
    assert merge_run_input([], {}, {"payload": payload})["payload"] == payload
    with pytest.raises(ValueError, match="run input exceeds the 262144-byte limit") as info:
        merge_run_input([], {}, {"payload": payload + "x"})
    assert isinstance(info.value, RunInputError)
    assert (info.value.code, info.value.limit) == ("run_input_too_large", MAX_RUN_INPUT_BYTES)


def test_ri_02_the_size_limit_is_a_keyword_setting() -> None:
    assert merge_run_input([], {}, {"a": "xy"}, max_bytes=10) == {"a": "xy"}  # {"a":"xy"}
    with pytest.raises(RunInputError, match="9-byte limit"):
        merge_run_input([], {}, {"a": "xy"}, max_bytes=9)


# --- RI-03 -----------------------------------------------------------------


def records_consumer(**bindings: Any) -> list[DagNode]:
    return [
        DagNode(slug="root", plugin="p"),
        DagNode(
            slug="child",
            name="Child step",
            plugin="p",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="records", source="root"),),
            bindings=bindings,
        ),
    ]


def test_ri_03_binding_validation_uses_edge_names() -> None:
    nodes = records_consumer(
        title=EdgeSource(edge="records", field="title"),
        slug=ExpressionSource(expression="{records.title | lower}-{input.suffix}"),
    )
    assert validate_binding_references(nodes) is None

    bad = records_consumer(title=EdgeSource(edge="root", field="title"))
    error = validate_binding_references(bad)
    assert error == "Child step: binding 'title' references unknown edge 'root'"


def test_ri_03_messages_use_node_n_without_a_name() -> None:
    node = DagNode(slug="child", plugin="p", bindings={"x": ExpressionSource(expression="{g.x}")})
    error = validate_binding_references([DagNode(slug="a", plugin="p"), node])
    assert error is not None
    assert error.startswith("Node 2: ")
    assert "unknown edges ['g']" in error


@pytest.mark.parametrize(
    "binding",
    [
        ExpressionSource(expression="{records.value | unknown}"),
        LiteralSource(value=True, when="{records.value"),
    ],
)
def test_ri_03_malformed_expression_and_when_are_reported(binding: Any) -> None:
    error = validate_binding_references(records_consumer(value=binding))
    assert error is not None
    assert error.startswith("Child step: binding 'value'")
    assert "error" in error


def test_ri_03_the_binding_step_budget_is_reported() -> None:
    bindings = {f"v{i}": ExpressionSource(expression=f"{{input.v{i}}}") for i in range(33)}
    error = validate_binding_references([DagNode(slug="r", plugin="p", bindings=bindings)])
    assert error == "Node 1: bindings require 66 evaluations; maximum is 64"
    assert (
        validate_binding_references(
            [DagNode(slug="r", plugin="p", bindings=bindings)], max_evaluations=66
        )
        is None
    )


def test_ri_03_malformed_raw_bindings_are_reported_as_text() -> None:
    node = DagNode(slug="r", plugin="p")
    node.bindings["v"] = {"source": "literal", "bogus": 1}  # type: ignore[assignment]
    error = validate_binding_references([node])
    assert error is not None
    assert error.startswith("Node 1: invalid bindings.v.bogus")
