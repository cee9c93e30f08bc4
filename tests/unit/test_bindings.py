"""Binding resolution: edge fields, literals, runtime input, secrets, expressions (BD)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

import pytest

import dagwerk.bindings as bindings_module
from dagwerk.bindings import (
    PlanBindingResolver,
    binding_evaluation_steps,
    build_expression_lookup,
    extract_edge_field,
    resolve_plan_bindings,
)
from dagwerk.constants import InputMode, InputRole, NodeDisposition
from dagwerk.errors import ExpressionError, PlanningError
from dagwerk.expressions import EvaluationBudget
from dagwerk.json import FrozenDict
from dagwerk.models import (
    DagNode,
    EdgeSource,
    ExpressionSource,
    InputEdge,
    LiteralSource,
    OutputRef,
    PlanningSnapshot,
    RuntimeSource,
    SecretSource,
)
from dagwerk.planning import construct_task_plans


def out(output_id: str, **fields: object) -> OutputRef:
    return OutputRef(id=output_id, fields=fields, correlation_id=output_id)


def node(bindings: dict[str, object], *, edges: tuple[str, ...] = ("items",)) -> DagNode:
    return DagNode(
        slug="consume",
        plugin="consume",
        input_mode=InputMode.ALL if edges else None,
        edges=tuple(InputEdge(name=name, source="scan") for name in edges),
        bindings=bindings,
    )


def resolve(
    bindings: dict[str, object],
    outputs: dict[str, tuple[OutputRef, ...]] | None = None,
    runtime: dict[str, object] | None = None,
    *,
    base: dict[str, object] | None = None,
    budget: EvaluationBudget | None = None,
) -> tuple[FrozenDict, Mapping[str, str]]:
    edges = tuple(outputs) if outputs else ("items",)
    return resolve_plan_bindings(
        node(bindings, edges=edges),
        outputs or {"items": ()},
        FrozenDict(runtime or {}),
        base_parameters=FrozenDict(base) if base is not None else None,
        evaluation_budget=budget,
    )


# --- BD-01 ------------------------------------------------------------------


def test_bd_01_edge_field_is_none_one_value_or_an_ordered_tuple() -> None:
    """BD-01: no output has the field → None; one → its value; several → a tuple."""
    a = out("a", title="first", nested={"k": [1, 2]})
    b = out("b", other=1)
    c = out("c", title=None)
    d = out("d", title=3)
    assert extract_edge_field((), "title") is None
    assert extract_edge_field((b,), "title") is None
    assert extract_edge_field((a, b), "title") == "first"
    # Outputs without the field are skipped; a present null is a value.
    assert extract_edge_field((a, b, c, d), "title") == ("first", None, 3)
    assert extract_edge_field((d, a), "title") == (3, "first")
    nested = extract_edge_field((a,), "nested")
    assert isinstance(nested, FrozenDict)
    assert nested == {"k": (1, 2)}


def test_bd_01_edge_binding_reads_the_outputs_of_this_plan() -> None:
    """BD-01: an edge binding resolves against the outputs given for the plan."""
    parameters, secrets = resolve(
        {
            "title": EdgeSource(edge="items", field="title"),
            "n": EdgeSource(edge="items", field="n"),
        },
        {"items": (out("a", title="x", n=1), out("b", n=2))},
    )
    assert parameters == {"title": "x", "n": (1, 2)}
    assert dict(secrets) == {}


# --- BD-02 / BD-04 ------------------------------------------------------------


def test_bd_02_bd_04_dynamic_null_removes_but_literal_null_remains() -> None:
    """BD-02/BD-04: literal null is stored; edge, runtime and expression null remove."""
    parameters, _ = resolve(
        {
            "literal": LiteralSource(value=None),
            "edge": EdgeSource(edge="items", field="missing"),
            "runtime": RuntimeSource(key="missing"),
            "expression": ExpressionSource(expression="{items.missing}"),
        },
        {"items": (out("a", title="x"),)},
        base={"literal": 1, "edge": 2, "runtime": 3, "expression": 4, "kept": 5},
    )
    assert dict(parameters) == {"literal": None, "kept": 5}


# --- BD-03 ------------------------------------------------------------------


@pytest.mark.parametrize("runtime", [{}, {"key": None}, {"key": ""}])
def test_bd_03_required_runtime_input_rejects_missing_null_and_empty(
    runtime: dict[str, object],
) -> None:
    """BD-03: a required runtime value that is null or "" is a planning error."""
    with pytest.raises(PlanningError, match="required runtime input 'key' is missing"):
        resolve({"value": RuntimeSource(key="key", required=True)}, runtime=runtime)


@pytest.mark.parametrize("value", [0, False, "0", [], {}])
def test_bd_03_required_runtime_input_accepts_falsy_values(value: object) -> None:
    """BD-03: 0 and false (and other non-empty falsy values) satisfy `required`."""
    parameters, _ = resolve(
        {"value": RuntimeSource(key="key", required=True)}, runtime={"key": value}
    )
    assert parameters["value"] == FrozenDict({"v": value})["v"]


@pytest.mark.parametrize("default", [0, False])
def test_bd_03_runtime_defaults_preserve_zero_and_false(default: object) -> None:
    """BD-03: an absent key takes the default, and a falsy default satisfies `required`."""
    parameters, _ = resolve({"value": RuntimeSource(key="key", required=True, default=default)})
    assert parameters["value"] is default


def test_bd_03_present_null_is_used_instead_of_the_default() -> None:
    """BD-03: a key present with null does not fall back to the default."""
    parameters, _ = resolve(
        {"value": RuntimeSource(key="key", default="fallback")}, runtime={"key": None}
    )
    assert "value" not in parameters
    parameters, _ = resolve({"value": RuntimeSource(key="key", default="fallback")})
    assert parameters["value"] == "fallback"


# --- BD-05 ------------------------------------------------------------------


def test_bd_05_secret_records_a_reference_and_removes_the_base_parameter() -> None:
    """BD-05: a secret stores only its reference name, never a value."""
    parameters, secrets = resolve(
        {"token": SecretSource(name="vault/token"), "plain": LiteralSource(value=1)},
        base={"token": "leaked", "other": True},
    )
    assert dict(parameters) == {"other": True, "plain": 1}
    assert isinstance(secrets, MappingProxyType)
    assert dict(secrets) == {"token": "vault/token"}


def test_bd_05_inactive_secret_keeps_the_base_parameter() -> None:
    """BD-05/BD-06: a secret whose `when` is false changes nothing."""
    parameters, secrets = resolve(
        {"token": SecretSource(name="vault/token", when="{input.enabled}")},
        runtime={"enabled": False},
        base={"token": "base"},
    )
    assert dict(parameters) == {"token": "base"}
    assert dict(secrets) == {}


# --- BD-06 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "active"),
    [
        ("", False),
        (0, False),
        (False, False),
        (None, False),
        ([], False),
        ({}, False),
        ("false", True),
        ("0", True),
        (1, True),
        ([0], True),
    ],
)
def test_bd_06_when_uses_python_truth_value_testing(flag: object, active: bool) -> None:
    """BD-06: a binding is active iff its `when` result is truthy in Python."""
    parameters, _ = resolve(
        {"value": LiteralSource(value="set", when="{input.flag}")},
        runtime={"flag": flag},
        base={"value": "base"},
    )
    assert parameters["value"] == ("set" if active else "base")


def test_bd_06_when_reads_edges_and_the_not_pipe() -> None:
    """BD-06: `when` can use edge fields and pipes like `not`."""
    parameters, _ = resolve(
        {
            "on": LiteralSource(value=1, when="{items.ready}"),
            "off": LiteralSource(value=2, when="{items.ready | not}"),
        },
        {"items": (out("a", ready=True),)},
    )
    assert dict(parameters) == {"on": 1}


def test_bd_06_when_errors_are_not_treated_as_false() -> None:
    """BD-06: an error inside `when` propagates instead of disabling the binding."""
    with pytest.raises(ExpressionError, match="Required value is missing"):
        resolve({"value": LiteralSource(value=1, when="{input.missing | required}")})


# --- BD-07 ------------------------------------------------------------------


def test_bd_07_root_base_parameters_are_replaced_only_by_active_bindings() -> None:
    """BD-07: base parameters survive until an active binding of the same name."""
    parameters, _ = resolve(
        {
            "replaced": RuntimeSource(key="source"),
            "inactive": LiteralSource(value="no", when="{input.off}"),
        },
        runtime={"source": "s", "off": False},
        base={"replaced": "old", "inactive": "kept", "other": [1]},
    )
    assert dict(parameters) == {"replaced": "s", "inactive": "kept", "other": (1,)}


# --- BD-08 ------------------------------------------------------------------


@pytest.mark.parametrize("bad", [object(), math.nan, {1: "x"}])
def test_bd_08_non_json_values_are_planning_errors(bad: object) -> None:
    """BD-08: a value that cannot be frozen as JSON names the parameter."""
    message = "parameter 'x' did not resolve to JSON-compatible data"
    with pytest.raises(PlanningError, match=message):
        resolve_plan_bindings(
            node({"x": RuntimeSource(key="k")}),
            {"items": ()},
            {"k": bad},  # type: ignore[dict-item]
        )


def test_bd_08_stored_parameters_are_frozen() -> None:
    """BD-08: arrays become tuples and objects become FrozenDicts."""
    parameters, _ = resolve(
        {"list": ExpressionSource(expression="{list(input.a, input.b)}")},
        runtime={"a": 1, "b": {"k": [2]}},
    )
    value = parameters["list"]
    assert value == (1, FrozenDict({"k": [2]}))
    assert isinstance(value, tuple)
    assert isinstance(value[1], FrozenDict)


# --- BD-09 ------------------------------------------------------------------


def test_bd_09_budget_charges_lookups_and_final_values_but_not_literals_or_secrets() -> None:
    """BD-09: a 3-char string via an expression costs 5 (lookup) + 5 (value) bytes."""
    budget = EvaluationBudget(10)
    resolve(
        {
            "value": ExpressionSource(expression="{items.value}"),
            "literal": LiteralSource(value="x" * 100),
            "secret": SecretSource(name="s"),
        },
        {"items": (out("a", value="abc"),)},
        budget=budget,
    )
    assert budget.used == 10
    with pytest.raises(ExpressionError, match="10-byte launch limit"):
        resolve(
            {"value": ExpressionSource(expression="{items.value}")},
            {"items": (out("a", value="abc"),)},
            budget=budget,
        )


def test_bd_09_edge_and_runtime_values_are_charged_once() -> None:
    """BD-09: edge and runtime bindings charge their final value."""
    budget = EvaluationBudget(100)
    resolve(
        {"e": EdgeSource(edge="items", field="v"), "r": RuntimeSource(key="k")},
        {"items": (out("a", v=[1, 2]),)},
        runtime={"k": "xy"},
        budget=budget,
    )
    assert budget.used == len("[1,2]") + len('"xy"')


# --- BD-10 ------------------------------------------------------------------


def test_bd_10_field_extraction_is_shared_across_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """BD-10: a side edge broadcast to every EACH plan is extracted once per field."""
    calls: list[str] = []
    real = bindings_module.extract_edge_field

    def counted(outputs: tuple[OutputRef, ...], field: str) -> object:
        calls.append(field)
        return real(outputs, field)

    monkeypatch.setattr(bindings_module, "extract_edge_field", counted)
    consumer = DagNode(
        slug="consume",
        plugin="consume",
        input_mode=InputMode.EACH,
        edges=(
            InputEdge(name="items", source="scan"),
            InputEdge(name="settings", source="cfg", role=InputRole.SIDE, required=False),
        ),
        bindings={
            "a": ExpressionSource(expression="{settings.value}"),
            "b": EdgeSource(edge="settings", field="value"),
            "c": ExpressionSource(expression="{settings.missing}"),
        },
    )
    result = construct_task_plans(
        consumer,
        source_indices={"items": 0, "settings": 1},
        snapshot=PlanningSnapshot(
            token="t",
            generation=0,
            outputs_by_edge={
                "items": tuple(out(f"i{n}") for n in range(5)),
                "settings": (out("s1", value=1), out("s2", value=2)),
            },
            source_dispositions={
                "items": NodeDisposition.LAUNCHED,
                "settings": NodeDisposition.LAUNCHED,
            },
            runtime_inputs={},
        ),
    )
    assert result.disposition == NodeDisposition.LAUNCHED, result.error
    assert len(result.plans) == 5
    assert all(plan.parameters == {"a": (1, 2), "b": (1, 2)} for plan in result.plans)
    assert sorted(calls) == ["missing", "value"]


def test_bd_10_field_cache_checks_identity_not_only_the_id() -> None:
    """BD-10: a cache entry is reused only for the very same output tuple."""
    cache: dict[tuple[str, str, int], tuple[object, object]] = {}
    first = (out("a", v=1), out("b", v=2))
    lookup = build_expression_lookup({"items": first}, {}, field_cache=cache)  # type: ignore[arg-type]
    assert lookup("items", "v") == (1, 2)
    # Poison the entry as if a recycled id pointed at other outputs.
    key = ("items", "v", id(first))
    cache[key] = ((), "stale")
    assert lookup("items", "v") == (1, 2)


# --- BD-11 and the lookup ---------------------------------------------------


def test_bd_11_plans_store_resolved_values_not_expressions() -> None:
    """BD-11: the plan holds the evaluated result; workers never re-evaluate it."""
    parameters, _ = resolve(
        {"title": ExpressionSource(expression="{items.title | upper}-{input.n}")},
        {"items": (out("a", title="doc"),)},
        runtime={"n": 7},
    )
    assert parameters["title"] == "DOC-7"


def test_lookup_reads_input_edges_and_returns_none_for_unknown() -> None:
    lookup = build_expression_lookup({"items": (out("a", v=1),)}, FrozenDict({"k": "x"}))
    assert lookup("input", "k") == "x"
    assert lookup("input", "missing") is None
    assert lookup("items", "v") == 1
    assert lookup("items", "missing") is None
    assert lookup("unknown", "v") is None


def test_lm_07_binding_evaluation_steps_count_bindings_expressions_and_when() -> None:
    """LM-07: bindings + expression steps + `when` steps."""
    counted = node(
        {
            "a": LiteralSource(value=1),
            "b": ExpressionSource(expression="{items.x | upper | trim}"),
            "c": EdgeSource(edge="items", field="x", when="{input.flag}"),
            "d": ExpressionSource(expression="{list(input.a, input.b)}"),
        }
    )
    assert binding_evaluation_steps(counted) == 4 + 3 + 1 + 2


def test_resolver_serves_several_plans_with_one_budget() -> None:
    """The launch resolver shares its budget across the plans it resolves."""
    budget = EvaluationBudget(1_000)
    resolver = PlanBindingResolver(
        node({"v": EdgeSource(edge="items", field="v")}), FrozenDict(), evaluation_budget=budget
    )
    for n in range(3):
        parameters, _ = resolver.resolve({"items": (out("a", v=n),)})
        assert parameters == {"v": n}
    assert budget.used == 3


@pytest.mark.parametrize(
    "values",
    [{"a": 1}, {"b": True, "c": 1.5, "d": "x"}, {"n": [1]}, {"o": {"k": {}}}],
)
def test_stored_parameters_carry_the_same_json_counts_as_a_fresh_freeze(
    values: dict[str, object],
) -> None:
    """BD-08: the fast freeze of scalar parameters records the same limits state."""
    bindings = {name: RuntimeSource(key=name) for name in values}
    parameters, _ = resolve(bindings, runtime=values)  # type: ignore[arg-type]
    fresh = FrozenDict(values)
    assert parameters == fresh
    for slot in ("_keys", "_values", "_depth"):
        assert getattr(parameters, slot) == getattr(fresh, slot)
