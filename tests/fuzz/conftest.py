"""Shared machinery of the hostile-input suite.

Every case must end in a documented outcome (a value, a ``DagwerkError``
subclass, or ``pydantic.ValidationError`` where a pydantic model validates
its own input) and within a time bound. The bound is measured, never slept:
:func:`bounded` times one call against a wall-clock budget, and hypothesis'
own ``deadline`` guards each generated example.

``DAGWERK_FUZZ_EXAMPLES`` raises the example count for long runs; the
default keeps ``tests/fuzz`` well under 30 seconds on two cores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import pydantic
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from dagwerk.errors import DagwerkError

EXAMPLES = int(os.environ.get("DAGWERK_FUZZ_EXAMPLES", "150"))

#: Errors the seed API documents: dagwerk's typed errors everywhere, plus
#: pydantic's ValidationError for input that a pydantic model validates.
DOCUMENTED_ERRORS: tuple[type[BaseException], ...] = (DagwerkError, pydantic.ValidationError)

#: Wall-clock bound of one hostile call. Generous for a loaded 2-core CI
#: machine; a backtracking regex or a recursive walk over 10^5 levels takes
#: minutes or crashes, so the bound still separates bounded from unbounded.
CALL_BUDGET_SECONDS = 5.0

settings.register_profile(
    "fuzz",
    max_examples=EXAMPLES,
    deadline=timedelta(seconds=CALL_BUDGET_SECONDS),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("DAGWERK_FUZZ_RANDOM") is None,
)
FUZZ = settings.get_profile("fuzz")

T = TypeVar("T")


class Rejected:
    """The outcome of a call that raised a documented error."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"Rejected({type(self.error).__name__}: {self.error})"


def bounded(
    call: Callable[[], T],
    *,
    budget: float = CALL_BUDGET_SECONDS,
    allowed: tuple[type[BaseException], ...] = DOCUMENTED_ERRORS,
) -> T | Rejected:
    """Run ``call``; return its value or :class:`Rejected` for a documented error.

    Any other exception propagates (and fails the test); so does a call that
    took longer than ``budget`` seconds.
    """
    start = time.perf_counter()
    try:
        result: T | Rejected = call()
    except allowed as error:
        result = Rejected(error)
    elapsed = time.perf_counter() - start
    assert elapsed < budget, f"call took {elapsed:.2f}s; bound is {budget}s"
    return result


def deep_list(levels: int) -> list[Any]:
    """``[[[...]]]`` nested ``levels`` deep, built without recursion."""
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


def deep_dict(levels: int) -> dict[str, Any]:
    """``{"a": {"a": ...}}`` nested ``levels`` deep, built without recursion."""
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


HUGE_INT = 10**100_000
TEN_MB = "x" * 10_000_000

#: Hand-picked hostile scalars and containers, mixed into generated values.
#: They stay printable, so hypothesis can report a failing example; the
#: unprintable extremes (10**100000, 10^5 levels) have explicit tests.
HOSTILE_VALUES: list[object] = [
    10**4000,
    -(10**4000),
    1e308 * 10,  # inf
    float("nan"),
    -0.0,
    2**63,
    "\ud800",
    "a\x00b",
    "\x00",
    "",
    "\udfff\ud800",
    b"bytes",
    object(),
    deep_list(40),
    deep_dict(40),
    {1: "int key"},
    {"\ud800": 1},
    {"\x00": None},
]

_TEXT = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()),  # surrogates included
    max_size=40,
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | _TEXT
    | st.sampled_from(HOSTILE_VALUES)
)

#: Arbitrary (often invalid) JSON-ish values.
hostile_json: st.SearchStrategy[object] = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(_TEXT, inner, max_size=4)
    ),
    max_leaves=12,
)
hostile_text = _TEXT | st.sampled_from(["", "\x00", "\ud800", "a" * 600, "{", "}", "|"])
