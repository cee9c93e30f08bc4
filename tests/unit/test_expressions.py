"""The expression language (contracts EX-01..EX-15, LM-23..LM-26, BD-09 charging, IM-13)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dagwerk.expressions as expressions_module
from dagwerk.constants import (
    MAX_EXPRESSION_EVALUATION_STEPS,
    MAX_EXPRESSION_LENGTH,
    MAX_EXPRESSION_RESULT_BYTES,
    MAX_PIPE_ARGUMENT_LENGTH,
)
from dagwerk.errors import ExpressionError
from dagwerk.expressions import (
    EvaluationBudget,
    PipeCall,
    PipeSpec,
    Token,
    expression_evaluation_steps,
    extract_refs,
    get_expression_vocabulary,
    resolve_expression,
    tokenize_expression,
    validate_expression,
)
from dagwerk.json import FrozenDict, bounded_json_size
from dagwerk.models import ExpressionError as ModelsExpressionError
from dagwerk.models import ExpressionSource
from dagwerk.pipes import BUILTIN_PIPES

Lookup = Callable[[str, str], object | None]


def make_lookup(
    edges: dict[str, dict[str, object]] | None = None,
    run_input: dict[str, object] | None = None,
) -> Lookup:
    edge_values = edges or {}
    input_values = run_input or {}

    def lookup(namespace: str, key: str) -> object | None:
        if namespace == "input":
            return input_values.get(key)
        return edge_values.get(namespace, {}).get(key)

    return lookup


def counting_lookup(value: object) -> tuple[Lookup, list[tuple[str, str]]]:
    calls: list[tuple[str, str]] = []

    def lookup(namespace: str, key: str) -> object:
        calls.append((namespace, key))
        return value

    return lookup, calls


def error_of(expression: str) -> str:
    with pytest.raises(ExpressionError) as info:
        tokenize_expression(expression)
    return str(info.value)


def test_expression_error_is_shared_with_models() -> None:
    assert ModelsExpressionError is ExpressionError
    assert issubclass(ExpressionError, ValueError)


# --- EX-01: braces and text ---------------------------------------------------


def test_ex_01_plain_text_and_empty_expression() -> None:
    assert tokenize_expression("hello world") == (Token("text", "hello world", ()),)
    assert tokenize_expression("") == ()


def test_ex_01_escaped_braces_and_literal_backslashes() -> None:
    assert tokenize_expression("\\{not a ref\\}") == (Token("text", "{not a ref}", ()),)
    assert tokenize_expression("C:\\path\\n") == (Token("text", "C:\\path\\n", ()),)
    # An escaped opening brace leaves the closing one unmatched.
    assert error_of("\\{a.b}") == "Unexpected '}' at position 5"


def test_ex_01_double_backslash_before_brace_escapes_the_brace() -> None:
    # The first backslash is literal; the second escapes the brace.
    assert tokenize_expression("\\\\{x\\}") == (Token("text", "\\{x}", ()),)


def test_ex_01_brace_errors_carry_positions() -> None:
    assert error_of("ab{slug.key") == "Unclosed '{' at position 2"
    assert error_of("text}") == "Unexpected '}' at position 4"
    assert "nested braces are not supported at position 3" in error_of("{a.{b}}")
    assert "nested braces are not supported" in error_of("{a.b {")
    assert "Empty reference" in error_of("{}")
    assert "Empty reference" in error_of("x{   }")


def test_ex_01_whitespace_around_the_segment_is_ignored() -> None:
    tokens = tokenize_expression("{ slug.key | upper }")
    assert tokens == (Token("ref", "slug.key", (PipeCall("upper", ()),)),)


def test_ex_01_text_and_segments_alternate() -> None:
    assert tokenize_expression("Hello {input.name}!") == (
        Token("text", "Hello ", ()),
        Token("ref", "input.name", ()),
        Token("text", "!", ()),
    )
    assert len(tokenize_expression("{a.x} and {b.y}")) == 3


# --- EX-02, EX-03: references ---------------------------------------------------


def test_ex_02_namespace_is_before_the_first_dot() -> None:
    lookup, calls = counting_lookup("found")
    assert resolve_expression("{slug.nested.key}", lookup) == "found"
    assert calls == [("slug", "nested.key")]


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("{nodot}", "Invalid reference 'nodot' at position 0: expected 'namespace.key'"),
        ("{.value}", "namespace cannot be empty"),
        ("{input.}", "key cannot be empty"),
        ("{list(input.)}", "key cannot be empty"),
        ("{list(.value)}", "namespace cannot be empty"),
        ("{list(bad)}", "Invalid reference 'bad' at position 0: expected 'namespace.key'"),
    ],
)
def test_ex_02_reference_errors(expression: str, message: str) -> None:
    assert message in (validate_expression(expression) or "")
    with pytest.raises(ExpressionError, match="reference"):
        resolve_expression(expression, make_lookup())


def test_ex_03_input_and_edge_namespaces_are_passed_to_the_lookup() -> None:
    lookup = make_lookup(edges={"config": {"quality": "high"}}, run_input={"source": "s3://x"})
    assert resolve_expression("{config.quality}", lookup) == "high"
    assert resolve_expression("{input.source}", lookup) == "s3://x"


# --- EX-04: pipes ------------------------------------------------------------


def test_ex_04_pipe_chains_and_arguments() -> None:
    assert tokenize_expression("{s.k | replace(a,b) | truncate(50)}")[0].pipes == (
        PipeCall("replace", ("a", "b")),
        PipeCall("truncate", ("50",)),
    )
    assert tokenize_expression("{s.k | replace( a , b )}")[0].pipes == (
        PipeCall("replace", ("a", "b")),
    )


def test_ex_04_bar_inside_parentheses_is_an_argument() -> None:
    assert tokenize_expression("{s.k | replace(|,-) | upper}")[0].pipes == (
        PipeCall("replace", ("|", "-")),
        PipeCall("upper", ()),
    )


@pytest.mark.parametrize("expression", ["{slug.key | }", "{s.k | upper | | lower}", "{s.k |  }"])
def test_ex_04_empty_pipe_is_rejected(expression: str) -> None:
    assert "Empty pipe in chain" in error_of(expression)


def test_ex_04_unclosed_pipe_parenthesis() -> None:
    assert "Unclosed '(' in pipe 'replace'" in error_of("{slug.key | replace(old}")


@pytest.mark.parametrize(
    ("pipe", "args"),
    [
        ("replace(foo\\,bar,baz)", ("foo,bar", "baz")),
        ("replace(foo\\,bar)", ("foo,bar",)),
        ("in(a,,b)", ("a", "", "b")),
        ("in(a,b,)", ("a", "b")),
        ("in(a,,)", ("a", "")),
        ("join()", ()),
        ("join( )", ()),
        ("match(\\d+)", ("\\d+",)),
    ],
)
def test_ex_04_argument_splitting(pipe: str, args: tuple[str, ...]) -> None:
    assert tokenize_expression(f"{{s.k | {pipe}}}")[0].pipes[0].args == args


def test_lm_26_pipe_argument_length_boundary() -> None:
    argument = "x" * MAX_PIPE_ARGUMENT_LENGTH
    assert validate_expression(f"{{s.k | default({argument})}}") is None
    problem = validate_expression(f"{{s.k | default({argument}x)}}") or ""
    assert "argument" in problem
    assert str(MAX_PIPE_ARGUMENT_LENGTH) in problem


# --- EX-05: list() ------------------------------------------------------------


def test_ex_05_list_tokens() -> None:
    assert tokenize_expression("{list(a.x, b.y) | join(-)}") == (
        Token("call", "list", (PipeCall("join", ("-",)),), ("a.x", "b.y")),
    )
    assert tokenize_expression("{list()}") == (Token("call", "list", (), ()),)
    assert tokenize_expression("{list(a.x,, ,b.y,)}")[0].refs == ("a.x", "b.y")


@pytest.mark.parametrize(
    ("expression", "lookup_data", "expected"),
    [
        ("{list(a.x, b.y)}", {"a.x": "1", "b.y": "2"}, ["1", "2"]),
        ("{list(a.x, b.y) | join(-)}", {"a.x": "1", "b.y": "2"}, "1-2"),
        ("{list(a.missing, b.y)}", {"b.y": "2"}, [None, "2"]),
        ("{list(a.missing, b.y) | compact | first}", {"b.y": "2"}, "2"),
        ("{list()}", {}, []),
        ("{list(a.x, b.y) | flatten}", {"a.x": ["1", "2"], "b.y": "3"}, ["1", "2", "3"]),
        ("prefix {list(a.x, b.y)} suffix", {"a.x": "1", "b.y": "2"}, "prefix 1, 2 suffix"),
    ],
)
def test_ex_05_list_evaluation(
    expression: str, lookup_data: dict[str, object], expected: object
) -> None:
    def lookup(namespace: str, key: str) -> object | None:
        return lookup_data.get(f"{namespace}.{key}")

    assert resolve_expression(expression, lookup) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("{list(other(edge.value))}", "Nested function calls are not supported at position 0"),
        ("{unknown_fn(a.b)}", "Unknown function 'unknown_fn'"),
        ("{list(a.b) upper}", "Expected '|' after function call"),
        ("{list(a.b}", "Unclosed '(' in function 'list'"),
        ("{list(a.b) | }", "Empty pipe in chain"),
    ],
)
def test_ex_05_list_errors(expression: str, message: str) -> None:
    assert message in error_of(expression)


def test_ex_05_list_accepts_at_most_64_references() -> None:
    refs = [f"edge.value_{index}" for index in range(MAX_EXPRESSION_EVALUATION_STEPS)]
    assert validate_expression(f"{{list({','.join(refs)})}}") is None
    refs.append("edge.extra")
    assert "references" in (validate_expression(f"{{list({','.join(refs)})}}") or "")


# --- EX-06, EX-07: parse-time limits ---------------------------------------------


def test_ex_06_lm_25_step_boundary() -> None:
    exact = "{edge.value" + " | trim" * (MAX_EXPRESSION_EVALUATION_STEPS - 1) + "}"
    assert expression_evaluation_steps(exact) == MAX_EXPRESSION_EVALUATION_STEPS
    over = "{edge.value" + " | trim" * MAX_EXPRESSION_EVALUATION_STEPS + "}"
    assert "reference and pipe evaluations" in error_of(over)


def test_ex_06_steps_count_refs_list_arguments_and_pipes() -> None:
    assert expression_evaluation_steps("text only") == 0
    assert expression_evaluation_steps("{a.b} {c.d | upper}") == 3
    assert expression_evaluation_steps("{list(a.b, c.d) | compact | first}") == 4
    assert expression_evaluation_steps("{list()}") == 0
    many = "{list(" + ",".join(f"e.k{i}" for i in range(60)) + ")} {a.b | t | u | v | w}"
    assert "reference and pipe evaluations" in error_of(many)


def test_ex_06_step_limit_is_checked_before_any_lookup() -> None:
    lookup, calls = counting_lookup("value")
    with pytest.raises(ExpressionError, match="reference and pipe evaluations"):
        resolve_expression("{edge.value}" * (MAX_EXPRESSION_EVALUATION_STEPS + 1), lookup)
    assert calls == []


def test_ex_07_lm_23_expression_length_boundary() -> None:
    exact = "x" * MAX_EXPRESSION_LENGTH
    assert tokenize_expression(exact) == (Token("text", exact, ()),)
    with pytest.raises(ExpressionError, match="characters; maximum is 16384") as info:
        tokenize_expression(exact + "x")
    assert info.value.limit == MAX_EXPRESSION_LENGTH


def test_ex_07_models_enforce_expression_length() -> None:
    exact = "x" * MAX_EXPRESSION_LENGTH
    assert ExpressionSource(expression=exact).expression == exact
    with pytest.raises(ValueError, match="at most"):
        ExpressionSource(expression=exact + "x")


def test_tokenize_is_cached() -> None:
    first = tokenize_expression("{cached.value | upper}")
    assert tokenize_expression("{cached.value | upper}") is first
    assert tokenize_expression.cache_info().hits >= 1


# --- EX-08: static validation ------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("{slug.key | upper(x)}", "Pipe 'upper' expects 0 arg(s), got 1"),
        ("{slug.key | replace}", "Pipe 'replace' expects 1-2 arg(s), got 0"),
        ("{slug.key | replace(a,b,c)}", "Pipe 'replace' expects 1-2 arg(s), got 3"),
        ("{slug.key | eq}", "Pipe 'eq' expects 1 arg(s), got 0"),
        ("{slug.key | bogus}", "Unknown pipe 'bogus'"),
        ("{list(a.x) | bogus}", "Unknown pipe 'bogus'"),
        ("{slug.key", "Unclosed"),
    ],
)
def test_ex_08_validate_reports_problems(expression: str, message: str) -> None:
    assert message in (validate_expression(expression) or "")


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "just text",
        "{s.k | trim | upper | truncate(50)}",
        "{edge.key | replace(old,new)}",
        "{edge.value | truncate(97) | append(...)}",
        "{edge.kind | in(first, second)}",
        "{list(a.x) | join(-)}",
        "{s.k | in(" + ",".join(str(i) for i in range(32)) + ")}",
    ],
)
def test_ex_08_valid_expressions(expression: str) -> None:
    assert validate_expression(expression) is None


def test_ex_08_in_accepts_at_most_32_options() -> None:
    options = ",".join(str(i) for i in range(33))
    assert validate_expression(f"{{s.k | in({options})}}") == (
        "Pipe 'in' expects 1-32 arg(s), got 33"
    )


# --- EX-09 .. EX-11: evaluation ------------------------------------------------------


def test_ex_09_lone_reference_keeps_its_json_type() -> None:
    lookup = make_lookup(edges={"src": {"size": 42000, "urls": ["a", "b"], "ok": False}})
    assert resolve_expression("{src.size}", lookup) == 42000
    assert resolve_expression("{src.urls}", lookup) == ["a", "b"]
    assert resolve_expression("{ src.ok }", lookup) is False
    assert resolve_expression("{src.size | int}", lookup) == 42000


def test_ex_09_lone_reference_thaws_persisted_containers() -> None:
    value = FrozenDict({"items": [{"rank": 1}]})
    result = resolve_expression("{src.value}", lambda _ns, _key: value)
    assert result == {"items": [{"rank": 1}]}
    assert isinstance(result, dict)
    assert isinstance(result["items"], list)
    assert isinstance(resolve_expression("{src.value}", lambda _ns, _key: (1, 2)), list)


def test_ex_09_text_or_several_segments_give_a_string() -> None:
    lookup = make_lookup(edges={"r": {"title": "Inception", "year": 2010}})
    assert resolve_expression("{r.title} ({r.year})", lookup) == "Inception (2010)"
    assert resolve_expression("{r.year}{r.year}", lookup) == "20102010"
    assert resolve_expression("just text", lookup) == "just text"


def test_ex_10_missing_values() -> None:
    lookup = make_lookup(edges={"src": {"name": "hello"}})
    assert resolve_expression("{missing.key}", lookup) is None
    assert resolve_expression("{missing.key | upper}", lookup) == ""
    assert resolve_expression("{missing.key | default(fallback)}", lookup) == "fallback"
    assert resolve_expression("{src.name} {missing.key}", lookup) == "hello "
    assert resolve_expression("{a.x}{b.y}", lookup) is None
    assert resolve_expression("", lookup) is None
    with pytest.raises(ExpressionError, match="Required value is missing"):
        resolve_expression("{missing.key | required}", lookup)


def test_ex_10_null_is_replaced_before_every_pipe() -> None:
    lookup = make_lookup(edges={"src": {"items": []}})
    # first -> null, then "" reaches default.
    assert resolve_expression("{src.items | first | default(none)}", lookup) == "none"
    assert resolve_expression("{src.items | first}", lookup) is None


def test_ex_11_interpolation_rendering() -> None:
    lookup = make_lookup(
        edges={
            "src": {
                "tags": ["one", "two"],
                "values": [None, 0, False, "", "last"],
                "flag": True,
                "obj": {"rank": 1},
                "ratio": 0.5,
                "nested": [[1, None], {"a": None}],
            }
        },
        run_input={"tags": ("three", "four")},
    )
    assert resolve_expression("e={src.tags}; i={input.tags}", lookup) == (
        "e=one, two; i=three, four"
    )
    assert resolve_expression("values={src.values}", lookup) == "values=0, False, , last"
    assert resolve_expression("{src.flag}/{src.obj}/{src.ratio}", lookup) == (
        "True/{'rank': 1}/0.5"
    )
    assert resolve_expression("n={src.nested}", lookup) == "n=[1, None], {'a': None}"
    assert resolve_expression("p {list(input.tags) | first} s", lookup) == "p three, four s"


# --- EX-12, LM-24: result sizes ---------------------------------------------------------


def test_ex_12_standalone_result_size_boundary() -> None:
    exact = "x" * (MAX_EXPRESSION_RESULT_BYTES - 2)
    assert resolve_expression("{input.v}", make_lookup(run_input={"v": exact})) == exact
    with pytest.raises(ExpressionError, match="maximum is") as info:
        resolve_expression("{input.v}", make_lookup(run_input={"v": exact + "x"}))
    assert info.value.limit == MAX_EXPRESSION_RESULT_BYTES


def test_ex_12_interpolation_result_size_boundary() -> None:
    exact = "x" * (MAX_EXPRESSION_RESULT_BYTES - 4)
    lookup = make_lookup(run_input={"v": exact})
    assert resolve_expression("p{input.v}s", lookup) == f"p{exact}s"
    with pytest.raises(ExpressionError, match="maximum is"):
        resolve_expression("p{input.v}s", make_lookup(run_input={"v": exact + "x"}))


def test_ex_12_interpolation_stops_looking_up_after_crossing_the_limit() -> None:
    lookup, calls = counting_lookup("x" * (MAX_EXPRESSION_RESULT_BYTES // 2))
    with pytest.raises(ExpressionError, match="maximum"):
        resolve_expression("{input.v}{input.v}{input.v}", lookup)
    assert len(calls) == 2


def test_ex_12_list_stops_looking_up_after_crossing_the_limit() -> None:
    exact = "x" * (MAX_EXPRESSION_RESULT_BYTES - 4)
    assert resolve_expression("{list(input.v)}", make_lookup(run_input={"v": exact})) == [exact]
    lookup, calls = counting_lookup("x" * (MAX_EXPRESSION_RESULT_BYTES // 2))
    with pytest.raises(ExpressionError, match="maximum"):
        resolve_expression("{list(a.b, a.b, a.b)}", lookup)
    assert len(calls) == 2


def test_ex_12_pipe_result_size_boundary() -> None:
    value = "x" * (MAX_EXPRESSION_RESULT_BYTES - 3)
    lookup = make_lookup(run_input={"v": value})
    assert resolve_expression("{input.v | append(y)}", lookup) == value + "y"
    with pytest.raises(ExpressionError, match="maximum is"):
        resolve_expression("{input.v | append(yz)}", lookup)


def test_ex_12_pipes_use_the_engine_result_limit() -> None:
    lookup = make_lookup(run_input={"v": "abcdef"})
    assert resolve_expression("{input.v}", lookup, max_result_bytes=8) == "abcdef"
    with pytest.raises(ExpressionError, match="maximum is 8"):
        resolve_expression("{input.v | append(x)}", lookup, max_result_bytes=8)
    with pytest.raises(ExpressionError, match="maximum is 7"):
        resolve_expression("{input.v}", lookup, max_result_bytes=7)
    big = "x" * MAX_EXPRESSION_RESULT_BYTES
    larger = MAX_EXPRESSION_RESULT_BYTES * 2
    result = resolve_expression(
        "{input.v | append(y)}", make_lookup(run_input={"v": big}), max_result_bytes=larger
    )
    assert result == big + "y"
    with pytest.raises(ValueError, match="max_result_bytes"):
        resolve_expression("{input.v}", lookup, max_result_bytes=-1)


def test_ex_12_replace_amplification_fails_before_building() -> None:
    lookup = make_lookup(edges={"source": {"value": "a" * MAX_PIPE_ARGUMENT_LENGTH}})
    replacement = "x" * MAX_PIPE_ARGUMENT_LENGTH
    with pytest.raises(ExpressionError, match="maximum is"):
        resolve_expression(f"{{source.value | replace(a,{replacement})}}", lookup)


def test_ex_12_pipe_results_are_frozen_before_the_next_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipes = dict(BUILTIN_PIPES)
    pipes["array"] = lambda _value: (1, FrozenDict({"a": (2,)}))
    pipes["kind"] = lambda value: type(value).__name__ + "/" + type(value[1]["a"]).__name__
    pipes["bad"] = lambda _value: {1, 2}
    pipes["nan"] = lambda _value: float("nan")
    monkeypatch.setattr(expressions_module, "BUILTIN_PIPES", pipes)
    lookup = make_lookup(edges={"src": {"value": "ignored"}})
    assert resolve_expression("{src.value | array | kind}", lookup) == "list/list"
    assert resolve_expression("{src.value | array}", lookup) == [1, {"a": [2]}]
    with pytest.raises(ExpressionError, match="not JSON-compatible"):
        resolve_expression("{src.value | bad}", lookup)
    with pytest.raises(ExpressionError, match="not JSON-compatible"):
        resolve_expression("{src.value | nan}", lookup)


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value", [object(), float("inf"), {1: "a"}, _nested(17), {"a"}])
def test_ex_12_non_json_reference_values_are_rejected(value: object) -> None:
    with pytest.raises(ExpressionError, match="not JSON-compatible"):
        resolve_expression("x {src.value}", lambda _ns, _key: value)


# --- EX-13: evaluation-time pipe errors ---------------------------------------------------


def test_ex_13_pipe_arity_mismatch_names_the_pipe() -> None:
    lookup = make_lookup(edges={"src": {"name": "hello"}})
    with pytest.raises(ExpressionError, match="Pipe 'replace' expects 1-2 arg"):
        resolve_expression("{src.name | replace}", lookup)
    with pytest.raises(ExpressionError, match="Pipe 'upper' expects 0 arg"):
        resolve_expression("x {src.name | upper(a)}", lookup)


def test_ex_13_unknown_pipe_at_evaluation() -> None:
    lookup, calls = counting_lookup("v")
    with pytest.raises(ExpressionError, match="Unknown pipe 'bogus'"):
        resolve_expression("{src.name | bogus}", lookup)
    assert calls == [("src", "name")]


def test_ex_13_unexpected_pipe_failures_become_expression_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(_value: object) -> object:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(expressions_module, "BUILTIN_PIPES", {"broken": broken})
    with pytest.raises(ExpressionError, match="pipe 'broken' failed"):
        resolve_expression("{src.name | broken}", lambda _ns, _key: "v")


# --- EX-14, EX-15 -----------------------------------------------------------------------


def test_ex_14_extract_refs() -> None:
    assert extract_refs("{export_1.url} {fetch_1.path}") == ({"export_1", "fetch_1"}, set())
    assert extract_refs("{input.source} {input.quality}") == (set(), {"source", "quality"})
    assert extract_refs("{config.output_dir}") == ({"config"}, set())
    assert extract_refs("{e.url | upper} - {input.name}") == ({"e"}, {"name"})
    assert extract_refs("{src_1.a} {src_1.b}") == ({"src_1"}, set())
    assert extract_refs("{list(input.name, node.val)}") == ({"node"}, {"name"})
    assert extract_refs("{input.a.b}") == (set(), {"a.b"})
    assert extract_refs("no references") == (set(), set())
    with pytest.raises(ExpressionError):
        extract_refs("{unclosed")


def test_ex_15_vocabulary() -> None:
    vocabulary = get_expression_vocabulary()
    assert vocabulary.functions == ("list",)
    assert [spec.name for spec in vocabulary.pipes] == list(BUILTIN_PIPES)
    specs = {spec.name: spec for spec in vocabulary.pipes}
    assert specs["upper"] == PipeSpec("upper", 0, 0, ())
    assert specs["replace"] == PipeSpec("replace", 1, 2, ("old", "new"))
    assert specs["in"] == PipeSpec("in", 1, 32, ("options",))
    names = {
        "strip": ("chars",),
        "lstrip": ("chars",),
        "rstrip": ("chars",),
        "default": ("fallback",),
        "nth": ("index",),
        "join": ("sep",),
        "truncate": ("length",),
        "prepend": ("prefix",),
        "append": ("suffix",),
        "match": ("pattern",),
        "json_get": ("key",),
        "pad": ("width",),
        "eq": ("expected",),
        "neq": ("expected",),
        "gt": ("threshold",),
        "lt": ("threshold",),
    }
    for name, spec in specs.items():
        assert spec.argument_names == names.get(name, spec.argument_names), name
        if spec.max_args == 0:
            assert spec.argument_names == (), name


# --- BD-09: budget charging ---------------------------------------------------------------


def test_bd_09_budget_is_cumulative() -> None:
    budget = EvaluationBudget(5)
    lookup = make_lookup(run_input={"value": "abc"})
    assert resolve_expression("{input.value}", lookup, budget=budget) == "abc"
    assert budget.used == 5
    with pytest.raises(ExpressionError, match="binding evaluation exceeds the 5-byte launch limit"):
        resolve_expression("{input.value}", lookup, budget=budget)
    assert budget.used == 5


@pytest.mark.parametrize(
    ("expression", "charged"),
    [
        ("{input.v}", 5),  # lookup
        ("{input.v | upper}", 10),  # lookup + pipe result
        ("{input.v | upper | lower}", 15),
        ("x{input.v}", 11),  # lookup + interpolated "xabc"
        ("{list(input.v)}", 12),  # lookup + function result ["abc"]
        ("{list(input.v, input.v)}", 23),
        ("text", 6),  # interpolated string only
        ("{input.missing}", 4),  # null
    ],
)
def test_bd_09_every_intermediate_value_is_charged(expression: str, charged: int) -> None:
    budget = EvaluationBudget(1000)
    resolve_expression(expression, make_lookup(run_input={"v": "abc"}), budget=budget)
    assert budget.used == charged


def test_bd_09_budget_validation() -> None:
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError):
            EvaluationBudget(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        EvaluationBudget(5, used=6)
    budget = EvaluationBudget(10)
    with pytest.raises(ValueError):
        budget.charge_size(-1)
    budget.charge(["ab"])
    assert budget.used == 6
    with pytest.raises(ExpressionError, match="10-byte launch limit"):
        budget.charge("x" * 1000)
    assert budget.used == 6


# --- IM-13: hostile values through evaluation -------------------------------------------


def test_im_13_hostile_pipe_inputs_do_not_escape_evaluation() -> None:
    lookup = make_lookup(
        run_input={
            "deep": "[" * 100_000,
            "deep_object": '{"a":' * 50_000,
            "huge": "9" * 200_000,
            "exp": "1e1000000000",
            "text": "a" * 50_000,
        }
    )
    start = time.perf_counter()
    assert resolve_expression("{input.deep | json_get(a)}", lookup) is None
    assert resolve_expression("{input.deep_object | json_get(a)}", lookup) is None
    assert resolve_expression("{input.huge | gt(1e199999)}", lookup) is True
    assert resolve_expression("{input.exp | int}", lookup) == 0
    assert resolve_expression("{input.exp | pad(3)}", lookup) == "1e1000000000"
    assert resolve_expression("{input.text | match((a+)+b)}", lookup) == ""
    assert resolve_expression("{input.text | match((a|aa)*c)}", lookup) == ""
    assert time.perf_counter() - start < 10


def test_im_13_huge_integer_reference_is_an_expression_error() -> None:
    with pytest.raises(ExpressionError):
        resolve_expression("{input.n | gt(1)}", lambda _ns, _key: 10**5000)


# --- properties -------------------------------------------------------------------------

_IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
_KEY = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,6}", fullmatch=True)
_PLAIN_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="{}\\"),
    min_size=1,
    max_size=8,
)
_ARG = st.text(
    alphabet=st.characters(
        exclude_characters="{}()\\", exclude_categories=("Cs", "Zs", "Cc", "Zl", "Zp")
    )
    | st.sampled_from([" ", "|", ","]),
    max_size=6,
).map(str.strip)
_PAD = st.sampled_from(["", " ", "  "])


@st.composite
def _pipe(draw: st.DrawFn) -> tuple[str, PipeCall]:
    name = draw(st.sampled_from(list(BUILTIN_PIPES)) | _IDENT)
    args = draw(st.lists(_ARG, max_size=3))
    expected = tuple(args[:-1] if args and args[-1] == "" else args)
    if not args and draw(st.booleans()):
        return name, PipeCall(name, ())
    rendered = ",".join(arg.replace(",", "\\,") for arg in args)
    return f"{name}({rendered})", PipeCall(name, expected)


@st.composite
def _segment(draw: st.DrawFn) -> tuple[str, Token]:
    pipes = draw(st.lists(_pipe(), max_size=3))
    chain = "".join(f"{draw(_PAD)}|{draw(_PAD)}{text}" for text, _ in pipes)
    calls = tuple(call for _, call in pipes)
    if draw(st.booleans()):
        ref = f"{draw(st.just('input') | _IDENT)}.{draw(_KEY)}"
        return f"{{{draw(_PAD)}{ref}{chain}{draw(_PAD)}}}", Token("ref", ref, calls)
    refs = draw(st.lists(st.builds(lambda n, k: f"{n}.{k}", _IDENT, _KEY), max_size=3))
    args = ",".join(f"{draw(_PAD)}{ref}" for ref in refs)
    return f"{{list({args}){chain}}}", Token("call", "list", calls, tuple(refs))


@st.composite
def _expression(draw: st.DrawFn) -> tuple[str, tuple[Token, ...]]:
    parts: list[str] = []
    tokens: list[Token] = []
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            text, token = draw(_segment())
        else:
            raw = draw(st.lists(_PLAIN_TEXT | st.sampled_from(["\\{", "\\}"]), min_size=1))
            text = "".join(raw)
            plain = "".join(piece[1] if piece in ("\\{", "\\}") else piece for piece in raw)
            if tokens and tokens[-1].kind == "text":
                plain = tokens.pop().value + plain
            token = Token("text", plain, ())
        parts.append(text)
        tokens.append(token)
    return "".join(parts), tuple(tokens)


@settings(max_examples=200, deadline=None)
@given(_expression())
def test_ex_01_ex_04_property_tokenizer_round_trip(case: tuple[str, tuple[Token, ...]]) -> None:
    expression, expected = case
    assert tokenize_expression(expression) == expected
    problem = validate_expression(expression)
    for token in expected:
        for call in token.pipes:
            if call.name not in BUILTIN_PIPES:
                assert problem is not None


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["1e1000000000", "[" * 40, '{"a": [1, {"b": 2}]}', "3.7", "-0", "nan"]),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)
_NOISE = st.text(alphabet=st.sampled_from(list("{}()|,.\\ ab_1")) | st.characters(), max_size=60)


def _check_resolution(expression: str, value: object, limit: int) -> None:
    budget = EvaluationBudget(2_000)
    try:
        result = resolve_expression(
            expression, lambda _ns, _key: value, budget=budget, max_result_bytes=limit
        )
    except ExpressionError:
        return
    finally:
        assert 0 <= budget.used <= budget.limit
    assert bounded_json_size(result, limit) <= limit


@settings(max_examples=200, deadline=None)
@given(_NOISE, _JSON, st.sampled_from([16, 200, MAX_EXPRESSION_RESULT_BYTES]))
def test_ex_property_arbitrary_text_raises_only_expression_errors(
    expression: str, value: object, limit: int
) -> None:
    try:
        tokens = tokenize_expression(expression)
    except ExpressionError as exc:
        assert validate_expression(expression) == str(exc)
    else:
        assert isinstance(tokens, tuple)
        assert validate_expression(expression) is None or isinstance(
            validate_expression(expression), str
        )
    _check_resolution(expression, value, limit)


_HOSTILE_ARG = st.sampled_from(
    ["", "0", "1", "-1", "2", "abc", "1e999999", "(a+)+b", "[", "a", "x" * 50, "9" * 500, ";"]
)


@st.composite
def _hostile_expression(draw: st.DrawFn) -> str:
    segments = []
    for _ in range(draw(st.integers(1, 3))):
        chain = ""
        for _ in range(draw(st.integers(0, 4))):
            name = draw(st.sampled_from(list(BUILTIN_PIPES)))
            args = draw(st.lists(_HOSTILE_ARG, max_size=2))
            chain += f" | {name}({','.join(args)})" if args else f" | {name}"
        source = draw(st.sampled_from(["e.v", "list(e.v, input.w)", "input.v"]))
        segments.append(f"{{{source}{chain}}}")
    glue = draw(st.sampled_from(["", " - "]))
    return glue.join(segments)


@settings(max_examples=200, deadline=None)
@given(_hostile_expression(), _JSON, st.sampled_from([16, 200, MAX_EXPRESSION_RESULT_BYTES]))
def test_ex_property_pipes_on_arbitrary_json_stay_within_limits(
    expression: str, value: object, limit: int
) -> None:
    assert validate_expression(expression) is None or "Pipe '" in (
        validate_expression(expression) or ""
    )
    _check_resolution(expression, value, limit)
