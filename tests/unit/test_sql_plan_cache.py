"""The SQL store's memo of parsed task plans: it returns exactly what
validation returns, caches only successes, and stays bounded."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dagwerk.backends.sql import _plans
from dagwerk.constants import InputRole
from dagwerk.models import PlannedEdgeInput, TaskInputPlan


def _text(generation: int, pad: str = "") -> str:
    return TaskInputPlan(generation=generation, parameters={"p": pad}).model_dump_json()


def test_a_cached_plan_equals_a_fresh_validation_and_is_reused() -> None:
    text = _text(7)
    first = _plans.parse_plan(text)
    assert first == TaskInputPlan.model_validate_json(text)
    assert _plans.parse_plan(text) is first


def test_an_invalid_plan_raises_every_time_and_is_not_cached() -> None:
    bad = '{"generation": -1, "parameters": {}}'
    for _ in range(2):
        with pytest.raises(ValidationError):
            _plans.parse_plan(bad)
    assert bad not in _plans._CACHE


def test_large_plans_are_not_cached_and_the_cache_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    big = _text(1, "x" * (_plans._MAX_TEXT + 1))
    assert _plans.parse_plan(big) == TaskInputPlan.model_validate_json(big)
    assert big not in _plans._CACHE
    monkeypatch.setattr(_plans, "_MAX_ENTRIES", 3)
    texts = [_text(100 + n) for n in range(5)]
    for text in texts:
        _plans.parse_plan(text)
    assert len(_plans._CACHE) <= 3
    assert texts[-1] in _plans._CACHE and texts[0] not in _plans._CACHE


# --- plans rebuilt from the store's rows without re-validation ----------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.sampled_from([0.0, -0.0, 1.5, 1e-7]),
    st.text(max_size=6),
)
_json = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=12,
)
_ids = st.lists(st.text(min_size=1, max_size=8), max_size=5, unique=True)


@st.composite
def _plans_strategy(draw: st.DrawFn) -> TaskInputPlan:
    names = draw(st.lists(st.sampled_from(["a", "b", "in-1", "_x"]), max_size=3, unique=True))
    edges = tuple(
        PlannedEdgeInput(
            edge=name,
            source_index=draw(st.integers(0, 50)),
            role=draw(st.sampled_from(list(InputRole))),
            output_ids=tuple(draw(_ids)),
        )
        for name in names
    )
    parameters = draw(st.dictionaries(st.text(min_size=1, max_size=4), _json, max_size=3))
    secrets = draw(
        st.dictionaries(
            st.text(min_size=1, max_size=4).filter(lambda k: k not in parameters),
            st.text(min_size=1, max_size=4),
            max_size=2,
        )
    )
    return TaskInputPlan(
        generation=draw(st.integers(0, 10**6)),
        edges=edges,
        parameters=parameters,
        secret_refs=secrets,
        correlation_id=draw(st.none() | st.text(min_size=1, max_size=8)),
    )


@settings(max_examples=200, deadline=None)
@given(_plans_strategy())
def test_a_rebuilt_plan_equals_the_validated_plan(plan: TaskInputPlan) -> None:
    text = plan.model_dump_json()
    rebuilt = _plans._trusted(text)
    validated = TaskInputPlan.model_validate_json(text)
    assert rebuilt == validated
    assert rebuilt.model_dump_json() == text
    assert type(rebuilt.parameters) is type(validated.parameters)
    assert type(rebuilt.secret_refs) is type(validated.secret_refs)
    assert all(type(e.role) is InputRole for e in rebuilt.edges)


@pytest.mark.parametrize(
    "edit",
    [
        lambda raw: raw["edges"][0].__setitem__("source_index", "0"),
        lambda raw: raw["edges"][0].__setitem__("role", "sideways"),
        lambda raw: raw["edges"][0].__setitem__("output_ids", "x"),
        lambda raw: raw.__setitem__("generation", -1),
        lambda raw: raw.__setitem__("extra", 1),
        lambda raw: raw.__setitem__("schema_version", 2),
        lambda raw: raw.__setitem__("parameters", []),
    ],
)
def test_a_row_of_another_shape_is_fully_validated_and_refused(
    edit: Callable[[dict[str, Any]], None],
) -> None:
    plan = TaskInputPlan(
        generation=1,
        edges=(PlannedEdgeInput(edge="a", source_index=0, role=InputRole.MAIN, output_ids=("x",)),),
        parameters={},
    )
    raw = json.loads(plan.model_dump_json())
    edit(raw)
    with pytest.raises(ValidationError):
        _plans._trusted(json.dumps(raw))


def test_a_written_plan_is_remembered_as_the_parse_of_its_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_plans, "_CACHE", type(_plans._CACHE)())
    monkeypatch.setattr(_plans, "_MAX_ENTRIES", 2)
    plan = TaskInputPlan(generation=3, parameters={"p": "x"})
    text = plan.model_dump_json()
    _plans.remember_plan(text, plan)
    assert _plans.parse_plan(text) is plan
    assert plan == TaskInputPlan.model_validate_json(text)
    # Bounded like the parse cache; an oversized text is not held.
    for n in range(3):
        other = TaskInputPlan(generation=n)
        _plans.remember_plan(other.model_dump_json(), other)
    assert len(_plans._CACHE) == 2 and text not in _plans._CACHE
    big = TaskInputPlan(generation=1, parameters={"p": "x" * _plans._MAX_TEXT})
    _plans.remember_plan(big.model_dump_json(), big)
    assert big.model_dump_json() not in _plans._CACHE


def test_a_launch_remembers_its_plans_for_the_claims(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dagwerk.backends.sqlite import SqliteStore
    from dagwerk.testing.helpers import chain, new_run

    monkeypatch.setattr(_plans, "_CACHE", type(_plans._CACHE)())
    parsed: list[str] = []
    real = _plans._trusted

    def counted(text: str) -> object:
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(_plans, "_trusted", counted)
    with SqliteStore(str(tmp_path / "db.sqlite")) as store:
        new_run(store, chain(1))
        (stored,) = store._sqlite._connection().execute("SELECT plan FROM dagwerk_tasks")
        assert stored[0] in _plans._CACHE
        (task,) = store.list_tasks("run-1")  # read back without parsing the text
        assert task.plan is _plans._CACHE[stored[0]]
        assert parsed == []
