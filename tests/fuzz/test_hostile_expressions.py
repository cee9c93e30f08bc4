"""Hostile expressions, lookups and pipes.

Arbitrary expression text and lookups returning arbitrary (often invalid)
JSON produce a value or :class:`ExpressionError`, within the time bound.
The language cannot reach Python: attribute access, dunder keys,
format-string syntax and calls other than the listed pipes and ``list``
either raise ExpressionError or are plain keys handed to the lookup.
"""

from __future__ import annotations

import time
from functools import partial

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dagwerk.pipes as pipes_module
from dagwerk.bindings import build_expression_lookup
from dagwerk.errors import ExpressionError
from dagwerk.expressions import (
    EvaluationBudget,
    extract_refs,
    get_expression_vocabulary,
    resolve_expression,
    tokenize_expression,
    validate_expression,
)
from dagwerk.models import OutputRef
from dagwerk.pipes import BUILTIN_PIPES, FALLBACK_REGEX_BUDGET, fallback_regex_cost

from .conftest import FUZZ, HUGE_INT, TEN_MB, Rejected, bounded, deep_dict, hostile_json

_PIPE_NAMES = list(BUILTIN_PIPES)
_FRAGMENT = st.sampled_from(
    ["{", "}", "\\{", "\\}", "|", "(", ")", ",", "\\,", ".", " ", "input", "e", "list", "x", "\x00"]
    + [f"| {name}" for name in _PIPE_NAMES]
    + ["\ud800", "__class__", "!r", ":>10", "0", "(a+)+$", "json_get(a)", "match((a+)+b)"]
)
#: Expression-like text: fragments of the grammar glued at random.
expression_text = st.lists(_FRAGMENT | st.text(max_size=4), max_size=24).map("".join)
#: Syntactically valid expressions with random pipes and arguments.
_ARG = st.text(alphabet=st.characters(codec=None, exclude_characters="(),|{}\\"), max_size=8)
_PIPE = st.builds(
    lambda name, args: name if not args else f"{name}({','.join(args)})",
    st.sampled_from(_PIPE_NAMES),
    st.lists(_ARG, max_size=2),
)
_SEGMENT = st.builds(
    lambda ref, pipes: "{" + " | ".join([ref, *pipes]) + "}",
    st.sampled_from(["input.a", "input.b", "e.f", "list(input.a, e.f)"]),
    st.lists(_PIPE, max_size=4),
)
valid_expression = st.lists(
    _SEGMENT
    | st.text(max_size=5).map(lambda t: t.replace("{", "").replace("}", "").replace("\\", "")),
    min_size=1,
    max_size=4,
).map("".join)


def _expression_outcome(expression: str, value: object) -> object:
    def lookup(_namespace: str, _key: str) -> object:
        return value

    budget = EvaluationBudget(limit=1_000_000)
    return bounded(lambda: resolve_expression(expression, lookup, budget=budget))


@FUZZ
@given(expression=expression_text, value=hostile_json)
def test_arbitrary_text_only_raises_expression_error(expression: str, value: object) -> None:
    checked = bounded(lambda: validate_expression(expression))
    assert checked is None or isinstance(checked, str)
    for call in (lambda: tokenize_expression(expression), lambda: extract_refs(expression)):
        found = bounded(call)
        if isinstance(found, Rejected):
            assert isinstance(found.error, ExpressionError)
    outcome = _expression_outcome(expression, value)
    if isinstance(outcome, Rejected):
        assert isinstance(outcome.error, ExpressionError)


@FUZZ
@given(expression=valid_expression, value=hostile_json)
def test_valid_pipe_chains_over_hostile_values_only_raise_expression_error(
    expression: str, value: object
) -> None:
    outcome = _expression_outcome(expression, value)
    if isinstance(outcome, Rejected):
        assert isinstance(outcome.error, ExpressionError)


@pytest.mark.parametrize(
    "value",
    [
        HUGE_INT,
        -HUGE_INT,
        1e308 * 10,
        float("nan"),
        -0.0,
        "\ud800",
        "a\x00b",
        TEN_MB,
        deep_dict(100_000),
        b"bytes",
        object(),
    ],
    ids=[
        "huge-int",
        "neg-huge-int",
        "inf",
        "nan",
        "neg-zero",
        "surrogate",
        "nul",
        "ten-mb",
        "deep",
        "bytes",
        "object",
    ],
)
@pytest.mark.parametrize(
    "expression",
    [
        "{input.k}",
        "x{input.k}y",
        "{input.k | upper}",
        "{list(input.k, input.k) | join}",
        "{input.k | json_get(a)}",
        "{input.k | match(.*)}",
        "{input.k | int | pad(9)}",
        "{input.k | gt(1)}",
        "{input.k | urlencode}",
        "{input.k | replace(,xx)}",
    ],
)
def test_extreme_lookup_values_give_documented_outcomes(expression: str, value: object) -> None:
    outcome = _expression_outcome(expression, value)
    if isinstance(outcome, Rejected):
        assert isinstance(outcome.error, ExpressionError)


def test_regression_huge_integer_interpolation_is_an_expression_error() -> None:
    """Fix: ``x{input.n}`` with 10**5000 leaked ValueError from ``str(int)``."""
    with pytest.raises(ExpressionError, match="too long to render"):
        resolve_expression("x{input.n}", lambda _ns, _key: 10**5000)
    with pytest.raises(ExpressionError, match="too long to render"):
        resolve_expression("{list(input.n)}", lambda _ns, _key: [1, 10**5000])
    # Below the interpreter's limit nothing changes.
    assert resolve_expression("x{input.n}", lambda _ns, _key: 10**400) == "x" + str(10**400)


def test_ten_megabyte_expression_text_is_refused_by_length() -> None:
    for text in (TEN_MB, "{" * 10_000_000, "{input.a}" * 1_200_000):
        outcome = bounded(partial(tokenize_expression, text))
        assert isinstance(outcome, Rejected)
        assert isinstance(outcome.error, ExpressionError)
        assert outcome.error.code == "expression_too_large"
        assert "maximum is 16384" in (validate_expression(text) or "")


def test_nul_and_surrogates_in_expressions_are_plain_text_or_keys() -> None:
    seen: list[tuple[str, str]] = []

    def lookup(namespace: str, key: str) -> object:
        seen.append((namespace, key))
        return "v"

    assert resolve_expression("\x00{in\x00put.a\x00}", lookup) == "\x00v"
    assert seen == [("in\x00put", "a\x00")]
    # A lone surrogate is text the evaluator cannot size as UTF-8.
    with pytest.raises(ExpressionError):
        resolve_expression("\ud800{input.a}", lookup)


# --- json_get over deep or huge JSON text ---------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 100_000 + "1" + "}" * 100_000,
        '{"a": 1' + "0" * 100_000 + "}",
        '{"a": 1e999999}',
        '{"a": NaN}',
        '{"a": Infinity}',
        '{"a": "\\ud800"}',
        '{"a": "\ud800"}',
        '{"a": "' + "x" * 600_000 + '"}',
    ],
    ids=[
        "deep-array",
        "deep-object",
        "huge-int",
        "huge-exponent",
        "nan",
        "infinity",
        "escaped-surrogate",
        "raw-surrogate",
        "oversize",
    ],
)
def test_json_get_on_hostile_json_text_is_bounded(text: str) -> None:
    outcome = bounded(lambda: resolve_expression("{input.doc | json_get(a)}", lambda *_: text))
    assert outcome is None or isinstance(outcome, (Rejected, str, int, float, dict, list))
    if isinstance(outcome, Rejected):
        assert isinstance(outcome.error, ExpressionError)


# --- match: pathological regular expressions -------------------------------------------

PATHOLOGICAL = [
    (r"(a+)+$", "a" * 30 + "!"),
    (r"(a|aa)*c", "a" * 5_000),
    (r"(a*)*b", "a" * 100_000),
    (r"(.*a){20}", "a" * 40),
    (r"(\w+\s?)+$", "word " * 40 + "!"),
    (r"^(([a-z])+.)+[A-Z]([a-z])+$", "aaaaaaaaaaaaaaaaaaaaaaaaaaaa!"),
    (r"(a)\1", "aa"),
    ("(" * 2_000 + ")" * 2_000, "x"),
]


def force_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``match`` as without google-re2, its one-time warning already given."""
    monkeypatch.setattr(pipes_module, "_re2", None)
    monkeypatch.setattr(pipes_module, "_fallback_warned", True)


@pytest.mark.parametrize(("pattern", "text"), PATHOLOGICAL)
def test_pathological_regex_with_re2_is_linear(pattern: str, text: str) -> None:
    assert pipes_module.RE2_AVAILABLE
    outcome = bounded(lambda: BUILTIN_PIPES["match"](text, pattern), budget=2.0)
    assert isinstance(outcome, str)


@pytest.mark.parametrize(("pattern", "text"), PATHOLOGICAL)
def test_pathological_regex_without_re2_is_refused_within_the_documented_bound(
    monkeypatch: pytest.MonkeyPatch, pattern: str, text: str
) -> None:
    """Without RE2, a pattern whose estimated work passes the budget returns ""."""
    force_fallback(monkeypatch)
    outcome = bounded(lambda: BUILTIN_PIPES["match"](text, pattern), budget=2.0)
    assert outcome == ""


def test_fallback_still_matches_ordinary_patterns(monkeypatch: pytest.MonkeyPatch) -> None:
    force_fallback(monkeypatch)
    match = BUILTIN_PIPES["match"]
    assert match("video_12345_hd", r"\d+") == "12345"
    assert match("clip-2024-01.mp4", r"(\d+)-(\d+)\.mp4") == "2024-01.mp4"
    assert match("x" * 500_000 + "needle", "needle") == "needle"
    assert match("prefix: value", "(?:foo|bar|prefix): (\\w+)") == "prefix: value"
    assert match("test", "[invalid") == ""


def test_fallback_cost_estimate_is_an_upper_bound_in_practice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Patterns just inside the budget finish quickly on their worst text."""
    force_fallback(monkeypatch)
    for pattern, char in ((r"\d+y", "1"), (r"\d+\d+y", "1"), (r"a*a*a*b", "a"), (".*.*=.*", "x")):
        low, high = 1, 1_000_000
        while low < high:
            middle = (low + high + 1) // 2
            if fallback_regex_cost(pattern, middle) <= FALLBACK_REGEX_BUDGET:
                low = middle
            else:
                high = middle - 1
        start = time.perf_counter()
        BUILTIN_PIPES["match"](char * low, pattern)
        assert time.perf_counter() - start < 2.0


_REGEX_PIECES = st.sampled_from(
    [
        "a",
        "b",
        ".",
        "*",
        "+",
        "?",
        "|",
        "(",
        ")",
        "(?:",
        "[ab]",
        "\\d",
        "{2,5}",
        "{0,}",
        "$",
        "^",
        "\\1",
        "(?=a)",
        "(?!b)",
        "*+",
        "(?>",
        "\\",
    ]
)


@FUZZ
@given(
    pattern=st.lists(_REGEX_PIECES, max_size=16).map("".join),
    text=st.text(alphabet="ab1!", max_size=60) | st.sampled_from(["a" * 2_000, "ab" * 1_000]),
    re2=st.booleans(),
)
def test_match_is_bounded_for_any_pattern(pattern: str, text: str, re2: bool) -> None:
    saved, warned = pipes_module._re2, pipes_module._fallback_warned
    if not re2:
        pipes_module._re2, pipes_module._fallback_warned = None, True
    try:
        outcome = bounded(lambda: BUILTIN_PIPES["match"](text, pattern), budget=2.0)
    finally:
        pipes_module._re2, pipes_module._fallback_warned = saved, warned
    assert isinstance(outcome, str)


# --- the language cannot reach Python --------------------------------------------------

ESCAPES = [
    "{input.__class__}",
    "{input.a.__dict__}",
    "{input.__globals__}",
    "{e.__class__.__mro__}",
    "{().__class__.__bases__[0]}",
    "{0.__class__}",
    "{input!r}",
    "{input.a!r}",
    "{input:>10}",
    "{input.a:>10}",
    "{__import__('os').system('touch /tmp/pwned')}",
    "{input.a | __import__(os)}",
    "{input.a | getattr(__class__)}",
    "{input.a | upper.__class__}",
    "{input.a | format(x)}",
    "{eval(input.a)}",
    "{exec(input.a)}",
    "{open(input.a)}",
    "{lambda: 1}",
    "{(lambda x: x)(input.a)}",
    "{{input.a}}",
    "{input.{a}}",
    "{list(input.__class__)}",
    "{list(list(input.a))}",
    "{input.a | join(__class__)}",
    "%(input)s {input.a!s}",
    "{input.a.__init__.__globals__[os]}",
]


@pytest.mark.parametrize("expression", ESCAPES)
def test_known_escapes_raise_or_are_plain_keys(expression: str) -> None:
    """Every escape raises ExpressionError or is a plain lookup key; no Python runs."""
    calls: list[tuple[str, str]] = []
    sentinel = "plain-value"

    def lookup(namespace: str, key: str) -> object:
        assert type(namespace) is str and type(key) is str
        calls.append((namespace, key))
        return sentinel

    try:
        result = resolve_expression(expression, lookup)
    except ExpressionError:
        assert validate_expression(expression) is not None or calls == []
        return
    # Accepted: the result is built only from text and lookup values.
    assert result is None or isinstance(result, (str, list))
    assert validate_expression(expression) is None
    rendered = result if isinstance(result, str) else repr(result)
    assert "<" not in rendered  # no repr of a Python object, class or function
    assert calls, "an accepted expression reads only through the lookup"


def test_dunder_keys_read_no_attributes_from_real_values() -> None:
    """With the engine's own lookup, dunder names are missing keys: null."""
    outputs = {"e": (OutputRef(id="o1", fields={"f": "x"}),)}
    lookup = build_expression_lookup(outputs, {"a": "text"})
    for expression in (
        "{input.__class__}",
        "{input.a.__len__}",
        "{e.__dict__}",
        "{e.f.__class__}",
        "{input.__builtins__}",
        "{e.__init__}",
    ):
        assert resolve_expression(expression, lookup) is None
    assert resolve_expression("{list(input.__class__, e.__dict__)}", lookup) == [None, None]


def test_only_listed_pipes_and_list_are_callable() -> None:
    vocabulary = get_expression_vocabulary()
    assert vocabulary.functions == ("list",)
    names = {spec.name for spec in vocabulary.pipes}
    assert names == set(BUILTIN_PIPES)
    for name in (
        "eval",
        "exec",
        "open",
        "getattr",
        "format",
        "__import__",
        "print",
        "str",
        "type",
        "vars",
        "globals",
        "compile",
        "setattr",
        "repr",
    ):
        problem = validate_expression(f"{{input.a | {name}}}")
        assert problem == f"Unknown pipe '{name}'"
        with pytest.raises(ExpressionError):
            resolve_expression(f"{{{name}(input.a)}}", lambda *_: "x")
