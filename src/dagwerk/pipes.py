"""The built-in pipes of the expression language.

A pipe receives the current value, always plain JSON (``dict``/``list``, never
frozen containers), followed by its string arguments, as in
``{edge.name | replace(old,new)}``. ``BUILTIN_PIPES`` is the read-only
registry, in the order the vocabulary lists it; ``PIPE_ARITY`` holds the
number of explicit arguments each pipe accepts.

Pipes are total on hostile input: a deeply nested JSON string, a number with
a huge exponent or a pathological regular expression gives the documented
fallback value (``null``, ``0``, ``false``, ``""`` or the unchanged text) and
never a ``RecursionError``, an ``OverflowError`` or a huge allocation. Pipes
that can enlarge text compute the size of their result before building it
and raise :class:`~dagwerk.errors.ExpressionError` past the result limit.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from decimal import Context, Decimal, InvalidOperation
from pathlib import PurePosixPath
from types import MappingProxyType, ModuleType
from typing import Any, Final
from urllib.parse import quote, unquote

from dagwerk.constants import (
    MAX_EXPRESSION_RESULT_BYTES,
    MAX_JSON_DEPTH,
    MAX_PIPE_ARGUMENT_LENGTH,
    MAX_PIPE_INTEGER_DIGITS,
)
from dagwerk.errors import ExpressionError
from dagwerk.json import freeze_json, json_string_payload_size, routing_text, thaw_json

__all__ = [
    "BUILTIN_PIPES",
    "FALLBACK_REGEX_BUDGET",
    "PIPE_ARITY",
    "RE2_AVAILABLE",
    "bounded_text_join",
    "fallback_regex_cost",
    "result_byte_limit",
    "warn_regex_fallback",
]


class RegexFallbackWarning(RuntimeWarning):
    """google-re2 is missing, so ``match`` runs on Python's backtracking ``re``."""


_re2: ModuleType | None
# ``Any``: google-re2 ships no type information.
_RE2_OPTIONS: Any
try:
    import re2 as _re2_module

    _re2 = _re2_module
    # Invalid patterns are an expected outcome (``match`` returns ""), so RE2
    # must not log each one to stderr.
    _RE2_OPTIONS = _re2_module.Options()
    _RE2_OPTIONS.log_errors = False
except ImportError:  # pragma: no cover - exercised by loading a copy without re2
    _re2 = None
    _RE2_OPTIONS = None

RE2_AVAILABLE: Final[bool] = _re2 is not None

# Whether this process has been told that ``match`` runs without RE2.
_fallback_warned = False


def warn_regex_fallback() -> None:
    """Warn once per process (:class:`RegexFallbackWarning`) that ``match``
    runs on Python's ``re`` because google-re2 is missing; nothing when it
    is installed. Called when a ``match`` pipe is validated or evaluated, so
    a process that never matches says nothing."""
    global _fallback_warned
    if _re2 is not None or _fallback_warned:
        return
    _fallback_warned = True
    warnings.warn(
        "google-re2 is not installed: the 'match' pipe runs on Python's re module and "
        "refuses patterns whose backtracking it cannot bound (they match nothing). "
        "Install it with: pip install 'dagwerk[re2]'",
        RegexFallbackWarning,
        stacklevel=3,
    )


# The fallback's static cost check reads Python's own parse of the pattern.
# ``re._parser`` is private but stable since 3.11; ``Any`` because typeshed
# does not describe it.
_RE_PARSER: Any = importlib.import_module("re._parser")
_RE_CONSTANTS: Any = importlib.import_module("re._constants")

#: Without RE2, ``match`` runs a pattern on Python's backtracking ``re`` only
#: when its estimated worst-case work (see :func:`fallback_regex_cost`) is at
#: most this many steps; otherwise it returns ``""`` without searching.
FALLBACK_REGEX_BUDGET: Final = 100_000_000

# The result limit pipes guard against. The expression evaluator sets it to
# its own ``max_result_bytes`` so an engine setting applies inside pipes too.
_RESULT_LIMIT: ContextVar[int] = ContextVar(
    "dagwerk_pipe_result_limit", default=MAX_EXPRESSION_RESULT_BYTES
)

# Decimal parsing is exact whatever the precision; a private context makes
# malformed text and out-of-range exponents raise, independent of whatever
# context the calling thread has installed.
_DECIMAL_CONTEXT: Final = Context(traps=[InvalidOperation])

_UNRESERVED: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~"
_JSON_STRING: Final = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_JSON_BRACKET: Final = re.compile(r"[\[\]{}]")


@contextmanager
def result_byte_limit(limit: int) -> Iterator[None]:
    """Make pipes called inside the block guard their results against ``limit`` bytes."""
    if type(limit) is not int or limit < 0:
        raise ValueError("result byte limit must be a non-negative int")
    token = _RESULT_LIMIT.set(limit)
    try:
        yield
    finally:
        _RESULT_LIMIT.reset(token)


# --- helpers ---------------------------------------------------------------


def _payload_size(text: str, limit: int | None = None) -> int:
    try:
        return json_string_payload_size(text, limit=limit)
    except ValueError as exc:
        raise ExpressionError(
            "expression text is not valid UTF-8", code="expression_invalid_text"
        ) from exc


def _check_text_size(payload_size: int) -> None:
    # A JSON string costs its payload plus two quotes.
    limit = _RESULT_LIMIT.get()
    size = payload_size + 2
    if size > limit:
        raise ExpressionError(
            f"expression result would be {size} bytes; maximum is {limit}",
            code="expression_too_large",
            limit=limit,
        )


def bounded_text_join(parts: Iterable[str], separator: str = "") -> str:
    """Join ``parts`` after checking the encoded result fits the result limit.

    Parts are consumed lazily and the size is checked after each one, so a
    generator producing the parts stops as soon as the limit is crossed.
    """
    limit = _RESULT_LIMIT.get()
    separator_size = _payload_size(separator, limit)
    collected: list[str] = []
    total = 0
    for part in parts:
        total += _payload_size(part, limit)
        if collected:
            total += separator_size
        _check_text_size(total)
        collected.append(part)
    return separator.join(collected)


def _int_text(value: int) -> str:
    try:
        return str(value)
    except ValueError:
        # Past the interpreter's int-to-str digit limit; Decimal renders any
        # integer exactly and without that limit.
        return str(Decimal(value))


def _text(value: object) -> str:
    """``str()`` of the plain value (the seed's routing text)."""
    if isinstance(value, str):
        return value
    if type(value) is int:
        return _int_text(value)
    try:
        return routing_text(value)
    except (ValueError, RecursionError) as exc:
        raise ExpressionError(
            "value cannot be rendered as text", code="expression_invalid_text"
        ) from exc


def _decimal(value: object) -> Decimal | None:
    """The exact decimal value of a number or numeric text, or ``None``."""
    if value is None or isinstance(value, (bool, list, tuple, dict)):
        return None
    try:
        if type(value) is int:
            number = Decimal(value)
        elif isinstance(value, float):
            # The shortest repr, so 0.1 compares equal to "0.1".
            number = Decimal(repr(value), _DECIMAL_CONTEXT)
        elif isinstance(value, str):
            number = Decimal(value, _DECIMAL_CONTEXT)
        else:
            return None
    except (ArithmeticError, ValueError, TypeError):
        return None
    return number if number.is_finite() else None


def _integer(number: Decimal) -> int | None:
    """``number`` truncated toward zero, or ``None`` if it has too many digits.

    The exponent is checked before any integer is built, so ``1e1000000000``
    costs nothing.
    """
    if number.adjusted() >= MAX_PIPE_INTEGER_DIGITS:
        return None
    return int(number)


def _small_int(text: str) -> int | None:
    """A pipe's integer argument, or ``None`` if it is not an integer."""
    try:
        return int(text)
    except (ValueError, TypeError):
        return None


# --- text pipes ------------------------------------------------------------


def _upper(value: object) -> object:
    return _text(value).upper()


def _lower(value: object) -> object:
    return _text(value).lower()


def _trim(value: object) -> object:
    return _text(value).strip()


def _title(value: object) -> object:
    return _text(value).title()


def _replace(value: object, old: str, new: str = "") -> object:
    text = _text(value)
    count = len(text) + 1 if old == "" else text.count(old)
    # JSON string size is additive per character, so the result size is known
    # exactly before the (possibly amplified) replacement is built.
    size = _payload_size(text)
    if count:
        size += count * (_payload_size(new) - _payload_size(old))
    _check_text_size(size)
    return text.replace(old, new)


def _strip(value: object, chars: str = "") -> object:
    return _text(value).strip(chars or None)


def _lstrip(value: object, chars: str = "") -> object:
    return _text(value).lstrip(chars or None)


def _rstrip(value: object, chars: str = "") -> object:
    return _text(value).rstrip(chars or None)


def _default(value: object, fallback: str = "") -> object:
    return fallback if value is None or value == "" else value


def _required(value: object) -> object:
    if value is None or value == "":
        raise ExpressionError("Required value is missing", code="expression_required")
    return value


# --- array pipes -----------------------------------------------------------


def _first(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    return value


def _last(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return value[-1] if value else None
    return value


def _nth(value: object, index: str = "0") -> object:
    if not isinstance(value, (list, tuple)):
        return value
    position = _small_int(index)
    if position is None or not 0 <= position < len(value):
        return None
    return value[position]


def _join(value: object, sep: str = ", ") -> object:
    if isinstance(value, (list, tuple)):
        return bounded_text_join((_text(item) for item in value if item is not None), sep)
    return _text(value)


def _flatten(value: object) -> object:
    if not isinstance(value, (list, tuple)):
        return value
    result: list[object] = []
    for item in value:
        if isinstance(item, (list, tuple)):
            result.extend(item)
        else:
            result.append(item)
    return result


def _compact(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return [item for item in value if item is not None]
    return value


# --- path and URL pipes ----------------------------------------------------


def _basename(value: object) -> object:
    return PurePosixPath(_text(value)).name


def _dirname(value: object) -> object:
    return str(PurePosixPath(_text(value)).parent)


def _stem(value: object) -> object:
    return PurePosixPath(_text(value)).stem


def _ext(value: object) -> object:
    return PurePosixPath(_text(value)).suffix


def _urlencode(value: object) -> object:
    text = _text(value)
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ExpressionError(
            "expression text is not valid UTF-8", code="expression_invalid_text"
        ) from exc
    # Each reserved byte becomes three characters ("%XY"), all plain ASCII.
    reserved = len(encoded.translate(None, _UNRESERVED))
    _check_text_size(len(encoded) + 2 * reserved)
    return quote(encoded, safe="")


def _urldecode(value: object) -> object:
    return unquote(_text(value))


# --- number pipes ----------------------------------------------------------


def _int(value: object) -> object:
    number = _decimal(value)
    integer = None if number is None else _integer(number)
    return 0 if integer is None else integer


def _pad(value: object, width: str = "2") -> object:
    number = _decimal(value)
    integer = None if number is None else _integer(number)
    columns = _small_int(width)
    if integer is None or columns is None or columns > MAX_PIPE_INTEGER_DIGITS:
        return _text(value)
    return _int_text(integer).zfill(columns)


def _gt(value: object, threshold: str) -> object:
    left, right = _decimal(value), _decimal(threshold)
    return left is not None and right is not None and left > right


def _lt(value: object, threshold: str) -> object:
    left, right = _decimal(value), _decimal(threshold)
    return left is not None and right is not None and left < right


# --- conversion and test pipes ---------------------------------------------


def _string(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return bounded_text_join((_text(item) for item in value), ", ")
    return _text(value)


def _truncate(value: object, length: str = "100") -> object:
    """The first ``length`` characters; a negative length keeps none."""
    text = _text(value)
    count = _small_int(length)
    if count is None:
        return text
    return text[: max(count, 0)]


def _prepend(value: object, prefix: str = "") -> object:
    return bounded_text_join((prefix, _text(value)))


def _append(value: object, suffix: str = "") -> object:
    return bounded_text_join((_text(value), suffix))


@functools.lru_cache(maxsize=128)
def _compile_re2(pattern: str) -> Any:
    assert _re2 is not None
    return _re2.compile(pattern, _RE2_OPTIONS)


def _match(value: object, pattern: str = "") -> object:
    """The whole first match of ``pattern`` in the text, or ``""``."""
    if not pattern or len(pattern) > MAX_PIPE_ARGUMENT_LENGTH:
        return ""
    text = _text(value)
    if _re2 is not None:
        try:
            found = _compile_re2(pattern).search(text)
        except Exception:
            # RE2 rejects what it cannot run in linear time (backreferences,
            # lookaround, deep nesting) and text it cannot encode.
            return ""
    else:
        warn_regex_fallback()
        try:
            if fallback_regex_cost(pattern, len(text)) > FALLBACK_REGEX_BUDGET:
                return ""
            found = re.search(pattern, text)
        except (re.error, RecursionError, OverflowError, ValueError, MemoryError):
            return ""
    return str(found.group(0)) if found is not None else ""


def fallback_regex_cost(pattern: str, text_length: int) -> int:
    """An upper estimate of the steps Python's ``re`` may take to search a text.

    The estimate is (start positions) × (backtracking paths) × (pattern
    length + 1), where the paths of a sequence multiply, the paths of an
    alternation add, and a quantifier over a single path offers one path per
    repetition count (at most the text length); each character a quantifier
    consumes is one of its repetition counts, so consumption is inside the
    path count. Constructs whose backtracking has no such
    bound (a quantified item that itself has several paths, such as
    ``(a+)+`` or ``(a|b)*``, backreferences, lookaround, conditionals) cost
    more than any budget. Raises ``re.error`` for an invalid pattern.
    """
    cap = FALLBACK_REGEX_BUDGET + 1
    paths = _regex_paths(_RE_PARSER.parse(pattern).data, text_length, cap)
    return min(cap, (text_length + 1) * paths * (len(pattern) + 1))


def _regex_paths(items: Iterable[tuple[Any, Any]], length: int, cap: int) -> int:
    c = _RE_CONSTANTS
    paths = 1
    for op, argument in items:
        if op in (c.LITERAL, c.NOT_LITERAL, c.ANY, c.IN, c.AT):
            continue
        if op is c.SUBPATTERN:
            paths *= _regex_paths(argument[3], length, cap)
        elif op is c.ATOMIC_GROUP:
            paths *= _regex_paths(argument, length, cap)
        elif op is c.BRANCH:
            paths *= min(cap, sum(_regex_paths(branch, length, cap) for branch in argument[1]))
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            low, high, body = argument
            inner = _regex_paths(body, length, cap)
            if inner > 1 and high > 1:
                return cap  # nested ambiguity: exponential backtracking
            if op is not c.POSSESSIVE_REPEAT:
                paths *= max(1, min(high, length) - low + 1)
        else:
            return cap  # backreferences, lookaround, conditionals
        if paths >= cap:
            return cap
    return paths


def _json_depth_exceeds(text: str, limit: int) -> bool:
    # Brackets inside string literals do not nest, so strip the literals first;
    # the possessive patterns keep this linear on any input.
    depth = 0
    for bracket in _JSON_BRACKET.findall(_JSON_STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _json_get(value: object, key: str = "") -> object:
    if isinstance(value, str):
        limit = _RESULT_LIMIT.get()
        if _payload_size(value, limit) > limit or _json_depth_exceeds(value, MAX_JSON_DEPTH):
            return None
        try:
            parsed = json.loads(value)
            # The parsed document must be routable JSON as a whole (finite
            # numbers, key and value counts), not only the selected member.
            freeze_json(parsed)
        except (ValueError, RecursionError, OverflowError):
            return None
        return parsed.get(key) if isinstance(parsed, dict) else None
    if isinstance(value, Mapping):
        try:
            return thaw_json(value.get(key))
        except (ValueError, RecursionError):
            return None
    return None


def _not(value: object) -> object:
    return not value


def _eq(value: object, expected: str) -> object:
    return _text(value) == expected


def _neq(value: object, expected: str) -> object:
    return _text(value) != expected


def _in(value: object, *options: str) -> object:
    return _text(value) in options


BUILTIN_PIPES: Final[MappingProxyType[str, Callable[..., object]]] = MappingProxyType(
    {
        "upper": _upper,
        "lower": _lower,
        "trim": _trim,
        "title": _title,
        "replace": _replace,
        "strip": _strip,
        "lstrip": _lstrip,
        "rstrip": _rstrip,
        "default": _default,
        "required": _required,
        "first": _first,
        "last": _last,
        "nth": _nth,
        "join": _join,
        "basename": _basename,
        "dirname": _dirname,
        "stem": _stem,
        "ext": _ext,
        "urlencode": _urlencode,
        "urldecode": _urldecode,
        "int": _int,
        "string": _string,
        "truncate": _truncate,
        "prepend": _prepend,
        "append": _append,
        "match": _match,
        "json_get": _json_get,
        "flatten": _flatten,
        "compact": _compact,
        "pad": _pad,
        "not": _not,
        "eq": _eq,
        "neq": _neq,
        "gt": _gt,
        "lt": _lt,
        "in": _in,
    }
)

_OPTIONAL_ARGUMENT: Final = ("strip", "lstrip", "rstrip", "default", "nth", "join", "truncate")
_OPTIONAL_ARGUMENT_2: Final = ("prepend", "append", "match", "json_get", "pad")

# (minimum, maximum) number of explicit arguments after the piped value.
PIPE_ARITY: Final[dict[str, tuple[int, int]]] = {
    name: (0, 1) if name in _OPTIONAL_ARGUMENT + _OPTIONAL_ARGUMENT_2 else (0, 0)
    for name in BUILTIN_PIPES
} | {"replace": (1, 2), "eq": (1, 1), "neq": (1, 1), "gt": (1, 1), "lt": (1, 1), "in": (1, 32)}
