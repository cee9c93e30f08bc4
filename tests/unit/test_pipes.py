"""The built-in pipes (contracts PP-01..PP-24, LM-26/LM-27, pipe parts of IM-13)."""

from __future__ import annotations

import importlib.util
import sys
import time
import warnings
from types import MappingProxyType, ModuleType

import pytest

import dagwerk.pipes as pipes_module
from dagwerk.constants import (
    MAX_EXPRESSION_RESULT_BYTES,
    MAX_PIPE_ARGUMENT_LENGTH,
    MAX_PIPE_INTEGER_DIGITS,
)
from dagwerk.errors import ExpressionError
from dagwerk.json import FrozenDict
from dagwerk.pipes import BUILTIN_PIPES, PIPE_ARITY, bounded_text_join, result_byte_limit

P = BUILTIN_PIPES

EXPECTED_ORDER = [
    *("upper", "lower", "trim", "title", "replace", "strip", "lstrip", "rstrip", "default"),
    *("required", "first", "last", "nth", "join", "basename", "dirname", "stem", "ext"),
    *("urlencode", "urldecode", "int", "string", "truncate", "prepend", "append", "match"),
    *("json_get", "flatten", "compact", "pad", "not", "eq", "neq", "gt", "lt", "in"),
]


# --- registry --------------------------------------------------------------


def test_registry_lists_36_pipes_in_seed_order() -> None:
    assert list(BUILTIN_PIPES) == EXPECTED_ORDER
    assert len(BUILTIN_PIPES) == 36
    assert list(PIPE_ARITY) == EXPECTED_ORDER


def test_registry_is_read_only() -> None:
    assert isinstance(BUILTIN_PIPES, MappingProxyType)
    with pytest.raises(TypeError):
        BUILTIN_PIPES["evil"] = lambda value: value  # type: ignore[index]


def test_pipe_arity_table() -> None:
    optional = {
        "strip",
        "lstrip",
        "rstrip",
        "default",
        "nth",
        "join",
        "truncate",
        "prepend",
        "append",
        "match",
        "json_get",
        "pad",
    }
    for name in EXPECTED_ORDER:
        if name == "replace":
            expected = (1, 2)
        elif name in optional:
            expected = (0, 1)
        elif name in {"eq", "neq", "gt", "lt"}:
            expected = (1, 1)
        elif name == "in":
            expected = (1, 32)
        else:
            expected = (0, 0)
        assert PIPE_ARITY[name] == expected, name


# --- PP-01 .. PP-05: text ---------------------------------------------------


@pytest.mark.parametrize(
    ("pipe", "value", "expected"),
    [
        ("upper", "hello", "HELLO"),
        ("lower", "HeLLo", "hello"),
        ("trim", "  hi \n", "hi"),
        ("title", "hello world", "Hello World"),
        ("upper", True, "TRUE"),
        ("lower", 1.5, "1.5"),
        ("upper", {"a": None}, "{'A': NONE}"),
    ],
)
def test_pp_01_basic_text_pipes_use_python_text(pipe: str, value: object, expected: str) -> None:
    assert P[pipe](value) == expected


def test_pp_02_replace_and_delete() -> None:
    assert P["replace"]("hello world", "world", "earth") == "hello earth"
    assert P["replace"]("hello.tmp", ".tmp") == "hello"
    assert P["replace"]("ab", "", "-") == "-a-b-"


def test_pp_02_replace_checks_amplification_before_building(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[int] = []

    class SpyStr(str):
        def replace(self, old: str, new: str, count: int = -1) -> str:  # type: ignore[override]
            built.append(1)
            return str.replace(self, old, new, count)

    monkeypatch.setattr(pipes_module, "_text", SpyStr)
    text = "a" * MAX_PIPE_ARGUMENT_LENGTH
    with pytest.raises(ExpressionError, match="maximum is"):
        P["replace"](text, "a", "x" * MAX_PIPE_ARGUMENT_LENGTH)
    assert built == []
    # Just at the limit: (n chars) + 2 quotes == limit.
    exact = "a" * (MAX_EXPRESSION_RESULT_BYTES - 2 - 1)
    assert P["replace"](exact, "a", "a") == exact
    assert built == [1]


def test_pp_02_replace_size_counts_json_escapes() -> None:
    with result_byte_limit(10):
        # 'aaaa' -> four '"' characters, each two bytes escaped: 8 + 2 quotes.
        assert P["replace"]("aaaa", "a", '"') == '""""'
        with pytest.raises(ExpressionError, match="maximum is 10"):
            P["replace"]("aaaa", "a", "\n\n")


def test_pp_03_strip_family() -> None:
    assert P["strip"]("__hi__", "_") == "hi"
    assert P["strip"]("  hi  ") == "hi"
    assert P["lstrip"]("__hi__", "_") == "hi__"
    assert P["rstrip"]("__hi__", "_") == "__hi"
    assert P["lstrip"]("  hi  ") == "hi  "


@pytest.mark.parametrize(
    ("value", "expected"),
    [("hello", "hello"), ("", "fb"), (None, "fb"), (0, 0), (False, False), ([], []), ({}, {})],
)
def test_pp_04_default_replaces_only_null_and_empty(value: object, expected: object) -> None:
    assert P["default"](value, "fb") == expected
    assert type(P["default"](value, "fb")) is type(expected)


def test_pp_04_default_fallback_is_empty_string() -> None:
    assert P["default"](None) == ""


@pytest.mark.parametrize("value", [None, ""])
def test_pp_05_required_rejects_null_and_empty(value: object) -> None:
    with pytest.raises(ExpressionError, match="Required value is missing"):
        P["required"](value)


@pytest.mark.parametrize("value", ["x", 0, False, [], {}])
def test_pp_05_required_passes_other_values(value: object) -> None:
    assert P["required"](value) is value


# --- PP-06 .. PP-08: arrays -------------------------------------------------


def test_pp_06_first_and_last() -> None:
    assert P["first"](["a", "b", "c"]) == "a"
    assert P["last"](["a", "b", "c"]) == "c"
    assert P["first"]([]) is None
    assert P["last"]([]) is None
    assert P["first"]("hello") == "hello"
    assert P["last"]({"a": 1}) == {"a": 1}


@pytest.mark.parametrize(
    ("index", "expected"),
    [("1", "b"), ("0", "a"), ("5", None), ("-1", None), ("abc", None), ("1.0", None)],
)
def test_pp_07_nth(index: str, expected: object) -> None:
    assert P["nth"](["a", "b", "c"], index) == expected


def test_pp_07_nth_defaults_to_zero_and_passes_scalars() -> None:
    assert P["nth"](["a", "b"]) == "a"
    assert P["nth"]("scalar", "3") == "scalar"
    assert P["nth"](["a"], "9" * 5000) is None


def test_pp_08_join() -> None:
    assert P["join"](["a", "b", "c"]) == "a, b, c"
    assert P["join"](["a", "b"], " | ") == "a | b"
    assert P["join"]([None, "a", None, "b"], "-") == "a-b"
    assert P["join"]([0, False, True, 1.5], ";") == "0;False;True;1.5"
    assert P["join"]("hello", ", ") == "hello"


def test_pp_08_join_rejects_separator_amplification() -> None:
    with pytest.raises(ExpressionError, match="maximum is"):
        P["join"](["a"] * 130, "x" * MAX_PIPE_ARGUMENT_LENGTH)


def test_pp_24_join_and_string_thaw_nested_containers() -> None:
    value = FrozenDict({"items": [{"rank": 1}]})
    assert P["join"]([value, None, ["nested"]], ";") == "{'items': [{'rank': 1}]};['nested']"
    assert P["string"]([value, None, ("nested",)]) == "{'items': [{'rank': 1}]}, None, ['nested']"
    assert P["append"](FrozenDict({"rank": 1}), "!") == "{'rank': 1}!"


def test_pp_24_array_pipes_work_on_nested_plain_json() -> None:
    nested = [{"a": [1, 2]}, [3, [4]], None]
    assert P["first"](nested) == {"a": [1, 2]}
    assert P["nth"](nested, "1") == [3, [4]]
    assert P["flatten"](nested) == [{"a": [1, 2]}, 3, [4], None]
    assert P["compact"](nested) == [{"a": [1, 2]}, [3, [4]]]
    assert P["json_get"]({"k": {"deep": [1]}}, "k") == {"deep": [1]}
    assert P["json_get"](FrozenDict({"k": [1, {"x": 2}]}), "k") == [1, {"x": 2}]
    assert isinstance(P["json_get"](FrozenDict({"k": [1]}), "k"), list)


# --- PP-09, PP-10: paths and URLs --------------------------------------------


@pytest.mark.parametrize(
    ("pipe", "value", "expected"),
    [
        ("basename", "/data/output/file.txt", "file.txt"),
        ("basename", "a\\b\\c.txt", "a\\b\\c.txt"),
        ("dirname", "/data/output/file.txt", "/data/output"),
        ("dirname", "file.txt", "."),
        ("stem", "/data/file.txt", "file"),
        ("stem", "archive.tar.gz", "archive.tar"),
        ("ext", "/data/file.txt", ".txt"),
        ("ext", "Makefile", ""),
    ],
)
def test_pp_09_posix_path_parts(pipe: str, value: str, expected: str) -> None:
    assert P[pipe](value) == expected


def test_pp_10_urlencode_and_urldecode() -> None:
    assert P["urlencode"]("hello world") == "hello%20world"
    assert P["urlencode"]("a/b?c=d&e~f_g.h-i") == "a%2Fb%3Fc%3Dd%26e~f_g.h-i"
    assert P["urlencode"]("é") == "%C3%A9"
    assert P["urldecode"]("hello%20world") == "hello world"
    assert P["urldecode"]("%C3%A9") == "é"


def test_pp_10_urlencode_size_is_checked_before_encoding() -> None:
    with result_byte_limit(11):
        assert P["urlencode"]("a b c") == "a%20b%20c"  # 9 + 2 quotes
        with pytest.raises(ExpressionError, match="maximum is 11"):
            P["urlencode"]("a b c ")


# --- PP-11, PP-19, PP-22: exact numbers (LM-27) -------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("42", 42),
        ("3.14", 3),
        ("-3.99", -3),
        (2.9, 2),
        (2**53 + 1, 2**53 + 1),
        (str(2**80 + 1), 2**80 + 1),
        ("1e3", 1000),
        ("abc", 0),
        (True, 0),
        (False, 0),
        (None, 0),
        ("inf", 0),
        ("-inf", 0),
        ("nan", 0),
        ([1], 0),
    ],
)
def test_pp_11_int_truncates_exact_decimals(value: object, expected: int) -> None:
    result = P["int"](value)
    assert result == expected
    assert type(result) is int


def test_lm_27_int_exponent_cap() -> None:
    below = P["int"](f"1e{MAX_PIPE_INTEGER_DIGITS - 1}")
    assert below == 10 ** (MAX_PIPE_INTEGER_DIGITS - 1)
    assert P["int"](f"1e{MAX_PIPE_INTEGER_DIGITS}") == 0
    assert P["int"]("1e1000000000") == 0
    assert P["int"]("1e999999999999999999999999") == 0
    assert P["int"](10**5000) == 0


def test_pp_19_pad() -> None:
    assert P["pad"]("3") == "03"
    assert P["pad"]("3", "3") == "003"
    assert P["pad"]("123", "2") == "123"
    assert P["pad"]("3.7", "2") == "03"
    assert P["pad"](-3, "3") == "-03"
    assert P["pad"](2**53 + 1, "2") == str(2**53 + 1)
    assert P["pad"]("abc", "2") == "abc"
    assert P["pad"](True, "2") == "True"
    assert P["pad"]("3", "x") == "3"


def test_lm_27_pad_caps_exponent_and_width() -> None:
    assert P["pad"]("1e1000000000", "2") == "1e1000000000"
    assert P["pad"]("1", str(MAX_PIPE_INTEGER_DIGITS)) == "1".zfill(MAX_PIPE_INTEGER_DIGITS)
    assert P["pad"]("1", str(MAX_PIPE_INTEGER_DIGITS + 1)) == "1"
    assert P["pad"]("1", "1000000000") == "1"
    assert P["pad"]("1", "9" * 10_000) == "1"
    huge = 10**5000
    assert P["pad"](huge, "2") == "1" + "0" * 5000


@pytest.mark.parametrize(
    ("pipe", "value", "threshold", "expected"),
    [
        ("gt", 0.9, "0.8", True),
        ("gt", "0.5", "0.8", False),
        ("gt", 1, "1", False),
        ("gt", 0.1, "0.1", False),
        ("gt", "abc", "0.8", False),
        ("gt", None, "0", False),
        ("gt", True, "0", False),
        ("gt", "5", "x", False),
        ("lt", 0.3, "0.8", True),
        ("lt", "0.9", "0.8", False),
        ("lt", 1, "1", False),
        ("gt", str(2**64 + 1), str(2**64), True),
        ("gt", "1e1000000000", "1", True),
        ("lt", "-1e1000000000", "1", True),
        ("lt", "1" * 100_000, "1e100000", True),
        ("lt", "1" * 100_001, "1e100000", False),
        ("gt", "1e999999999999999999999999", "1", False),
    ],
)
def test_pp_22_gt_lt_exact_decimal(
    pipe: str, value: object, threshold: str, expected: bool
) -> None:
    assert P[pipe](value, threshold) is expected


def test_im_13_integers_past_the_str_digit_limit_compare_exactly() -> None:
    huge = 10**5000
    assert P["gt"](huge, "1") is True
    assert P["lt"](huge, "1e5001") is True
    assert P["gt"](huge + 1, "1" + "0" * 3999 + "e1001") is True
    assert P["eq"](huge, "1" + "0" * 5000) is True


def test_im_13_huge_numbers_are_cheap() -> None:
    start = time.perf_counter()
    for pipe in ("int", "pad"):
        P[pipe]("9" * 500_000 + "e-499990")
        P[pipe]("1e-999999999")
    P["gt"]("9" * 500_000, "1e499999")
    assert time.perf_counter() - start < 5


# --- PP-12 .. PP-14 -------------------------------------------------------


def test_pp_12_string() -> None:
    assert P["string"](["a", "b"]) == "a, b"
    assert P["string"]([None, 1]) == "None, 1"
    assert P["string"](42) == "42"
    assert P["string"](True) == "True"
    assert P["string"]({"a": [1]}) == "{'a': [1]}"


def test_pp_13_truncate() -> None:
    assert P["truncate"]("hello world", "5") == "hello"
    assert P["truncate"]("hi", "100") == "hi"
    assert P["truncate"]("x" * 150) == "x" * 100
    assert P["truncate"]("hello world", "abc") == "hello world"
    assert P["truncate"]("hello", "-2") == ""


def test_pp_14_prepend_and_append() -> None:
    assert P["prepend"]("world", "hello ") == "hello world"
    assert P["append"]("hello", " world") == "hello world"
    assert P["append"](None, "!") == "None!"


def test_pp_14_append_boundary() -> None:
    value = "x" * (MAX_EXPRESSION_RESULT_BYTES - 3)
    assert P["append"](value, "y") == value + "y"
    with pytest.raises(ExpressionError, match="maximum is"):
        P["append"](value, "yz")
    with pytest.raises(ExpressionError, match="maximum is"):
        P["prepend"](value, "yz")


# --- PP-15: match -----------------------------------------------------------


def test_pp_15_match() -> None:
    assert pipes_module.RE2_AVAILABLE
    assert P["match"]("video_12345_hd", r"\d+") == "12345"
    assert P["match"]("no numbers", r"\d+") == ""
    assert P["match"]("test", "[invalid") == ""
    assert P["match"]("test", "") == ""
    assert P["match"]("test") == ""
    assert P["match"](12345, r"3(4)") == "34"


def test_pp_15_match_backreferences_are_rejected_by_re2() -> None:
    assert P["match"]("aa", r"(a)\1") == ""


def test_im_13_pathological_regexes_return_empty() -> None:
    start = time.perf_counter()
    assert P["match"]("a" * 100_000, r"(a+)+b") == ""
    assert P["match"]("a" * 30, r"(a*)*$x") == ""
    assert P["match"]("x", "(" * 2000 + ")" * 2000) == ""
    assert P["match"]("x", "a{1000}{1000}{1000}") == ""
    assert P["match"]("x", "x" * (MAX_PIPE_ARGUMENT_LENGTH + 1)) == ""
    assert P["match"]("\ud800", "a") == ""
    assert time.perf_counter() - start < 5


def _load_pipes_copy(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, pipes_module.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pp_15_without_re2_the_first_match_warns_once_and_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "re2", None)  # makes ``import re2`` fail
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copy = _load_pipes_copy("dagwerk_pipes_without_re2")  # importing says nothing
    assert copy.RE2_AVAILABLE is False
    match = copy.BUILTIN_PIPES["match"]
    with pytest.warns(RuntimeWarning, match="google-re2 is not installed") as caught:
        assert match("video_12345_hd", r"\d+") == "12345"
        assert match("video_12345_hd", r"[a-z]+") == "video"
    assert len(caught) == 1
    assert match("test", "[invalid") == ""
    # Python's re parses nested groups recursively: RecursionError -> "".
    assert match("x", "(" * 2000 + ")" * 2000) == ""


def test_pp_15_with_re2_import_is_silent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copy = _load_pipes_copy("dagwerk_pipes_with_re2")
    assert copy.RE2_AVAILABLE is True


# --- PP-16: json_get --------------------------------------------------------


def test_pp_16_json_get() -> None:
    assert P["json_get"]('{"url": "https://example.com"}', "url") == "https://example.com"
    assert P["json_get"]({"url": "https://example.com"}, "url") == "https://example.com"
    assert P["json_get"]({"a": 1}, "b") is None
    assert P["json_get"]('{"values": [1, 2]}', "values") == [1, 2]
    assert P["json_get"]('{"": 7}') == 7
    assert P["json_get"]("not json", "key") is None
    assert P["json_get"]("[1, 2]", "0") is None
    assert P["json_get"](["a"], "0") is None
    assert P["json_get"](5, "a") is None


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        '{"a":' * 100_000,
        "[" * 17 + "]" * 17,
        '{"a": NaN}',
        '{"a": 1e400}',
        '{"a": ' + "1" * 5000 + "}",
        '{"a": [' + ",".join(["0"] * 10_001) + "]}",
    ],
)
def test_im_13_json_get_rejects_hostile_json_strings(text: str) -> None:
    assert P["json_get"](text, "a") is None


def test_pp_16_json_get_depth_ignores_brackets_inside_strings() -> None:
    nested = "[" * 16 + "]" * 16
    assert P["json_get"](f'{{"a": "{"[" * 40}", "b": {nested[2:-2]}}}', "a") == "[" * 40
    assert P["json_get"]('{"a": "quote \\" [[[[[[[[[[[[[[[[[["}', "a") == 'quote " ' + "[" * 18


def test_pp_16_json_get_rejects_text_over_the_result_limit() -> None:
    document = '{"a": "' + "x" * 100 + '"}'
    assert P["json_get"](document, "a") == "x" * 100
    with result_byte_limit(50):
        assert P["json_get"](document, "a") is None


# --- PP-17, PP-18 -----------------------------------------------------------


def test_pp_17_flatten_one_level() -> None:
    assert P["flatten"]([[1, 2], 3, [4]]) == [1, 2, 3, 4]
    assert P["flatten"]([[[1]], [2]]) == [[1], 2]
    assert P["flatten"]([1, 2]) == [1, 2]
    assert P["flatten"]("hello") == "hello"


def test_pp_18_compact_removes_only_null() -> None:
    assert P["compact"]([None, "", 0, False, "a", None]) == ["", 0, False, "a"]
    assert P["compact"]("hello") == "hello"


# --- PP-20 .. PP-23 ---------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, True),
        ("", True),
        (False, True),
        (0, True),
        (0.0, True),
        ([], True),
        ({}, True),
        ("hello", False),
        ("false", False),
        (True, False),
        ([0], False),
    ],
)
def test_pp_20_not_uses_python_truthiness(value: object, expected: bool) -> None:
    assert P["not"](value) is expected


def test_pp_21_eq_neq_compare_text() -> None:
    assert P["eq"]("tv", "tv") is True
    assert P["eq"]("tv", "movie") is False
    assert P["eq"](42, "42") is True
    assert P["eq"](True, "True") is True
    assert P["eq"](1.0, "1") is False
    assert P["neq"]("tv", "movie") is True
    assert P["neq"]("tv", "tv") is False


def test_pp_23_in() -> None:
    assert P["in"]("tv", "tv", "movie") is True
    assert P["in"]("podcast", "tv", "movie") is False
    assert P["in"](3, "1", "2", "3") is True


# --- shared helpers ---------------------------------------------------------


def test_bounded_text_join_stops_consuming_after_the_limit() -> None:
    consumed: list[int] = []

    def parts() -> object:
        for index in range(10):
            consumed.append(index)
            yield "x" * 4

    with result_byte_limit(10), pytest.raises(ExpressionError, match="maximum is 10"):
        bounded_text_join(parts())  # type: ignore[arg-type]
    assert consumed == [0, 1, 2]


def test_result_byte_limit_is_restored_and_validated() -> None:
    with result_byte_limit(3), pytest.raises(ExpressionError):
        P["append"]("ab")
    assert P["append"]("ab") == "ab"
    with pytest.raises(ValueError, match="non-negative"), result_byte_limit(-1):
        pass
