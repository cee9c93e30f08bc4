"""Hostile pipeline definitions and filters.

``DagNode`` built from arbitrary dicts (or a valid pipeline mutated at
random) gives a node or ``pydantic.ValidationError`` (the documented model
validation); ``validate_graph`` and ``RunTopology.build`` then give a result
or ``GraphValidationError``. Filters and selections over arbitrary rules and
output fields give a result or ``PlanningError``.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagwerk.constants import FilterOperator
from dagwerk.errors import DagwerkError, GraphValidationError, PlanningError
from dagwerk.filter import apply_filter, apply_selection
from dagwerk.graph import validate_graph
from dagwerk.models import DagNode, EdgeFilter, FilterRule, OutputRef, Selection
from dagwerk.topology import RunTopology

from .conftest import (
    FUZZ,
    HUGE_INT,
    TEN_MB,
    Rejected,
    bounded,
    deep_list,
    hostile_json,
    hostile_text,
)

VALID: list[dict[str, Any]] = [
    {"slug": "src", "plugin": "p"},
    {
        "slug": "each",
        "plugin": "p",
        "input_mode": "each",
        "edges": [
            {
                "name": "rows",
                "source": "src",
                "filter": {"rules": [{"field": "kind", "operator": "eq", "value": "a"}]},
            }
        ],
        "bindings": {
            "title": {"source": "expression", "expression": "{rows.title | trim}"},
            "n": {"source": "runtime", "key": "n", "default": 3},
        },
    },
    {
        "slug": "all",
        "plugin": "p",
        "input_mode": "all",
        "edges": [{"name": "items", "source": "each", "selection": {"field": "score"}}],
        "bindings": {"x": {"source": "edge", "edge": "items", "field": "score"}},
    },
]

_KEYS = st.sampled_from(
    [
        "slug",
        "plugin",
        "name",
        "edges",
        "bindings",
        "input_mode",
        "correlation_mode",
        "source",
        "field",
        "operator",
        "value",
        "rules",
        "filter",
        "selection",
        "expression",
        "when",
        "key",
        "edge",
        "role",
        "required",
        "order",
        "limit",
        "default",
    ]
)
_NASTY: st.SearchStrategy[str] = st.sampled_from(
    [
        "",
        "\x00",
        "src",
        "each",
        "all",
        "input",
        "\ud800",
        "x" * 600,
        "each",
        "all",
        "by_correlation",
        "inherit",
        "new",
        "{rows.title}",
        "{",
        None,
        -1,
        0,
        2**64,
        True,
        [],
        {},
    ]
)


def _mutate(data: Any, path: list[Any], value: Any) -> Any:
    """Replace (or insert) the item at ``path`` inside a copy of ``data``."""
    result = copy.deepcopy(data)
    target = result
    for step in path[:-1]:
        if (isinstance(target, dict) and step in target) or (
            isinstance(target, list)
            and isinstance(step, int)
            and -len(target) <= step < len(target)
        ):
            target = target[step]
        else:
            break
    last = path[-1] if path else "slug"
    if isinstance(target, dict):
        target[last] = value
    elif isinstance(target, list) and target and isinstance(last, int):
        target[last % len(target)] = value
    return result


def _check_pipeline(raw_nodes: list[Any]) -> None:
    nodes: list[DagNode] = []
    for raw in raw_nodes:
        node = bounded(partial(DagNode.model_validate, raw))
        if isinstance(node, Rejected):
            assert isinstance(node.error, pydantic.ValidationError)
            return
        nodes.append(node)
    before = [node.model_dump() for node in nodes]
    for call in (lambda: validate_graph(nodes), lambda: RunTopology.build(nodes)):
        outcome = bounded(call)
        if isinstance(outcome, Rejected):
            assert isinstance(outcome.error, GraphValidationError)
    # Validation never mutates its input.
    assert [node.model_dump() for node in nodes] == before


@FUZZ
@given(
    index=st.integers(0, len(VALID) - 1),
    path=st.lists(st.one_of(_KEYS, st.integers(-2, 2)), min_size=1, max_size=5),
    value=_NASTY | hostile_json,
)
def test_mutated_valid_pipeline_gives_documented_errors(
    index: int, path: list[Any], value: Any
) -> None:
    nodes = list(VALID)
    nodes[index] = _mutate(VALID[index], path, value)
    _check_pipeline(nodes)


_NODE_DICT = st.dictionaries(
    _KEYS,
    _NASTY
    | hostile_json
    | st.lists(st.dictionaries(_KEYS, _NASTY | hostile_json, max_size=4), max_size=2),
    max_size=6,
)


@FUZZ
@given(raw=st.lists(_NODE_DICT | hostile_json, max_size=3))
def test_arbitrary_dicts_as_nodes_give_documented_errors(raw: list[Any]) -> None:
    _check_pipeline(raw)


@pytest.mark.parametrize(
    "mutation",
    [
        {"slug": "a\x00b"},
        {"plugin": "p\x00"},
        {"slug": "\ud800"},
        {"slug": TEN_MB},
        {"name": TEN_MB},
        {"bindings": {"x": {"source": "literal", "value": deep_list(100_000)}}},
        {"bindings": {"x": {"source": "literal", "value": HUGE_INT}}},
        {"bindings": {"x": {"source": "literal", "value": float("nan")}}},
        {"bindings": {"x": {"source": "expression", "expression": "{input.a}" * 1_200_000}}},
        {"bindings": {"x": {"source": "expression", "expression": "{input.\ud800}"}}},
        {"bindings": {"\x00": {"source": "secret", "name": "\x00"}}},
        {"bindings": {f"b{i}": {"source": "literal", "value": i} for i in range(1_000)}},
        {"edges": [{"name": "e" * 1_000_000, "source": "src"}], "input_mode": "each"},
        {"edges": [{"name": "e", "source": "src\x00"}], "input_mode": "each"},
        {"edges": [{"name": "e", "source": "src"}] * 1_000, "input_mode": "each"},
    ],
    ids=lambda mutation: next(iter(mutation)),
)
def test_extreme_node_definitions_give_documented_errors(mutation: dict[str, Any]) -> None:
    raw = [VALID[0], {"slug": "n", "plugin": "p", **mutation}]
    _check_pipeline(raw)


def test_deep_chain_of_nodes_is_validated_without_recursion() -> None:
    nodes = [DagNode(slug="n0", plugin="p")] + [
        DagNode(
            slug=f"n{i}",
            plugin="p",
            input_mode="each",
            edges=({"name": "up", "source": f"n{i - 1}"},),
        )
        for i in range(1, 3_000)
    ]
    outcome = bounded(lambda: RunTopology.build(nodes))
    assert not isinstance(outcome, Rejected)
    cyclic = [
        *nodes[1:],
        DagNode(
            slug="n0", plugin="p", input_mode="each", edges=({"name": "up", "source": "n2999"},)
        ),
    ]
    refused = bounded(lambda: validate_graph(cyclic))
    assert isinstance(refused, Rejected)
    assert isinstance(refused.error, GraphValidationError)


# --- filters and selection ---------------------------------------------------------------

_FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.sampled_from(
        [10**4000, -(10**4000), "1e999999999", "NaN", "-0", "\x00", "Infinity", "9" * 5_000, -0.0]
    ),
    st.lists(st.integers() | st.text(max_size=3), max_size=3),
)


def _rule(field: str, operator: str, value: object) -> FilterRule | Rejected:
    return bounded(lambda: FilterRule(field=field, operator=operator, value=value))


@FUZZ
@given(
    rules=st.lists(
        st.tuples(
            hostile_text | st.just("f"),
            st.sampled_from([*FilterOperator, "bogus"]),
            hostile_json | _FIELD_VALUES,
        ),
        max_size=4,
    ),
    fields=st.lists(
        st.dictionaries(st.just("f") | hostile_text, _FIELD_VALUES, max_size=3), max_size=5
    ),
    selection=st.none()
    | st.tuples(st.just("f") | hostile_text, st.sampled_from(["asc", "desc"]), st.integers(-1, 4)),
)
def test_filters_and_selection_give_documented_errors(
    rules: list[tuple[str, str, object]],
    fields: list[dict[str, object]],
    selection: tuple[str, str, int] | None,
) -> None:
    built = [_rule(*rule) for rule in rules]
    valid_rules = tuple(rule for rule in built if isinstance(rule, FilterRule))
    outputs: list[OutputRef] = []
    for index, item in enumerate(fields):
        output = bounded(partial(OutputRef, id=f"o{index}", fields=item))
        if isinstance(output, OutputRef):
            outputs.append(output)
    kept = bounded(lambda: apply_filter(outputs, EdgeFilter(rules=valid_rules)))
    if isinstance(kept, Rejected):
        assert isinstance(kept.error, PlanningError)
        return
    assert all(output in outputs for output in kept)
    if selection is not None:
        chosen = bounded(
            lambda: Selection(field=selection[0], order=selection[1], limit=selection[2])
        )
        if isinstance(chosen, Selection):
            picked = bounded(lambda: apply_selection(kept, chosen))
            if isinstance(picked, Rejected):
                assert isinstance(picked.error, PlanningError)
            else:
                assert len(picked) <= chosen.limit


def _filter_by(outputs: list[OutputRef], operator: str, value: object) -> list[OutputRef]:
    rule = FilterRule.model_validate({"field": "f", "operator": operator, "value": value})
    return list(apply_filter(outputs, EdgeFilter(rules=(rule,))))


def test_huge_numbers_compare_exactly_and_fast() -> None:
    outputs = [
        OutputRef(id="big", fields={"f": 10**4000}),
        OutputRef(id="text", fields={"f": "1e999999999"}),
        OutputRef(id="nul", fields={"f": "\x00"}),
    ]
    for operator in ("gt", "gte", "lt", "lte", "eq", "contains", "starts_with", "in"):
        for value in (HUGE_INT, "1e-999999999", "9" * 100_000, "\x00", -0.0):
            outcome = bounded(partial(_filter_by, outputs, operator, value))
            assert not isinstance(outcome, Rejected) or isinstance(outcome.error, DagwerkError)
    kept = apply_filter(
        outputs, EdgeFilter(rules=(FilterRule(field="f", operator="gt", value=HUGE_INT),))
    )
    assert [output.id for output in kept] == ["text"]
