"""The routing JSON value model (JS-01..JS-05, LM-01..LM-04, LM-29)."""

from __future__ import annotations

import copy
import json
import math
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagwerk.constants import (
    MAX_JSON_DEPTH,
    MAX_JSON_KEYS,
    MAX_JSON_VALUES,
    MAX_OUTPUT_FIELDS_BYTES,
)
from dagwerk.errors import DagwerkError, JsonLimitError
from dagwerk.json import (
    FrozenDict,
    bounded_json_size,
    canonical_json_bytes,
    freeze_json,
    freeze_object,
    json_equality_key,
    json_representations_equal,
    json_string_payload_size,
    json_values_equal,
    routing_text,
    thaw_json,
)
from dagwerk.models import EmittedOutput, LiteralSource, OutputRef, ResolvedOutput, TaskInputPlan
from dagwerk.models import output_ref_routing_size as routing_size


def _nested(levels: int, inner: object) -> object:
    value = inner
    for _ in range(levels):
        value = [value]
    return value


def _expected_canonical(value: object) -> bytes:
    # Written from the JS-05 definition, independently of canonical_json_bytes.
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


# --- JS-01 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("left", "right", "equal"),
    [
        (None, None, True),
        (None, "null", False),
        (None, 0, False),
        (None, False, False),
        (True, True, True),
        (True, False, False),
        (True, 1, False),
        (False, 0, False),
        (1, 1.0, True),
        (0, -0.0, True),
        (1, "1", False),
        ("a", "a", True),
        ("a", "A", False),
        ([], [], True),
        ([], {}, False),
        ([1, 2], [1, 2], True),
        ([1, 2], [2, 1], False),
        ([1, True], [1.0, 1], False),
        ([[1], [2.0]], [[1.0], [2]], True),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True),
        ({"a": 1}, {"a": 1, "b": None}, False),
        (
            {"outer": {"enabled": True, "scores": [1, 2]}},
            {"outer": {"scores": [1.0, 2.0], "enabled": True}},
            True,
        ),
        ({"outer": {"enabled": True}}, {"outer": {"enabled": 1}}, False),
        (2**53 + 1, float(2**53), False),
    ],
)
def test_js_01_json_equality_is_recursive_and_type_aware(
    left: object, right: object, equal: bool
) -> None:
    frozen_left, frozen_right = freeze_json(left), freeze_json(right)
    assert json_values_equal(frozen_left, frozen_right) is equal
    assert json_values_equal(frozen_right, frozen_left) is equal
    assert (json_equality_key(frozen_left) == json_equality_key(frozen_right)) is equal


# --- JS-02 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("left", "right", "equal"),
    [
        (1, 1, True),
        (1, 1.0, False),
        (True, 1, False),
        (0.0, -0.0, False),
        (0.1, 0.1, True),
        ("a", "a", True),
        (None, None, True),
        ([1, 2], [1, 2], True),
        ([1, 2], [1, 2.0], False),
        ({"a": 1, "b": 2}, {"a": 1, "b": 2}, True),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, False),
        ({"a": {"x": 1, "y": 2}}, {"a": {"y": 2, "x": 1}}, False),
    ],
)
def test_js_02_representation_equality_is_stricter(
    left: object, right: object, equal: bool
) -> None:
    assert json_representations_equal(freeze_json(left), freeze_json(right)) is equal


# --- JS-03 ------------------------------------------------------------------


def test_js_03_frozen_objects_reject_every_mutation() -> None:
    ref = OutputRef(id="output", fields={"nested": {"items": [1, 2]}})
    fields = ref.fields
    nested = fields["nested"]
    assert isinstance(nested, FrozenDict)

    with pytest.raises(TypeError, match="immutable"):
        fields["new"] = 1
    with pytest.raises(TypeError, match="immutable"):
        del fields["nested"]
    with pytest.raises(TypeError, match="immutable"):
        fields |= {"changed": True}
    with pytest.raises(TypeError, match="immutable"):
        nested |= {"changed": True}
    with pytest.raises(TypeError, match="immutable"):
        fields._keys = 0
    mutations: list[Callable[[], object]] = [
        fields.clear,
        fields.popitem,
        lambda: fields.pop("nested"),
        lambda: fields.pop("missing", None),
        lambda: fields.setdefault("new", 1),
        lambda: fields.update({"new": 1}),
        lambda: fields.update(new=1),
        lambda: nested.update({}),
    ]
    for mutate in mutations:
        with pytest.raises(TypeError, match="immutable"):
            mutate()
    fields.__init__({"new": 1})  # type: ignore[misc]
    assert thaw_json(fields) == {"nested": {"items": [1, 2]}}
    assert isinstance(nested["items"], tuple)


def test_js_03_later_changes_to_the_source_are_not_observed() -> None:
    source: dict[str, Any] = {"nested": {"items": [1, 2]}}
    frozen = FrozenDict(source)
    ref = OutputRef(id="output", fields=source)
    source["nested"]["items"].append(3)
    source["nested"] = {"changed": True}
    source["extra"] = 1
    assert thaw_json(frozen) == {"nested": {"items": [1, 2]}}
    assert thaw_json(ref.fields) == {"nested": {"items": [1, 2]}}


def test_js_03_copies_return_the_same_frozen_object() -> None:
    frozen = FrozenDict({"a": [1, {"b": None}]})
    assert copy.copy(frozen) is frozen
    assert copy.deepcopy(frozen) is frozen
    restored = pickle.loads(pickle.dumps(frozen))
    assert json_representations_equal(restored, frozen)


def test_js_03_serialisation_thaws_to_plain_containers() -> None:
    frozen = freeze_json({"items": [{"enabled": True}], "pair": (1, 2)})
    assert isinstance(frozen, FrozenDict)
    items = frozen["items"]
    assert isinstance(items, tuple) and isinstance(items[0], FrozenDict)

    plain = thaw_json(frozen)
    assert plain == {"items": [{"enabled": True}], "pair": [1, 2]}
    assert isinstance(plain, dict)
    assert type(plain["items"]) is list and type(plain["items"][0]) is dict

    plan = TaskInputPlan(generation=0, parameters={"values": [1, 2], "obj": {"k": [None]}})
    dumped = plan.model_dump(mode="json")
    assert dumped["parameters"] == {"values": [1, 2], "obj": {"k": [None]}}
    assert type(plan.model_dump()["parameters"]["values"]) is list
    assert TaskInputPlan.model_validate_json(plan.model_dump_json()) == plan


def test_js_03_freeze_object_requires_a_mapping() -> None:
    assert freeze_object(None) == FrozenDict()
    frozen = FrozenDict({"a": 1})
    assert freeze_object(frozen) is frozen
    with pytest.raises(ValueError, match="JSON object"):
        freeze_object([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="JSON object"):
        FrozenDict([("a", 1)])  # type: ignore[arg-type]


# --- JS-04 / LM-02..LM-04 ----------------------------------------------------


def test_lm_02_to_04_json_limits_keep_the_seed_values() -> None:
    assert (MAX_JSON_DEPTH, MAX_JSON_KEYS, MAX_JSON_VALUES) == (16, 512, 10_000)
    assert MAX_OUTPUT_FIELDS_BYTES == 65_536


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (math.nan, "finite"),
        (math.inf, "finite"),
        ([1, -math.inf], "finite"),
        ({"a": {"b": math.nan}}, "finite"),
        ({1: "value"}, "keys must be strings"),
        ({"a": {None: 1}}, "keys must be strings"),
        (object(), "not JSON-compatible"),
        ({1, 2}, "not JSON-compatible"),
        (b"bytes", "not JSON-compatible"),
        ([1, 2j], "not JSON-compatible"),
    ],
)
def test_js_04_freezing_rejects_values_that_are_not_json(value: object, message: str) -> None:
    with pytest.raises(JsonLimitError, match=message) as caught:
        freeze_json(value)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, DagwerkError)
    # Models report the same problem as a validation (ValueError) failure.
    with pytest.raises(ValueError, match=message):
        LiteralSource(value=value)


def test_js_04_lm_03_total_object_keys_are_limited_across_the_tree() -> None:
    flat = {f"key-{index}": index for index in range(MAX_JSON_KEYS)}
    assert len(freeze_object(flat)) == MAX_JSON_KEYS
    nested = {"outer": {f"key-{index}": index for index in range(MAX_JSON_KEYS - 1)}}
    assert len(freeze_object(nested)) == 1
    with pytest.raises(JsonLimitError, match="key count") as caught:
        freeze_json({**flat, "one-more": 0})
    assert caught.value.limit == MAX_JSON_KEYS
    with pytest.raises(JsonLimitError, match="key count"):
        freeze_json({"outer": {f"key-{index}": index for index in range(MAX_JSON_KEYS)}})
    with pytest.raises(JsonLimitError, match="key count"):
        freeze_json([{f"k{index}": 0 for index in range(300)}] * 2)


def test_js_04_lm_04_total_values_are_limited_across_the_tree() -> None:
    assert len(freeze_json(list(range(MAX_JSON_VALUES)))) == MAX_JSON_VALUES  # type: ignore[arg-type]
    # One object member plus 9,999 array items is exactly 10,000 values.
    assert TaskInputPlan(generation=0, parameters={"items": list(range(MAX_JSON_VALUES - 1))})
    with pytest.raises(JsonLimitError, match="value count") as caught:
        freeze_json(list(range(MAX_JSON_VALUES + 1)))
    assert caught.value.limit == MAX_JSON_VALUES
    with pytest.raises(JsonLimitError, match="value count"):
        freeze_json({"items": list(range(MAX_JSON_VALUES))})
    with pytest.raises(JsonLimitError, match="value count"):
        freeze_json([[0] * 5_000, [0] * 5_000])


def test_js_04_lm_02_depth_is_limited_to_16_containers() -> None:
    # A member may sit inside at most 16 containers.
    assert freeze_json(_nested(MAX_JSON_DEPTH, "value")) is not None
    assert freeze_json(_nested(MAX_JSON_DEPTH - 1, {"k": "value"})) is not None
    # An empty container inside 16 others holds no member past the limit.
    assert freeze_json(_nested(MAX_JSON_DEPTH, [])) is not None
    for too_deep in (
        _nested(MAX_JSON_DEPTH + 1, "value"),
        _nested(MAX_JSON_DEPTH, {"k": 1}),
        _nested(MAX_JSON_DEPTH + 1, []),
    ):
        with pytest.raises(JsonLimitError, match="maximum depth") as caught:
            freeze_json(too_deep)
        assert caught.value.limit == MAX_JSON_DEPTH


def test_js_04_reused_frozen_values_keep_counting_toward_the_limits() -> None:
    inner = FrozenDict({"a": _nested(MAX_JSON_DEPTH - 2, 1)})
    assert freeze_json([inner]) is not None
    with pytest.raises(JsonLimitError, match="maximum depth"):
        freeze_json([[inner]])
    keys = FrozenDict({f"k{index}": 0 for index in range(MAX_JSON_KEYS // 2 + 1)})
    with pytest.raises(JsonLimitError, match="key count"):
        freeze_json({"left": keys, "right": keys})
    values = freeze_json(list(range(MAX_JSON_VALUES // 2)))
    with pytest.raises(JsonLimitError, match="value count"):
        freeze_json([values, values])


def test_js_04_number_subclasses_freeze_to_plain_numbers() -> None:
    class Count(int):
        pass

    frozen = freeze_json({"n": Count(3), "f": 2.5})
    assert isinstance(frozen, FrozenDict)
    assert type(frozen["n"]) is int and frozen["n"] == 3


# --- JS-05 ------------------------------------------------------------------


def test_js_05_canonical_form_is_sorted_compact_utf8() -> None:
    value = freeze_json({"b": [1, 2.5, None, True], "a": {"z": "é😀", "y": 'q"\n'}})
    assert canonical_json_bytes(value) == (
        '{"a":{"y":"q\\"\\n","z":"é😀"},"b":[1,2.5,null,true]}'.encode()
    )
    with pytest.raises(ValueError):
        canonical_json_bytes(math.nan)
    with pytest.raises(ValueError):
        canonical_json_bytes({"a": math.inf})


def test_js_05_bounded_size_is_exact_or_limit_plus_one() -> None:
    value = freeze_json(
        {
            "quoted": 'a"b\\\n\t\x00',
            "unicode": "café 😀",
            "chunked": '"\n😀' * 2_000,
            "nested": [None, True, False, 1, -1.5e-300, {"value": "x"}, [], {}],
        }
    )
    size = len(_expected_canonical(thaw_json(value)))
    assert bounded_json_size(value, size) == size
    assert bounded_json_size(value, size + 100) == size
    assert bounded_json_size(value, size - 1) == size
    assert bounded_json_size(value, size - 2) == size - 1
    assert bounded_json_size(value, 0) == 1


@pytest.mark.parametrize("limit", [-1, True, 1.0, "10", None])
def test_js_05_bounded_size_rejects_a_bad_limit(limit: object) -> None:
    with pytest.raises(ValueError, match="limit"):
        bounded_json_size({}, limit)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.nan, {1: 2}, object(), [{"a": {math.inf}}]])
def test_js_05_bounded_size_rejects_values_that_are_not_json(value: object) -> None:
    with pytest.raises(ValueError):
        bounded_json_size(value, 1_000)


def test_js_05_string_payload_size_excludes_quotes_and_is_bounded() -> None:
    assert json_string_payload_size("") == 0
    assert json_string_payload_size('a"') == 3
    assert json_string_payload_size("é") == 2
    assert json_string_payload_size("\n") == 2
    assert json_string_payload_size("x" * 100, limit=10) == 11
    assert json_string_payload_size("é" * 6, limit=11) == 12
    with pytest.raises(ValueError):
        json_string_payload_size("\ud800")


def test_js_05_routing_text_is_python_str_of_the_plain_value() -> None:
    assert routing_text(freeze_json({"k": [1, True, None]})) == "{'k': [1, True, None]}"
    assert routing_text(freeze_json([1.0, "a"])) == "[1.0, 'a']"
    assert routing_text(True) == "True"
    assert routing_text("text") == "text"


# --- LM-01 ------------------------------------------------------------------


@pytest.mark.parametrize("model", [OutputRef, EmittedOutput, ResolvedOutput])
def test_lm_01_output_fields_are_limited_to_64_kib(model: type[Any]) -> None:
    overhead = len(_expected_canonical({"p": ""}))
    exact = {"p": "x" * (MAX_OUTPUT_FIELDS_BYTES - overhead)}
    assert len(_expected_canonical(exact)) == MAX_OUTPUT_FIELDS_BYTES
    assert model(id="output", fields=exact).fields["p"] == exact["p"]
    over = {"p": "x" * (MAX_OUTPUT_FIELDS_BYTES - overhead + 1)}
    with pytest.raises(ValueError, match="65536-byte limit"):
        model(id="output", fields=over)
    # Multi-byte characters count in UTF-8 bytes, not characters.
    with pytest.raises(ValueError, match="65536-byte limit"):
        model(id="output", fields={"p": "é" * (MAX_OUTPUT_FIELDS_BYTES // 2)})


# --- LM-29 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output_id", "fields", "correlation_id"),
    [
        ("a", {}, None),
        ("output-é", {"score": 1.5, "tags": ["x", "y"]}, "corr"),
        ("o" * 512, {"nested": {"b": [None, True], "a": "😀"}}, "c" * 512),
    ],
)
def test_lm_29_routing_size_counts_id_fields_and_correlation(
    output_id: str, fields: dict[str, Any], correlation_id: str | None
) -> None:
    output = OutputRef(id=output_id, fields=fields, correlation_id=correlation_id)
    expected = len(
        _expected_canonical({"id": output_id, "fields": fields, "correlation_id": correlation_id})
    )
    assert routing_size(output) == expected
    assert routing_size(output, limit=expected - 1) == expected


def test_lm_29_routing_size_of_a_minimal_output() -> None:
    # {"correlation_id":null,"fields":{},"id":"a"}: a null correlation counts.
    assert routing_size(OutputRef(id="a")) == 44
    assert routing_size(OutputRef(id="a", correlation_id="c")) == 43


def test_lm_29_materialised_data_never_counts() -> None:
    small = EmittedOutput(id="a", fields={"k": 1})
    large = EmittedOutput(id="a", fields={"k": 1}, data={"blob": "x" * 1_000_000})
    as_ref = [OutputRef(id=o.id, fields=o.fields) for o in (small, large)]
    assert routing_size(as_ref[0]) == routing_size(as_ref[1])


# --- properties ----------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1.0, 0.5]),
    st.text(max_size=6),
)
_json = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=4)
    ),
    max_leaves=16,
)
_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _equal_variant(value: object, flip: bool) -> object:
    """A differently represented value that JSON equality must still accept."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return float(value) if flip and abs(value) < 2**53 else value
    if isinstance(value, float):
        return int(value) if flip and value.is_integer() else value
    if isinstance(value, list):
        return [_equal_variant(item, flip) for item in value]
    assert isinstance(value, dict)
    keys = list(value)[::-1] if flip else list(value)
    return {key: _equal_variant(value[key], flip) for key in keys}


def _reference_equal(left: object, right: object) -> bool:
    def kind(value: object) -> str:
        if isinstance(value, bool):
            return "bool"
        if isinstance(value, (int, float)):
            return "number"
        if isinstance(value, (list, tuple)):
            return "array"
        if isinstance(value, Mapping):
            return "object"
        return type(value).__name__

    if kind(left) != kind(right):
        return False
    if isinstance(left, (list, tuple)):
        assert isinstance(right, (list, tuple))
        return len(left) == len(right) and all(map(_reference_equal, left, right))
    if isinstance(left, Mapping):
        assert isinstance(right, Mapping)
        return left.keys() == right.keys() and all(
            _reference_equal(left[k], right[k]) for k in left
        )
    return left == right


@_SETTINGS
@given(left=_json, right=_json, flip=st.booleans())
def test_js_01_equality_agrees_with_its_key_and_a_reference(
    left: object, right: object, flip: bool
) -> None:
    a, b = freeze_json(left), freeze_json(right)
    variant = freeze_json(_equal_variant(left, flip))
    for x, y in ((a, b), (a, variant)):
        equal = json_values_equal(x, y)
        assert equal is _reference_equal(x, y)
        assert equal is json_values_equal(y, x)
        assert equal is (json_equality_key(x) == json_equality_key(y))
        if equal:
            assert hash(json_equality_key(x)) == hash(json_equality_key(y))
    assert json_values_equal(a, variant)
    assert json_values_equal(a, a)
    assert json_values_equal(a, freeze_json(thaw_json(a)))


@_SETTINGS
@given(value=_json, slack=st.integers(-50, 50))
def test_js_05_bounded_size_matches_the_canonical_length(value: object, slack: int) -> None:
    frozen = freeze_json(value)
    size = len(canonical_json_bytes(frozen))
    assert size == len(_expected_canonical(value))
    limit = max(0, size + slack)
    expected = size if size <= limit else limit + 1
    assert bounded_json_size(frozen, limit) == expected
    assert bounded_json_size(value, limit) == expected


@_SETTINGS
@given(value=_json)
def test_js_03_freeze_and_thaw_round_trip(value: object) -> None:
    frozen = freeze_json(value)
    plain = thaw_json(frozen)
    assert plain == value
    assert json.dumps(plain, sort_keys=True) == json.dumps(value, sort_keys=True)
    refrozen = freeze_json(plain)
    assert json_representations_equal(refrozen, frozen)
    assert freeze_json(frozen) == frozen
    assert canonical_json_bytes(frozen) == _expected_canonical(value)


# --- the flat-object fast path of FrozenDict ---------------------------------


class _Str(str):
    pass


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=4),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(),
            st.text(max_size=4),
            st.lists(st.integers(), max_size=2),
            st.builds(_Str, st.text(max_size=2)),
        ),
        max_size=6,
    )
)
def test_a_flat_object_freezes_exactly_as_the_walk_does(values: dict[str, Any]) -> None:
    from dagwerk import json as dj

    try:
        walked = dj._freeze(values, 1, dj._Counter())
    except JsonLimitError:
        with pytest.raises(JsonLimitError):
            FrozenDict(values)
        return
    fast = FrozenDict(values)
    assert isinstance(walked, FrozenDict)
    for slot in ("_keys", "_values", "_depth"):
        assert getattr(fast, slot) == getattr(walked, slot)
    assert dict(fast) == dict(walked)
    assert [type(v) for v in fast.values()] == [type(v) for v in walked.values()]
