"""Hostile JSON: the value model and run-input merging.

Covers deep nesting (10^5 levels), huge numbers (10**100000, inf, NaN,
-0.0), lone surrogates, NUL bytes and 10 MB strings. Only documented errors
come out, each call within the time bound.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagwerk.errors import JsonLimitError
from dagwerk.json import (
    FrozenDict,
    bounded_json_size,
    canonical_json_bytes,
    freeze_json,
    json_equality_key,
    json_string_payload_size,
)
from dagwerk.schema import InputFieldSpec, RunInputError, merge_run_input

from .conftest import (
    FUZZ,
    HUGE_INT,
    TEN_MB,
    Rejected,
    bounded,
    deep_dict,
    deep_list,
    hostile_json,
    hostile_text,
)

EXTREMES: list[tuple[str, object]] = [
    ("deep-list", deep_list(100_000)),
    ("deep-dict", deep_dict(100_000)),
    ("huge-int", HUGE_INT),
    ("negative-huge-int", -HUGE_INT),
    ("overflowed-float", 1e308 * 10),
    ("nan", float("nan")),
    ("negative-zero", -0.0),
    ("lone-surrogate", "\ud800"),
    ("surrogate-key", {"\ud800": 1}),
    ("nul", "a\x00b"),
    ("nul-key", {"\x00": "\x00"}),
    ("ten-mb", TEN_MB),
    ("bytes", b"\xff\xfe"),
]


@pytest.mark.parametrize(("label", "value"), EXTREMES, ids=[label for label, _ in EXTREMES])
def test_extreme_values_give_documented_outcomes(label: str, value: object) -> None:
    """freeze, FrozenDict, size, canonical bytes and run input: value or DagwerkError."""
    bounded(lambda: freeze_json(value))
    bounded(lambda: FrozenDict({"k": value}))
    bounded(lambda: bounded_json_size(value, 1_000))
    bounded(lambda: canonical_json_bytes(value))
    bounded(lambda: json_equality_key(freeze_json([value])) if label != "nan" else None)
    outcome = bounded(lambda: merge_run_input([], {}, {"k": value}))
    if isinstance(outcome, Rejected):
        assert isinstance(outcome.error, RunInputError)


def test_deep_nesting_is_refused_at_the_depth_limit_without_recursion() -> None:
    for value in (deep_list(100_000), deep_dict(100_000)):
        result = bounded(partial(freeze_json, value))
        assert isinstance(result, Rejected)
        assert isinstance(result.error, JsonLimitError)
        assert result.error.code == "json_too_deep"
        # bounded_json_size walks iteratively: it measures, it does not recurse.
        assert bounded_json_size(value, 10) == 11


def test_non_finite_numbers_are_refused_and_negative_zero_is_kept() -> None:
    for value in (1e308 * 10, -math.inf, float("nan")):
        assert isinstance(bounded(partial(freeze_json, value)), Rejected)
    frozen = freeze_json(-0.0)
    assert isinstance(frozen, float) and math.copysign(1.0, frozen) == -1.0
    assert canonical_json_bytes(-0.0) == b"-0.0"


def test_regression_bounded_json_size_measures_integers_past_the_str_limit() -> None:
    """Fix: ``str(10**100000)`` raises ValueError; the size walk used it."""
    assert bounded_json_size(HUGE_INT, 200_000) == 100_001
    assert bounded_json_size(-HUGE_INT, 200_000) == 100_002
    assert bounded_json_size([HUGE_INT], 1_000) == 1_001
    for value in (10**18 - 1, 10**18, -(10**18), 10**4299, 10**4300, 10**5000 - 1):
        with_text = len(str(value)) if abs(value) < 10**4300 else None
        if with_text is not None:
            assert bounded_json_size(value, 10**6) == with_text


def test_regression_bounded_json_size_raises_json_limit_error() -> None:
    """Fix: lone surrogates leaked UnicodeEncodeError, NaN a plain ValueError."""
    for value in ("\ud800", {"\ud800": 1}, float("nan"), math.inf, b"x", {1: 2}):
        with pytest.raises(JsonLimitError):
            bounded_json_size(value, 1_000)
    with pytest.raises(JsonLimitError):
        json_string_payload_size("\ud800")
    with pytest.raises(JsonLimitError):
        json_string_payload_size("\ud800" * 10, limit=3)


def test_regression_canonical_json_bytes_refuses_deep_and_surrogate_input() -> None:
    """Fix: a 10^5-deep plain value leaked RecursionError, a surrogate UnicodeEncodeError."""
    for value in (deep_list(100_000), deep_dict(100_000), "\ud800", {"\ud800": 1}):
        with pytest.raises(JsonLimitError):
            canonical_json_bytes(value)


def test_regression_run_input_with_lone_surrogate_is_a_run_input_error() -> None:
    """Fix: merge_run_input leaked UnicodeEncodeError for a lone surrogate."""
    for run_input in ({"k": "\ud800"}, {"\ud800": "v"}, {"k": ["ok", {"x": "\udfff"}]}):
        with pytest.raises(RunInputError, match="not JSON-compatible"):
            merge_run_input([], {}, run_input)


def test_huge_integer_run_input_is_measured_not_rendered() -> None:
    # 100,001 digits fit in 256 KiB; the merge measures without str().
    merged = merge_run_input([], {}, {"n": HUGE_INT})
    assert merged["n"] == HUGE_INT
    # It has no canonical text (past the interpreter's 4,300-digit limit):
    # a serialising store gets a documented error, never a bare ValueError.
    with pytest.raises(JsonLimitError):
        canonical_json_bytes(merged)
    with pytest.raises(RunInputError, match="byte limit"):
        merge_run_input([], {}, {"n": HUGE_INT * HUGE_INT * HUGE_INT})


def test_ten_megabyte_run_input_is_refused_by_size() -> None:
    for defaults, supplied in (({}, {"k": TEN_MB}), ({"k": TEN_MB}, {})):
        outcome = bounded(partial(merge_run_input, [], defaults, supplied))
        assert isinstance(outcome, Rejected)
        assert isinstance(outcome.error, RunInputError)
        assert "262144-byte limit" in str(outcome.error)


@FUZZ
@given(value=hostile_json)
def test_freeze_and_size_only_raise_json_limit_error(value: object) -> None:
    for call in (
        lambda: freeze_json(value),
        lambda: bounded_json_size(value, 4_096),
        lambda: canonical_json_bytes(value),
    ):
        outcome = bounded(call)
        if isinstance(outcome, Rejected):
            assert isinstance(outcome.error, JsonLimitError)


@FUZZ
@given(
    schema=st.lists(
        st.builds(
            InputFieldSpec,
            name=st.text(min_size=1, max_size=5),
            label=st.text(max_size=5),
            required=st.booleans(),
            default=st.none() | st.integers() | st.text(max_size=5),
        ),
        max_size=3,
    ),
    defaults=st.dictionaries(hostile_text, hostile_json, max_size=3),
    supplied=st.dictionaries(hostile_text | st.integers(), hostile_json, max_size=3),
)
def test_merge_run_input_only_raises_run_input_error(
    schema: list[InputFieldSpec], defaults: dict[str, Any], supplied: dict[Any, Any]
) -> None:
    outcome = bounded(lambda: merge_run_input(schema, defaults, supplied))
    if isinstance(outcome, Rejected):
        assert isinstance(outcome.error, RunInputError)
    else:
        assert isinstance(outcome, FrozenDict)
        # What is accepted is storable: it has a canonical form within the limit.
        assert len(canonical_json_bytes(outcome)) <= 262_144
