"""The SQL store measures an output's routing size from the text it writes;
the figure must be exactly the canonical size the bounded walk gives."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagwerk.backends.sql._tasks import _data_text, _routing_size, output_texts
from dagwerk.errors import JsonLimitError
from dagwerk.json import FrozenDict, bounded_json_size
from dagwerk.models import EmittedOutput

_text = st.text(
    alphabet=st.characters(exclude_categories=["Cs"]), max_size=8
)  # no lone surrogates: outputs refuse them
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_json = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_text, children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(_text, _json, max_size=4),
    st.none() | _text.filter(bool),
    _text.filter(bool),
)
def test_the_size_from_the_written_text_is_the_canonical_size(
    fields: dict[str, object], correlation: str | None, output_id: str
) -> None:
    output = EmittedOutput(id=output_id, fields=fields)
    size, text = _routing_size(output, correlation, 10**9)
    wire = {"correlation_id": correlation, "fields": output.fields, "id": output.id}
    assert size == bounded_json_size(wire, 10**9)
    assert len(text.encode("utf-8")) == bounded_json_size(output.fields, 10**9)


def test_a_value_without_json_text_gets_the_typed_error() -> None:
    # model_construct skips validation: a value refused at construction.
    output = EmittedOutput.model_construct(id="x", fields={"bad": float("nan")})  # type: ignore[arg-type]
    with pytest.raises(JsonLimitError):
        _routing_size(output, None, 1_000)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(_text, _json, max_size=4),
    st.none() | _text.filter(bool),
    _text.filter(bool),
    st.dictionaries(_text, _json, max_size=3),
)
def test_texts_computed_before_the_transaction_give_the_same_row(
    fields: dict[str, object], correlation: str | None, output_id: str, data: dict[str, object]
) -> None:
    output = EmittedOutput(id=output_id, fields=fields, data=data)
    (texts,) = output_texts([output]).values()
    size, fields_text = _routing_size(output, correlation, 10**9)
    head = json.dumps(correlation, ensure_ascii=False)
    assert texts.partial_size + len(head.encode("utf-8")) == size
    assert texts.fields == fields_text
    assert texts.data == _data_text(output)


def test_an_output_without_json_data_gets_no_precomputed_texts() -> None:
    bad = EmittedOutput.model_construct(id="x", fields=FrozenDict(), data={"f": object()})
    assert output_texts([bad, "not an output"]) == {}
