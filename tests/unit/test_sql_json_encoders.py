"""The SQL store's shared JSON encoders write exactly what ``json.dumps``
with the same options writes (they replace per-call encoders)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagwerk._fifo import FifoCache
from dagwerk.backends.sql import _base
from dagwerk.backends.sql._base import (
    COMPACT_ASCII_JSON,
    COMPACT_JSON,
    TEXT_JSON,
    SqlStoreBase,
    loads_object,
)
from dagwerk.json import freeze_object

_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_VALUES)
def test_encoders_match_json_dumps(value: object) -> None:
    assert COMPACT_JSON.encode(value) == json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    assert COMPACT_ASCII_JSON.encode(value) == json.dumps(
        value, separators=(",", ":"), allow_nan=False
    )
    assert TEXT_JSON.encode(value) == json.dumps(value, ensure_ascii=False)


def test_new_ids_are_32_random_hex_digits() -> None:
    ids = {SqlStoreBase._new_id(None) for _ in range(1000)}  # type: ignore[arg-type]
    assert len(ids) == 1000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    batch = SqlStoreBase._new_ids(None, 1000)  # type: ignore[arg-type]
    assert len(set(batch) | ids) == 2000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in batch)
    assert SqlStoreBase._new_ids(None, 0) == []  # type: ignore[arg-type]


def test_non_finite_numbers_are_refused_as_before() -> None:
    for encoder in (COMPACT_JSON, COMPACT_ASCII_JSON):
        try:
            encoder.encode({"x": float("inf")})
        except ValueError:
            continue
        raise AssertionError("a non-finite number was encoded")


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(), _VALUES, max_size=4))
def test_stored_objects_parse_the_same_whether_remembered_or_not(value: dict[str, object]) -> None:
    text = json.dumps(value)
    expected = freeze_object(json.loads(text))
    first = loads_object(text)
    assert first == expected
    assert loads_object(text) == expected


def test_short_object_texts_are_shared_and_the_memory_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_base, "_OBJECTS", FifoCache(8))
    assert loads_object('{"ok":1}') is loads_object('{"ok":1}')
    long_text = json.dumps({"s": "x" * _base._OBJECT_TEXT_MAX})
    assert loads_object(long_text) == {"s": "x" * _base._OBJECT_TEXT_MAX}
    assert long_text not in _base._OBJECTS
    for n in range(20):
        assert loads_object(json.dumps({"n": n})) == {"n": n}
        assert len(_base._OBJECTS) <= 8
    with pytest.raises(ValueError):
        loads_object("[1, 2]")  # not an object: refused, never remembered
    assert "[1, 2]" not in _base._OBJECTS
