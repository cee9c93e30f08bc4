"""Edge filters and selection (contracts FS-01 to FS-10).

Example tests pin each contract; the Hypothesis properties at the end compare
``apply_filter`` and ``apply_selection`` with a deliberately naive reference
model written here from the contract text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagwerk.constants import (
    MAX_FILTER_MEMBERSHIP_VALUES,
    MAX_FILTER_RULES_PER_EDGE,
    FilterOperator,
    SortOrder,
)
from dagwerk.errors import PlanningError
from dagwerk.filter import apply_filter, apply_selection
from dagwerk.models import EdgeFilter, FilterRule, OutputRef, Selection

Op = FilterOperator


def _output(output_id: str, **fields: object) -> OutputRef:
    return OutputRef(id=output_id, fields=fields)


def _one_rule(operator: FilterOperator, value: object = None, field: str = "value") -> EdgeFilter:
    return EdgeFilter(rules=(FilterRule(field=field, operator=operator, value=value),))


def _matches(operator: FilterOperator, actual: object, expected: object) -> bool:
    kept = apply_filter((_output("one", value=actual),), _one_rule(operator, expected))
    return len(kept) == 1


def _ids(outputs: Sequence[OutputRef]) -> list[str]:
    return [output.id for output in outputs]


# --- FS-01 ------------------------------------------------------------------


def test_fs_01_rules_are_conjoined_and_source_order_is_kept() -> None:
    outputs = (
        _output("first", enabled=True, score=3),
        _output("second", enabled=False, score=5),
        _output("third", enabled=True, score=4),
        _output("fourth", enabled=True, score=9),
    )
    edge_filter = EdgeFilter(
        rules=(
            FilterRule(field="enabled", operator=Op.EQ, value=True),
            FilterRule(field="score", operator=Op.GT, value=3),
        )
    )
    assert _ids(apply_filter(outputs, edge_filter)) == ["third", "fourth"]
    # Each rule alone keeps more: the result is their intersection.
    assert _ids(apply_filter(outputs, EdgeFilter(rules=edge_filter.rules[:1]))) == [
        "first",
        "third",
        "fourth",
    ]


def test_fs_01_no_filter_or_no_rules_keeps_everything_in_order() -> None:
    outputs = [_output("b"), _output("a"), _output("c")]
    assert _ids(apply_filter(outputs, None)) == ["b", "a", "c"]
    assert _ids(apply_filter(outputs, EdgeFilter())) == ["b", "a", "c"]
    assert isinstance(apply_filter(outputs, None), tuple)


def test_fs_01_filtering_precedes_selection() -> None:
    outputs = (
        _output("excluded", accepted=False, score=100),
        _output("lower", accepted=True, score=1),
        _output("chosen", accepted=True, score=2),
    )
    selection = Selection(field="score", order=SortOrder.DESC, limit=1)
    # Selection alone would pick the excluded output.
    assert _ids(apply_selection(outputs, selection)) == ["excluded"]
    filtered = apply_filter(outputs, _one_rule(Op.EQ, True, field="accepted"))
    assert _ids(apply_selection(filtered, selection)) == ["chosen"]


def test_fs_01_every_one_of_64_rules_is_applied() -> None:
    rules = tuple(
        FilterRule(field=f"f{index}", operator=Op.EQ, value=index)
        for index in range(MAX_FILTER_RULES_PER_EDGE)
    )
    complete = {f"f{index}": index for index in range(MAX_FILTER_RULES_PER_EDGE)}
    outputs = [_output("all", **complete)]
    for index in range(MAX_FILTER_RULES_PER_EDGE):
        broken = dict(complete)
        broken[f"f{index}"] = -1
        outputs.append(_output(f"breaks-{index}", **broken))
    assert _ids(apply_filter(outputs, EdgeFilter(rules=rules))) == ["all"]


# --- FS-02 ------------------------------------------------------------------


def test_fs_02_exists_treats_null_and_empty_string_as_absent() -> None:
    outputs = (
        _output("missing"),
        _output("null", value=None),
        _output("empty-string", value=""),
        _output("false", value=False),
        _output("zero", value=0),
        _output("empty-list", value=[]),
        _output("empty-object", value={}),
        _output("space", value=" "),
    )
    present = ["false", "zero", "empty-list", "empty-object", "space"]
    absent = ["missing", "null", "empty-string"]
    assert _ids(apply_filter(outputs, _one_rule(Op.EXISTS))) == present
    assert _ids(apply_filter(outputs, _one_rule(Op.NOT_EXISTS))) == absent


@pytest.mark.parametrize("ignored", [None, "", "anything", 0, [1], {"k": 1}])
def test_fs_02_exists_ignores_the_rule_value(ignored: object) -> None:
    outputs = (_output("missing"), _output("set", value="x"))
    assert _ids(apply_filter(outputs, _one_rule(Op.EXISTS, ignored))) == ["set"]
    assert _ids(apply_filter(outputs, _one_rule(Op.NOT_EXISTS, ignored))) == ["missing"]


# --- FS-03 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operator", "matches"),
    [
        (Op.EQ, False),
        (Op.NEQ, True),
        (Op.GT, False),
        (Op.GTE, False),
        (Op.LT, False),
        (Op.LTE, False),
        (Op.IN, False),
        (Op.NOT_IN, True),
        (Op.CONTAINS, False),
        (Op.NOT_CONTAINS, True),
        (Op.STARTS_WITH, False),
        (Op.ENDS_WITH, False),
        (Op.EXISTS, False),
        (Op.NOT_EXISTS, True),
    ],
)
@pytest.mark.parametrize("expected", ["expected", None, 1, ["a"]])
def test_fs_03_missing_fields_match_only_negative_predicates(
    operator: FilterOperator, matches: bool, expected: object
) -> None:
    kept = apply_filter((_output("missing", other="x"),), _one_rule(operator, expected))
    assert bool(kept) is matches


def test_fs_03_present_null_is_a_value_not_a_missing_field() -> None:
    assert _matches(Op.EQ, None, None)
    assert not _matches(Op.NEQ, None, None)
    assert _matches(Op.IN, None, [None, 1])
    assert not _matches(Op.NOT_IN, None, [None])
    # A missing field is not equal to null.
    assert not apply_filter((_output("missing"),), _one_rule(Op.EQ, None))
    assert apply_filter((_output("missing"),), _one_rule(Op.NEQ, None))


# --- FS-04 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("actual", "expected", "equal"),
    [
        ("open", "open", True),
        ("open", "closed", False),
        (1, "1", False),
        (1, True, False),
        (0, False, False),
        (True, True, True),
        (None, "null", False),
        (1, 1.0, True),
        (2**53 + 1, float(2**53), False),
        ([1, 2], [1, 2], True),
        ([1, 2], [2, 1], False),
        ([1, True], [1.0, 1], False),
        ({"enabled": True}, {"enabled": 1}, False),
        ({"a": 1, "b": [1, {"c": None}]}, {"b": [1.0, {"c": None}], "a": 1}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ({}, [], False),
    ],
)
def test_fs_04_eq_and_neq_use_type_preserving_json_equality(
    actual: object, expected: object, equal: bool
) -> None:
    assert _matches(Op.EQ, actual, expected) is equal
    assert _matches(Op.NEQ, actual, expected) is not equal


# --- FS-05 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("actual", "candidates", "member"),
    [
        ("b", ["a", "b"], True),
        ("c", ["a", "b"], False),
        (1, [1.0], True),
        (True, [1], False),
        (1, [True], False),
        ("1", [1], False),
        (None, [None], True),
        ([1, 2], [[1, 2]], True),
        ([1, 2], [1, 2], False),
        ({"k": 1}, [{"k": 1.0}], True),
        ({"enabled": True}, [{"enabled": 1}], False),
        ("a", [], False),
        # A single non-list value is a one-candidate list.
        ("b", "b", True),
        (2, 2.0, True),
        ({"k": 1}, {"k": 1}, True),
        ("b", "abc", False),
    ],
)
def test_fs_05_membership_uses_json_equality(
    actual: object, candidates: object, member: bool
) -> None:
    assert _matches(Op.IN, actual, candidates) is member
    assert _matches(Op.NOT_IN, actual, candidates) is not member


def test_fs_05_membership_accepts_the_maximum_candidate_count() -> None:
    candidates = list(range(MAX_FILTER_MEMBERSHIP_VALUES))
    outputs = [_output(f"o{n}", value=n) for n in (0, 255, 256, -1)]
    assert _ids(apply_filter(outputs, _one_rule(Op.IN, candidates))) == ["o0", "o255"]
    assert _ids(apply_filter(outputs, _one_rule(Op.NOT_IN, candidates))) == ["o256", "o-1"]


# --- FS-06 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("actual", "expected", "contains"),
    [
        (["a", "b"], "b", True),
        (["a", "b"], "c", False),
        # Arrays test element equality only, never substrings of elements.
        (["abc"], "b", False),
        ([1, 2], 2.0, True),
        ([True], 1, False),
        ([1], True, False),
        ([{"enabled": True}], {"enabled": 1}, False),
        ([{"enabled": True}], {"enabled": True}, True),
        ([[1, 2]], [1, 2], True),
        ([None], None, True),
        ([], None, False),
        ("alphabet", "pha", True),
        ("alphabet", "xyz", False),
        ("alphabet", "", True),
        (1234, 23, True),
        (1234, "23", True),
        (1234, 5, False),
        (True, "ru", True),
        (1.5, ".5", True),
        ({"k": 1}, "'k'", True),
        ("None", None, True),
    ],
)
def test_fs_06_contains_uses_elements_for_arrays_and_text_otherwise(
    actual: object, expected: object, contains: bool
) -> None:
    assert _matches(Op.CONTAINS, actual, expected) is contains
    assert _matches(Op.NOT_CONTAINS, actual, expected) is not contains


# --- FS-07 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("actual", "prefix", "suffix"),
    [
        ("alphabet", "alpha", "bet"),
        (1234, 12, 34),
        (1234, "12", "34"),
        (True, "Tr", "ue"),
        (False, "F", "alse"),
        (1.0, "1.", ".0"),
        (None, "No", "ne"),
        (["a", "b"], "['a'", "'b']"),
        ({"k": 1}, "{'k'", ": 1}"),
        ({"k": [1, True]}, "{'k': [1, ", "True]}"),
    ],
)
def test_fs_07_affix_predicates_compare_python_text_forms(
    actual: object, prefix: object, suffix: object
) -> None:
    assert _matches(Op.STARTS_WITH, actual, prefix)
    assert _matches(Op.ENDS_WITH, actual, suffix)
    assert not _matches(Op.STARTS_WITH, actual, suffix)
    assert not _matches(Op.ENDS_WITH, actual, prefix)


def test_fs_07_text_of_the_rule_value_is_rendered_the_same_way() -> None:
    assert _matches(Op.STARTS_WITH, "True story", True)
    assert _matches(Op.ENDS_WITH, "list ['x']", ["x"])
    assert _matches(Op.ENDS_WITH, "value 2.0", 2.0)
    assert not _matches(Op.ENDS_WITH, "value 2", 2.0)


# --- FS-08 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operator", "actual", "expected", "matches"),
    [
        (Op.GT, 3, 2, True),
        (Op.GT, 2, 2, False),
        (Op.GTE, 2, 2, True),
        (Op.LT, 1, 2, True),
        (Op.LTE, 3, 2, False),
        (Op.GT, "3", 2, True),
        (Op.LTE, "3", 3, True),
        (Op.GTE, 3, 3.0, True),
        (Op.GT, 3, "2.5", True),
        (Op.LT, "-1e3", "-999", True),
        (Op.GT, 2.5, 2, True),
        (Op.LT, -0.0, 0, False),
        (Op.GTE, -0.0, 0, True),
        (Op.GT, 2**53 + 1, 2**53, True),
        (Op.LT, 2**53, 2**53 + 1, True),
        (Op.GT, 10**1000, 0, True),
        (Op.LT, -(10**1000), -(10**999), True),
        (Op.GT, "100000000000000000000000000000001", 10**32, True),
        # A float is read as its shortest JSON text, so 0.1 equals "0.1".
        (Op.GTE, 0.1, "0.1", True),
        (Op.LTE, 0.1, "0.1", True),
        (Op.GT, 0.1, "0.1", False),
        # ... and a large float by its JSON text, 1.152921504606847e+18, not 2**60.
        (Op.GT, 2.0**60, 2**60, True),
        (Op.GT, 2.0**60, "1152921504606847000", False),
        # No string ordering.
        (Op.LT, "a", "b", False),
        (Op.GT, "b", "a", False),
        (Op.GTE, "a", "a", False),
    ],
)
def test_fs_08_ordered_operators_compare_exact_decimals(
    operator: FilterOperator, actual: object, expected: object, matches: bool
) -> None:
    assert _matches(operator, actual, expected) is matches


def test_fs_08_integers_beyond_str_conversion_limits_compare_exactly() -> None:
    # 5,000 digits is past Python's default int-to-str limit: no text detour.
    huge = 10**5000
    assert _matches(Op.LT, 5, huge)
    assert _matches(Op.GT, 5, -huge)
    assert not _matches(Op.GTE, 5, huge)


@pytest.mark.parametrize(
    "invalid",
    [True, False, None, [1], [], {"nested": 1}, {}, "abc", "", "1.2.3", "inf", "-Infinity", "nan"],
)
@pytest.mark.parametrize("operator", [Op.GT, Op.GTE, Op.LT, Op.LTE])
def test_fs_08_non_numeric_values_never_match_on_either_side(
    operator: FilterOperator, invalid: object
) -> None:
    for number in (-(10**6), 0, 1, 10**6):
        assert not _matches(operator, invalid, number)
        assert not _matches(operator, number, invalid)


# --- FS-09 ------------------------------------------------------------------


def test_fs_09_selection_drops_missing_and_null_and_breaks_ties_by_id() -> None:
    outputs = (
        _output("z", score=2),
        _output("missing"),
        _output("null", score=None),
        _output("b", score=2),
        _output("a", score=1),
        _output("c", score=2.0),
    )
    ascending = apply_selection(outputs, Selection(field="score", limit=10))
    descending = apply_selection(outputs, Selection(field="score", order=SortOrder.DESC, limit=10))
    assert _ids(ascending) == ["a", "b", "c", "z"]
    # Ties stay in ascending id order when the values are descending.
    assert _ids(descending) == ["b", "c", "z", "a"]


def test_fs_09_selection_defaults_to_ascending_limit_one() -> None:
    outputs = (_output("x", score=5), _output("y", score=-3), _output("w", score=7))
    assert _ids(apply_selection(outputs, Selection(field="score"))) == ["y"]
    assert _ids(apply_selection(outputs, Selection(field="score", limit=2))) == ["y", "x"]
    assert _ids(apply_selection(outputs, None)) == ["x", "y", "w"]


def test_fs_09_strings_sort_by_code_point_in_both_orders() -> None:
    outputs = (
        _output("1", name="beta"),
        _output("2", name="Alpha"),
        _output("3", name="alpha"),
        _output("4", name="beta"),
    )
    asc = apply_selection(outputs, Selection(field="name", limit=4))
    desc = apply_selection(outputs, Selection(field="name", order=SortOrder.DESC, limit=4))
    assert _ids(asc) == ["2", "3", "1", "4"]
    assert _ids(desc) == ["1", "4", "3", "2"]


def test_fs_09_numbers_compare_exactly_across_int_and_float() -> None:
    outputs = (
        _output("big", n=2**53 + 1),
        _output("float", n=float(2**53)),
        _output("int", n=2**53),
        _output("neg", n=-(10**30)),
    )
    asc = apply_selection(outputs, Selection(field="n", limit=4))
    assert _ids(asc) == ["neg", "float", "int", "big"]
    desc = apply_selection(outputs, Selection(field="n", order=SortOrder.DESC, limit=2))
    assert _ids(desc) == ["big", "float"]


def test_fs_09_no_sortable_values_select_nothing() -> None:
    outputs = (_output("missing"), _output("null", score=None))
    assert apply_selection(outputs, Selection(field="score", limit=3)) == ()
    assert apply_selection((), Selection(field="score")) == ()


@pytest.mark.parametrize("value", [True, False, [1], [], {"k": 1}, {}])
def test_fs_09_unsortable_values_raise_a_planning_error(value: object) -> None:
    outputs = (_output("fine", score=1), _output("bad", score=value))
    with pytest.raises(PlanningError, match="not a sortable") as caught:
        apply_selection(outputs, Selection(field="score"))
    assert "'bad'" in str(caught.value)
    assert caught.value.field == "score"
    assert isinstance(caught.value, ValueError)


def test_fs_09_mixed_strings_and_numbers_raise_a_planning_error() -> None:
    outputs = (_output("n", score=1), _output("s", score="1"))
    with pytest.raises(PlanningError, match="mixed") as caught:
        apply_selection(outputs, Selection(field="score"))
    assert caught.value.field == "score"
    # The first problem in source order decides the error.
    with pytest.raises(PlanningError, match="mixed"):
        apply_selection((*outputs, _output("b", score=True)), Selection(field="score"))
    with pytest.raises(PlanningError, match="not a sortable"):
        apply_selection((_output("b", score=True), *outputs), Selection(field="score"))


def test_fs_09_selection_with_a_small_limit_over_many_outputs() -> None:
    # Exercises the partial-sort path against a full sort.
    outputs = [_output(f"id-{index:03d}", score=(index * 37) % 101) for index in range(300)]
    for order in (SortOrder.ASC, SortOrder.DESC):
        for limit in (1, 5, 37, 299, 300, 400):
            selected = apply_selection(outputs, Selection(field="score", order=order, limit=limit))
            assert _ids(selected) == _ids(
                _reference_selection(outputs, "score", order, limit)  # type: ignore[arg-type]
            )


# --- FS-10 is a model limit; see also test_models.py -------------------------


def test_fs_10_edge_filter_holds_at_most_64_rules() -> None:
    rule = FilterRule(field="value", operator=Op.EXISTS)
    assert len(EdgeFilter(rules=(rule,) * MAX_FILTER_RULES_PER_EDGE).rules) == 64
    with pytest.raises(ValueError, match="too_long"):
        EdgeFilter(rules=(rule,) * (MAX_FILTER_RULES_PER_EDGE + 1))


# --- reference model ----------------------------------------------------------

_NUMERIC_TEXT = re.compile(r"\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*", re.ASCII)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    assert isinstance(value, Mapping)
    return "object"


def _ref_equal(left: object, right: object) -> bool:
    kind = _kind(left)
    if kind != _kind(right):
        return False
    if kind == "array":
        assert isinstance(left, (list, tuple)) and isinstance(right, (list, tuple))
        return len(left) == len(right) and all(map(_ref_equal, left, right))
    if kind == "object":
        assert isinstance(left, Mapping) and isinstance(right, Mapping)
        return set(left) == set(right) and all(_ref_equal(left[k], right[k]) for k in left)
    return left == right


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _text(value: object) -> str:
    return str(_plain(value))


def _number(value: object) -> Fraction | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(repr(value))
    if isinstance(value, str) and _NUMERIC_TEXT.fullmatch(value):
        return Fraction(value.strip())
    return None


_NEGATIVE = {Op.NEQ, Op.NOT_IN, Op.NOT_CONTAINS, Op.NOT_EXISTS}


def _ref_rule(rule: FilterRule, fields: Mapping[str, object]) -> bool:
    op = rule.operator
    if rule.field not in fields:
        return op in _NEGATIVE
    actual = fields[rule.field]
    expected = rule.value
    if op in (Op.EXISTS, Op.NOT_EXISTS):
        exists = actual is not None and actual != ""
        return exists if op is Op.EXISTS else not exists
    if op in (Op.EQ, Op.NEQ):
        return _ref_equal(actual, expected) is (op is Op.EQ)
    if op in (Op.IN, Op.NOT_IN):
        candidates = expected if isinstance(expected, tuple) else (expected,)
        found = any(_ref_equal(actual, candidate) for candidate in candidates)
        return found is (op is Op.IN)
    if op in (Op.CONTAINS, Op.NOT_CONTAINS):
        if isinstance(actual, tuple):
            found = any(_ref_equal(item, expected) for item in actual)
        else:
            found = _text(expected) in _text(actual)
        return found is (op is Op.CONTAINS)
    if op is Op.STARTS_WITH:
        return _text(actual).startswith(_text(expected))
    if op is Op.ENDS_WITH:
        return _text(actual).endswith(_text(expected))
    left, right = _number(actual), _number(expected)
    if left is None or right is None:
        return False
    return {
        Op.GT: left > right,
        Op.GTE: left >= right,
        Op.LT: left < right,
        Op.LTE: left <= right,
    }[op]


def _reference_filter(outputs: Sequence[OutputRef], rules: Sequence[FilterRule]) -> list[str]:
    return [o.id for o in outputs if all(_ref_rule(rule, o.fields) for rule in rules)]


def _reference_selection(
    outputs: Sequence[OutputRef], field: str, order: SortOrder, limit: int
) -> list[OutputRef] | str:
    """Selected outputs, or the error word ("mixed"/"sortable") selection must raise."""
    present = [
        (o, o.fields[field]) for o in outputs if field in o.fields and o.fields[field] is not None
    ]
    first_kind = None
    for _output_ref, value in present:
        if _kind(value) not in ("number", "string"):
            return "sortable"
        first_kind = first_kind or _kind(value)
        if _kind(value) != first_kind:
            return "mixed"

    def compare(left: tuple[OutputRef, Any], right: tuple[OutputRef, Any]) -> int:
        (left_ref, left_value), (right_ref, right_value) = left, right
        if left_value != right_value:
            smaller = left_value < right_value
            if order is SortOrder.DESC:
                smaller = not smaller
            return -1 if smaller else 1
        return (left_ref.id > right_ref.id) - (left_ref.id < right_ref.id)

    return [o for o, _value in sorted(present, key=functools.cmp_to_key(compare))[:limit]]


# --- strategies ---------------------------------------------------------------

_FIELD_NAMES = ("a", "b", "c")
_numeric_text = st.one_of(
    st.integers(-(10**25), 10**25).map(str),
    st.decimals(allow_nan=False, allow_infinity=False, places=3).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["1e3", "-2.5E-1", ".5", "5.", "+7", " 3 ", "0", "-0"]),
)
_strings = st.one_of(
    _numeric_text,
    st.text(alphabet="ab1.-e Tru[]'", max_size=6),
    st.sampled_from(["", "inf", "-Infinity", "nan", "None", "True"]),
)
# Values that are equal, or nearly so, across JSON types: the interesting cases.
_TRICKY: list[object] = [
    0, 1, -1, 0.0, 1.0, -0.0, 0.1, 2.5, 2**53, 2**53 + 1, float(2**53),
    True, False, None, "", "0", "1", "1.0", "0.1", "2.5", "-0.0", "a", "True", "None",
    0.3, "0.3", 2**60, 2.0**60, "1e-1",
    [], {}, [1], [1.0], [True], ["a"], ["abc", 1], {"k": 1}, {"k": True}, {"k": 1.0},
]  # fmt: skip
_scalars = st.one_of(
    st.sampled_from(_TRICKY),
    st.none(),
    st.booleans(),
    st.integers(-20, 20),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(-5, 5).map(lambda x: round(x, 1)),
    _strings,
)
_json = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["k", "m", "n"]), children, max_size=3)
    ),
    max_leaves=8,
)


def _variant(value: object) -> object:
    """A value of another JSON type or representation that is close to ``value``."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return float(value) if abs(value) < 2**53 else str(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 2**53 else repr(value)
    if isinstance(value, str):
        return value[1:] if value else None
    if isinstance(value, (list, tuple)):
        return [_variant(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _variant(value[key]) for key in reversed(list(value))}
    return False


# Mostly scalars at the top level: containers matter, but rarely match.
_field_values = st.one_of(st.sampled_from(_TRICKY), _scalars, _json)
_fields = st.dictionaries(st.sampled_from(_FIELD_NAMES), _field_values, max_size=3)
_output_ids = st.lists(
    st.text(alphabet="xyz", min_size=1, max_size=3), unique=True, min_size=2, max_size=12
)


@st.composite
def _outputs(draw: st.DrawFn, fields: st.SearchStrategy[dict[str, Any]] = _fields) -> list[Any]:
    ids = draw(_output_ids)
    return [OutputRef(id=output_id, fields=draw(fields)) for output_id in ids]


@st.composite
def _rules(draw: st.DrawFn, outputs: Sequence[OutputRef], max_rules: int = 3) -> list[FilterRule]:
    seen = [value for output in outputs for value in output.fields.values()]

    def value() -> object:
        # Reuse a value present in the outputs (as is, or as a near variant)
        # most of the time, so that rules match often enough to matter.
        source = draw(st.sampled_from(["seen", "variant", "fresh"])) if seen else "fresh"
        if source == "fresh":
            return draw(_json)
        picked = draw(st.sampled_from(seen))
        return picked if source == "seen" else _variant(picked)

    rules = []
    for _ in range(draw(st.integers(1, max_rules))):
        operator = draw(st.sampled_from(list(FilterOperator)))
        if operator in (Op.IN, Op.NOT_IN) and draw(st.booleans()):
            rule_value: object = [value() for _ in range(draw(st.integers(0, 4)))]
        else:
            rule_value = value()
        field = draw(st.sampled_from(_FIELD_NAMES))
        rules.append(FilterRule(field=field, operator=operator, value=rule_value))
    return rules


_HYPOTHESIS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@_HYPOTHESIS
@given(data=st.data())
def test_fs_01_to_08_filter_matches_the_reference_model(data: st.DataObject) -> None:
    outputs = data.draw(_outputs())
    rules = data.draw(_rules(outputs))
    kept = apply_filter(outputs, EdgeFilter(rules=tuple(rules)))
    assert _ids(kept) == _reference_filter(outputs, rules)


@_HYPOTHESIS
@given(data=st.data())
def test_fs_02_to_08_every_operator_agrees_with_the_reference_on_value_pairs(
    data: st.DataObject,
) -> None:
    actual = data.draw(_field_values)
    expected = data.draw(
        st.one_of(st.just(actual), st.just(_variant(actual)), _field_values), label="expected"
    )
    output = OutputRef(id="only", fields={"value": actual})
    for operator in FilterOperator:
        rule = FilterRule(field="value", operator=operator, value=expected)
        kept = apply_filter([output], EdgeFilter(rules=(rule,)))
        assert bool(kept) is _ref_rule(rule, output.fields), operator


@_HYPOTHESIS
@given(data=st.data())
def test_fs_02_to_06_negative_operators_partition_the_outputs(data: st.DataObject) -> None:
    outputs = data.draw(_outputs())
    (rule,) = data.draw(_rules(outputs, max_rules=1))
    pairs = {
        Op.EQ: Op.NEQ,
        Op.IN: Op.NOT_IN,
        Op.CONTAINS: Op.NOT_CONTAINS,
        Op.EXISTS: Op.NOT_EXISTS,
    }
    positive = data.draw(st.sampled_from(list(pairs)))
    yes = apply_filter(outputs, EdgeFilter(rules=(rule.model_copy(update={"operator": positive}),)))
    no = apply_filter(
        outputs, EdgeFilter(rules=(rule.model_copy(update={"operator": pairs[positive]}),))
    )
    assert sorted(_ids(yes) + _ids(no)) == sorted(_ids(outputs))
    assert not set(_ids(yes)) & set(_ids(no))


@_HYPOTHESIS
@given(
    outputs=_outputs(),
    field=st.sampled_from(_FIELD_NAMES),
    order=st.sampled_from(list(SortOrder)),
    limit=st.integers(1, 14),
)
def test_fs_09_selection_matches_the_reference_model_on_any_values(
    outputs: list[OutputRef], field: str, order: SortOrder, limit: int
) -> None:
    expected = _reference_selection(outputs, field, order, limit)
    selection = Selection(field=field, order=order, limit=limit)
    if isinstance(expected, str):
        with pytest.raises(PlanningError, match=expected):
            apply_selection(outputs, selection)
    else:
        assert _ids(apply_selection(outputs, selection)) == _ids(expected)


_sortable_numbers = st.one_of(
    st.sampled_from([0, 1, 1.0, -1, -0.0, 2.5, 2**53, 2**53 + 1, float(2**53)]),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
)
_sortable_strings = st.one_of(st.sampled_from(["", "a", "A", "b", "ab", "é"]), st.text(max_size=3))


def _selection_fields(values: st.SearchStrategy[object]) -> st.SearchStrategy[dict[str, Any]]:
    # Half of the outputs lack a sortable value (missing or null).
    return st.one_of(st.sampled_from([{}, {"s": None}]), values.map(lambda value: {"s": value}))


@_HYPOTHESIS
@given(
    data=st.data(),
    order=st.sampled_from(list(SortOrder)),
    limit=st.integers(1, 14),
)
def test_fs_09_selection_orders_like_the_reference_model(
    data: st.DataObject, order: SortOrder, limit: int
) -> None:
    # One value kind per example, so the ordering itself is exercised.
    values = data.draw(st.sampled_from([_sortable_numbers, _sortable_strings]))
    outputs = data.draw(_outputs(_selection_fields(values)))
    expected = _reference_selection(outputs, "s", order, limit)
    assert not isinstance(expected, str)
    selected = apply_selection(outputs, Selection(field="s", order=order, limit=limit))
    assert _ids(selected) == _ids(expected)
