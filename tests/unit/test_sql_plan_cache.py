"""The SQL store's memo of parsed task plans (issue 9): it returns exactly what
validation returns, caches only successes, and stays bounded."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dagwerk.backends.sql import _plans
from dagwerk.models import TaskInputPlan


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
