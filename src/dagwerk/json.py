"""The routing JSON value model: frozen containers, equality, canonical size.

Routing JSON (output fields, plan parameters, run input) is frozen on entry:
objects become :class:`FrozenDict`, arrays become tuples. Every byte limit in
the engine is measured on the canonical form: sorted keys, compact
separators, UTF-8 without ASCII escaping, no NaN.
"""

from __future__ import annotations

import json as _json
import math
import re
from collections.abc import Iterable, Mapping
from json.encoder import encode_basestring as _encode_str
from typing import Any, Self, TypeAlias, TypeVar, Union

from dagwerk.constants import MAX_JSON_DEPTH, MAX_JSON_KEYS, MAX_JSON_VALUES
from dagwerk.errors import JsonLimitError

JsonScalar: TypeAlias = bool | int | float | str | None
JsonInput: TypeAlias = Union[  # noqa: UP007 - recursive alias with forward refs
    JsonScalar, list["JsonInput"], tuple["JsonInput", ...], Mapping[str, "JsonInput"]
]
JsonValue: TypeAlias = Union[JsonScalar, tuple["JsonValue", ...], "FrozenDict"]
JsonWireValue: TypeAlias = Union[  # noqa: UP007
    JsonScalar, list["JsonWireValue"], dict[str, "JsonWireValue"]
]

_IMMUTABLE = (
    "this mapping is immutable; make a mutable copy with dict(value), "
    "or dagwerk.thaw_json(value) for a deep one"
)
_set = object.__setattr__

# Brackets inside JSON strings do not nest: strings are blanked before counting.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKET = re.compile(r"[\[\]{}]")

# log10(2): turns a bit length into a decimal digit estimate.
_LOG10_2 = 0.30102999566398120


_K = TypeVar("_K")
_V = TypeVar("_V")


class ReadOnlyDict(dict[_K, _V]):
    """A ``dict`` whose every mutating method and operator raises
    :class:`TypeError`: it passes ``isinstance(value, dict)``, ``json.dumps``
    writes it as it is, and ``pickle``, ``copy.copy`` and ``copy.deepcopy``
    give an equal, still read-only value. Read-only is shallow: the members
    are whatever was given. ``copy()`` and ``|`` return a new plain ``dict``.
    Only a deliberate bypass (``dict.__setitem__(value, ...)``) can change
    one.
    """

    __slots__ = ()

    def __new__(cls, values: Mapping[_K, _V] | Iterable[tuple[_K, _V]] = ()) -> Self:
        self = dict.__new__(cls)
        dict.update(self, values)
        return self

    def __init__(self, values: Mapping[_K, _V] | Iterable[tuple[_K, _V]] = ()) -> None:
        # Everything happens in ``__new__``: calling ``__init__`` again
        # changes nothing.
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"

    def __setattr__(self, name: str, value: object) -> None:
        raise TypeError(_IMMUTABLE)

    def __delattr__(self, name: str) -> None:
        raise TypeError(_IMMUTABLE)

    def __setitem__(self, key: _K, value: _V) -> None:
        raise TypeError(_IMMUTABLE)

    def __delitem__(self, key: _K) -> None:
        raise TypeError(_IMMUTABLE)

    def __ior__(self, other: object) -> Self:  # type: ignore[misc,override]
        raise TypeError(_IMMUTABLE)

    def clear(self) -> None:
        raise TypeError(_IMMUTABLE)

    def pop(self, key: _K, default: object = None) -> _V:
        raise TypeError(_IMMUTABLE)

    def popitem(self) -> tuple[_K, _V]:
        raise TypeError(_IMMUTABLE)

    def setdefault(self, key: _K, default: object = None) -> _V:
        raise TypeError(_IMMUTABLE)

    def update(self, *args: object, **kwargs: object) -> None:
        raise TypeError(_IMMUTABLE)

    def __copy__(self) -> Self:
        return self

    def __reduce__(self) -> tuple[type[Self], tuple[dict[_K, _V]]]:
        # Rebuilt through the constructor; ``copy.deepcopy`` copies the
        # members on the way.
        return (type(self), (dict(self),))


class FrozenDict(ReadOnlyDict[str, JsonValue]):
    """An immutable JSON object: a read-only ``dict`` whose constructor
    deep-freezes its input (nested objects become ``FrozenDict``, arrays
    tuples) and enforces the JSON limits. It is hashable, and ``copy.copy``
    and ``copy.deepcopy`` return the same object; :func:`thaw_json` makes a
    deep mutable copy.
    """

    __slots__ = ("_depth", "_keys", "_values")

    _keys: int
    _values: int
    _depth: int

    def __new__(cls, values: Mapping[str, object] | None = None) -> Self:
        if values is None:
            values = {}
        elif not isinstance(values, Mapping):
            raise JsonLimitError("value must be a JSON object", code="json_invalid")
        if type(values) is dict and len(values) <= MAX_JSON_KEYS and _is_flat(values):
            # The common case (a flat object of plain scalars, e.g. the fields
            # of an output) needs no recursive walk; the counts are those the
            # walk records: one key and one value per member, depth 1.
            n = len(values)
            return cls._trusted(values, n, n, 1 if n else 0)
        frozen = _freeze(values, 1, _Counter())
        assert isinstance(frozen, FrozenDict)
        if type(frozen) is cls:
            return frozen
        return cls._trusted(frozen, frozen._keys, frozen._values, frozen._depth)

    def __init__(self, values: Mapping[str, object] | None = None) -> None:
        pass

    @classmethod
    def _trusted(cls, data: Mapping[str, JsonValue], keys: int, values: int, depth: int) -> Self:
        self = dict.__new__(cls)
        dict.update(self, data)
        _set(self, "_keys", keys)
        _set(self, "_values", values)
        _set(self, "_depth", depth)
        return self

    def get(self, key: str, default: Any = None) -> Any:
        # Typed ``Any`` like a value read from parsed JSON, so that
        # ``.get("items", ())`` needs no narrowing in plugin code.
        return dict.get(self, key, default)

    @classmethod
    def fromkeys(cls, keys: Iterable[str], value: object = None) -> Self:  # type: ignore[override]
        return cls(dict.fromkeys(keys, value))

    def __deepcopy__(self, memo: dict[int, object]) -> Self:
        return self

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(json_equality_key(self))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        def validate(value: object) -> FrozenDict:
            if isinstance(value, FrozenDict):
                return value
            if not isinstance(value, Mapping):
                raise ValueError("must be a JSON object")
            return FrozenDict(value)

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                thaw_json, when_used="always"
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        return {"type": "object"}


class _Counter:
    __slots__ = ("depth", "keys", "values")

    def __init__(self) -> None:
        self.keys = 0
        self.values = 0
        self.depth = 0  # deepest absolute container level seen so far


def _is_flat(values: dict[Any, object]) -> bool:
    """Whether every key of ``values`` is a ``str`` and every value a plain
    JSON scalar (exact ``str``, ``int``, ``bool``, ``None`` or finite
    ``float``); anything else is walked by :func:`_freeze`."""
    for key, item in values.items():
        if type(key) is not str:
            return False
        if isinstance(item, float):
            if type(item) is not float or not math.isfinite(item):
                return False
        elif not (item is None or type(item) in _PLAIN_SCALARS):
            return False
    return True


_PLAIN_SCALARS = (str, int, bool)


def _freeze(value: object, depth: int, counter: _Counter) -> JsonValue:
    # ``depth`` is the level a container found here occupies (top level = 1).
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if type(value) is int else int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise JsonLimitError("JSON numbers must be finite", code="json_invalid")
        return value if type(value) is float else float(value)
    if isinstance(value, FrozenDict):
        # Already validated: reuse it and add its recorded counts.
        if depth + value._depth - 1 > MAX_JSON_DEPTH:
            raise _depth_error()
        counter.keys += value._keys
        counter.values += value._values
        _check_counts(counter)
        counter.depth = max(counter.depth, depth + value._depth - 1)
        return value
    if isinstance(value, (Mapping, list, tuple)):
        # The members of a container found here sit ``depth`` containers
        # deep; only a member may cross the limit, so an empty container
        # inside 16 others is still accepted.
        if value and depth > MAX_JSON_DEPTH:
            raise _depth_error()
        outer_depth = counter.depth
        counter.depth = depth if value else depth - 1
        keys_before, values_before = counter.keys, counter.values
        counter.values += len(value)
        if isinstance(value, Mapping):
            counter.keys += len(value)
            _check_counts(counter)
            data: dict[str, JsonValue] = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise JsonLimitError("JSON object keys must be strings", code="json_invalid")
                data[str(key)] = _freeze(item, depth + 1, counter)
            frozen: JsonValue = FrozenDict._trusted(
                data,
                counter.keys - keys_before,
                counter.values - values_before,
                counter.depth - depth + 1,
            )
        else:
            _check_counts(counter)
            frozen = tuple([_freeze(item, depth + 1, counter) for item in value])
        counter.depth = max(outer_depth, counter.depth)
        return frozen
    raise JsonLimitError(
        f"value of type {type(value).__name__} is not JSON-compatible", code="json_invalid"
    )


def _check_counts(counter: _Counter) -> None:
    if counter.keys > MAX_JSON_KEYS:
        raise JsonLimitError(
            f"JSON value exceeds the maximum key count of {MAX_JSON_KEYS} object keys",
            code="json_too_large",
            limit=MAX_JSON_KEYS,
        )
    if counter.values > MAX_JSON_VALUES:
        raise JsonLimitError(
            f"JSON value exceeds the maximum value count of {MAX_JSON_VALUES} values",
            code="json_too_large",
            limit=MAX_JSON_VALUES,
        )


def _depth_error() -> JsonLimitError:
    return JsonLimitError(
        f"JSON value exceeds the maximum depth of {MAX_JSON_DEPTH} nested containers",
        code="json_too_deep",
        limit=MAX_JSON_DEPTH,
    )


def first_too_deep(text: str, limit: int) -> int | None:
    """The offset in ``text`` of the first bracket that opens a container
    nested deeper than ``limit``, or ``None`` when none does.

    A linear scan with no recursion, so it is safe on untrusted text before
    a recursive parser sees it. Offsets are those of ``text`` itself (string
    contents are blanked to equal-length placeholders)."""
    stripped = _JSON_STRING.sub(lambda match: '"' + " " * (len(match.group()) - 2) + '"', text)
    depth = 0
    for match in _JSON_BRACKET.finditer(stripped):
        if match.group() in "[{":
            depth += 1
            if depth > limit:
                return match.start()
        else:
            depth -= 1
    return None


def parse_json_text(text: str, *, field: str, limit: int = MAX_JSON_DEPTH) -> object:
    """``json.loads`` of untrusted ``text``, refusing deep nesting first.

    Nesting deeper than ``limit`` containers raises
    :class:`~dagwerk.errors.JsonLimitError` (code ``json_too_deep``) naming
    ``field`` and the limit, before the parser runs; malformed text raises
    :class:`json.JSONDecodeError` as ``json.loads`` does."""
    if first_too_deep(text, limit) is not None:
        raise JsonLimitError(
            f"{field}: JSON nests deeper than the maximum of {limit} containers",
            code="json_too_deep",
            field=field,
            limit=limit,
        )
    return _json.loads(text)


def freeze_json(
    value: object,
    *,
    _depth: int = 0,
    _key_counter: list[int] | None = None,
    _value_counter: list[int] | None = None,
) -> JsonValue:
    """Copy ``value`` into frozen containers, enforcing every JSON limit.

    Raises :class:`~dagwerk.errors.JsonLimitError` (a ``ValueError``) for
    non-finite numbers, non-string keys, non-JSON types, more than 512 keys or
    10,000 values in total, or nesting deeper than 16 containers. Integers of
    any size are accepted (filters compare them exactly). The walk stops at the first container past
    the depth limit, so arbitrarily deep input costs only 17 levels.
    """
    counter = _Counter()
    if _key_counter:
        counter.keys = _key_counter[0]
    if _value_counter:
        counter.values = _value_counter[0]
    result = _freeze(value, _depth + 1, counter)
    if _key_counter is not None:
        _key_counter[:] = [counter.keys]
    if _value_counter is not None:
        _value_counter[:] = [counter.values]
    return result


def freeze_object(value: Mapping[str, object] | None) -> FrozenDict:
    """Freeze a JSON object (``None`` gives an empty one)."""
    if value is None:
        return FrozenDict()
    if isinstance(value, FrozenDict):
        return value
    if not isinstance(value, Mapping):
        raise JsonLimitError("value must be a JSON object", code="json_invalid")
    return FrozenDict(value)


def thaw_json(value: object) -> JsonWireValue:
    """Copy a (frozen or plain) JSON value into plain ``dict``/``list``.

    The copy is recursive: pass frozen (depth-bounded) values. Unvalidated
    input nested deeper than the interpreter's recursion limit raises
    ``RecursionError``.
    """
    if isinstance(value, Mapping):
        return {k: thaw_json(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [thaw_json(v) for v in value]
    return value  # type: ignore[return-value]


def canonical_json_bytes(value: object) -> bytes:
    """The canonical form: sorted keys, compact, UTF-8, NaN refused.

    Anything that has no canonical form (non-JSON types, non-finite numbers,
    lone surrogates, nesting past the recursion limit) raises
    :class:`~dagwerk.errors.JsonLimitError`.
    """
    try:
        text = _json.dumps(
            thaw_json(value),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )
        data = text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        # UnicodeEncodeError (a lone surrogate) is a ValueError.
        raise JsonLimitError(f"value is not canonical JSON: {exc}", code="json_invalid") from exc
    return data


def json_string_payload_size(value: str, *, limit: int | None = None) -> int:
    """UTF-8 size of ``value`` JSON-encoded, without its quotes.

    Returns ``limit + 1`` once the size passes ``limit``. A string that is
    not valid UTF-8 (a lone surrogate) raises
    :class:`~dagwerk.errors.JsonLimitError` (a ``ValueError``).
    """
    try:
        if limit is not None and len(value) > limit:
            # Every character costs at least one byte, but still reject bad text.
            value.encode("utf-8")
            return limit + 1
        size = len(_encode_str(value).encode("utf-8")) - 2
    except UnicodeEncodeError as exc:
        raise JsonLimitError(
            f"JSON strings must be valid UTF-8: {exc.reason} at position {exc.start}",
            code="json_invalid",
        ) from exc
    if limit is not None and size > limit:
        return limit + 1
    return size


def _scalar_size(value: object, limit: int | None = None) -> int:
    if value is None:
        return 4
    if value is True:
        return 4
    if value is False:
        return 5
    if isinstance(value, str):
        return json_string_payload_size(value) + 2
    if isinstance(value, int):
        return _int_text_size(value, limit)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise JsonLimitError("JSON numbers must be finite", code="json_invalid")
        return len(float.__repr__(value))
    raise JsonLimitError(
        f"value of type {type(value).__name__} is not JSON-compatible", code="json_invalid"
    )


def _int_text_size(value: int, limit: int | None = None) -> int:
    """Length of ``str(value)`` without building it (``limit + 1`` once past it).

    Past 4,300 digits the interpreter refuses ``str(int)``, and converting
    through ``Decimal`` is quadratic; the digit count follows from the bit
    length, corrected by at most one comparison each way.
    """
    magnitude = -value if value < 0 else value
    sign = 1 if value < 0 else 0
    if magnitude < 10**18:
        return sign + len(int.__repr__(magnitude))
    digits = int((magnitude.bit_length() - 1) * _LOG10_2) + 1
    if limit is not None and digits - 1 > limit:
        # The estimate is off by at most one: certainly past the limit.
        return limit + 1
    while magnitude >= 10**digits:
        digits += 1
    while magnitude < 10 ** (digits - 1):
        digits -= 1
    return sign + digits


def bounded_json_size(value: object, limit: int) -> int:
    """Exact canonical JSON size of ``value``, or ``limit + 1`` once past it.

    Walks the value without building the serialised text, so a huge value
    costs only as much as the part read before the limit is crossed; the walk
    is iterative, so nesting depth costs no recursion. Integers of any size
    are measured without rendering them. Non-finite numbers, lone
    surrogates, non-string keys and non-JSON types raise :class:`~dagwerk.errors.JsonLimitError` (a
    ``ValueError``).
    """
    if type(limit) is not int or limit < 0:
        raise ValueError("limit must be a non-negative int")
    total = 0
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (FrozenDict, dict)) or (
            isinstance(item, Mapping) and not isinstance(item, str)
        ):
            mapping: Mapping[Any, object] = item
            n = len(mapping)
            total += 2 + (n - 1 if n else 0) + n  # braces, commas, colons
            for key, sub in mapping.items():
                if not isinstance(key, str):
                    raise JsonLimitError("JSON object keys must be strings", code="json_invalid")
                total += json_string_payload_size(key, limit=limit) + 2
                stack.append(sub)
        elif isinstance(item, (list, tuple)):
            n = len(item)
            total += 2 + (n - 1 if n else 0)
            stack.extend(item)
        elif isinstance(item, str):
            total += json_string_payload_size(item, limit=limit) + 2
        else:
            total += _scalar_size(item, limit)
        if total > limit:
            return limit + 1
    return total


def json_values_equal(left: object, right: object) -> bool:
    """Type-aware JSON equality.

    ``null`` equals only ``null``; booleans only booleans; numbers compare
    numerically across int and float; arrays are ordered; objects ignore key
    order. Nested values follow the same rules.
    """
    return json_equality_key(left) == json_equality_key(right)


def json_equality_key(value: object) -> object:
    """A hashable key such that equal keys mean ``json_values_equal``."""
    if value is None:
        return ("n",)
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float)):
        # 1 == 1.0 and hash(1) == hash(1.0): numbers share one key space.
        return ("d", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, Mapping):
        return ("o", frozenset((k, json_equality_key(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("a", tuple(json_equality_key(v) for v in value))
    raise ValueError(f"value of type {type(value).__name__} is not JSON-compatible")


def json_representations_equal(left: object, right: object) -> bool:
    """Exact representation equality: same types, same float bits, same key order."""
    if type(left) is not type(right):
        # Frozen and plain containers of the same JSON kind still compare.
        same_kind = (isinstance(left, Mapping) and isinstance(right, Mapping)) or (
            isinstance(left, (list, tuple)) and isinstance(right, (list, tuple))
        )
        if not same_kind:
            return False
    if isinstance(left, float):
        assert isinstance(right, float)
        return left.hex() == right.hex()
    if isinstance(left, Mapping):
        assert isinstance(right, Mapping)
        if list(left.keys()) != list(right.keys()):
            return False
        return all(json_representations_equal(left[k], right[k]) for k in left)
    if isinstance(left, (list, tuple)):
        assert isinstance(right, (list, tuple))
        return len(left) == len(right) and all(
            json_representations_equal(a, b) for a, b in zip(left, right, strict=True)
        )
    return left == right


def routing_text(value: object) -> str:
    """The text form used by text predicates and pipes: ``str()`` of the plain value."""
    return str(thaw_json(value))
