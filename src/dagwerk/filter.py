"""Edge filters and selection over the routing fields of published outputs.

A filter keeps the outputs for which every rule matches, in source order.
Equality and membership use type-preserving JSON equality
(:func:`dagwerk.json.json_values_equal`); ordered comparisons coerce numbers
and numeric strings to exact decimals; text predicates compare
:func:`dagwerk.json.routing_text` forms. Selection then orders the survivors
by one field and keeps the first ``limit``.

Both functions run over up to 100,000 outputs per edge, so each rule is
compiled once into a plain predicate and the per-output loop touches only the
frozen ``fields`` mapping.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from dagwerk.constants import FilterOperator, SortOrder
from dagwerk.errors import PlanningError
from dagwerk.json import FrozenDict, JsonValue, json_equality_key, routing_text
from dagwerk.models import EdgeFilter, FilterRule, OutputRef, Selection

__all__ = ["apply_filter", "apply_selection"]

_MISSING: Final = object()

ValueTest = Callable[[JsonValue], bool]
# (field name, test for a present value, result when the field is missing)
CompiledRule = tuple[str, ValueTest, bool]

# A missing field satisfies exactly the negative predicates (FS-03).
_MATCH_WHEN_MISSING: Final = frozenset(
    {
        FilterOperator.NEQ,
        FilterOperator.NOT_IN,
        FilterOperator.NOT_CONTAINS,
        FilterOperator.NOT_EXISTS,
    }
)

_ORDERED: Final[dict[FilterOperator, Callable[[Any, Any], bool]]] = {
    FilterOperator.GT: operator.gt,
    FilterOperator.GTE: operator.ge,
    FilterOperator.LT: operator.lt,
    FilterOperator.LTE: operator.le,
}


def _never(_value: JsonValue) -> bool:
    return False


def _negated(test: ValueTest) -> ValueTest:
    return lambda value: not test(value)


def _exists(value: JsonValue) -> bool:
    return not (value is None or (type(value) is str and value == ""))


def _not_exists(value: JsonValue) -> bool:
    return value is None or (type(value) is str and value == "")


def _exact_decimal(value: JsonValue) -> Decimal | None:
    """The exact decimal an ordered comparison uses, or ``None`` if it has none.

    Integers convert exactly at any size; a float converts through its
    shortest text (the JSON it serialises to), so ``0.1`` and ``"0.1"`` are
    the same number. Strings are parsed as decimals. Booleans, ``null``,
    arrays, objects, non-numeric strings and non-finite values have none.
    """
    kind = type(value)
    if kind is int:
        return Decimal(value)  # type: ignore[arg-type]
    if kind is float:
        number = Decimal(repr(value))
    elif kind is str:
        try:
            number = Decimal(value)  # type: ignore[arg-type]
        except (InvalidOperation, ValueError):
            return None
    else:
        return None
    return number if number.is_finite() else None


def _equality_test(expected: JsonValue) -> ValueTest:
    """A predicate ``value == expected`` under JSON equality, specialised by type."""
    if expected is None:
        return lambda value: value is None
    kind = type(expected)
    if kind is bool:
        return lambda value: value is expected
    if kind is str:
        return lambda value: type(value) is str and value == expected
    if kind is int or kind is float:
        return lambda value: (type(value) is int or type(value) is float) and value == expected
    key = json_equality_key(expected)
    container: type = tuple if kind is tuple else FrozenDict
    return lambda value: isinstance(value, container) and json_equality_key(value) == key


def _membership_test(expected: JsonValue) -> ValueTest:
    # A non-array rule value is a one-candidate list (FS-05).
    candidates = expected if isinstance(expected, tuple) else (expected,)
    keys = frozenset(json_equality_key(candidate) for candidate in candidates)
    return lambda value: json_equality_key(value) in keys


def _text_of_rule(rule: FilterRule) -> str | None:
    try:
        return routing_text(rule.value)
    except ValueError:
        # An integer too long for ``str()``; only a text comparison needs it.
        return None


def _unrenderable(rule: FilterRule) -> PlanningError:
    return PlanningError(
        f"filter value on field {rule.field!r} cannot be rendered as text",
        field=rule.field,
    )


def _value_text(value: JsonValue) -> str:
    return value if isinstance(value, str) else routing_text(value)


def _contains_test(rule: FilterRule) -> ValueTest:
    element_equals = _equality_test(rule.value)
    text = _text_of_rule(rule)

    def contains(value: JsonValue) -> bool:
        # An array holds the value as an element; anything else holds its text.
        if type(value) is tuple:
            return any(element_equals(item) for item in value)
        if text is None:
            raise _unrenderable(rule)
        return text in _value_text(value)

    return contains


def _affix_test(rule: FilterRule, *, prefix: bool) -> ValueTest:
    text = _text_of_rule(rule)

    def affix(value: JsonValue) -> bool:
        if text is None:
            raise _unrenderable(rule)
        rendered = _value_text(value)
        return rendered.startswith(text) if prefix else rendered.endswith(text)

    return affix


def _ordered_test(rule: FilterRule) -> ValueTest:
    compare = _ORDERED[rule.operator]
    expected = rule.value
    bound = _exact_decimal(expected)
    if bound is None:
        return _never
    expected_kind = type(expected)

    def ordered(value: JsonValue) -> bool:
        kind = type(value)
        # Same-kind numbers compare exactly without conversion: ints are
        # exact, and the shortest-text decimals of two floats order exactly
        # as the floats do.
        if kind is expected_kind and (kind is int or kind is float):
            return compare(value, expected)
        number = _exact_decimal(value)
        return number is not None and compare(number, bound)

    return ordered


def _compile_rule(rule: FilterRule) -> CompiledRule:
    op = rule.operator
    test: ValueTest
    if op is FilterOperator.EXISTS:
        test = _exists
    elif op is FilterOperator.NOT_EXISTS:
        test = _not_exists
    elif op is FilterOperator.EQ:
        test = _equality_test(rule.value)
    elif op is FilterOperator.NEQ:
        test = _negated(_equality_test(rule.value))
    elif op is FilterOperator.IN:
        test = _membership_test(rule.value)
    elif op is FilterOperator.NOT_IN:
        test = _negated(_membership_test(rule.value))
    elif op is FilterOperator.CONTAINS:
        test = _contains_test(rule)
    elif op is FilterOperator.NOT_CONTAINS:
        test = _negated(_contains_test(rule))
    elif op is FilterOperator.STARTS_WITH:
        test = _affix_test(rule, prefix=True)
    elif op is FilterOperator.ENDS_WITH:
        test = _affix_test(rule, prefix=False)
    elif op in _ORDERED:
        test = _ordered_test(rule)
    else:  # pragma: no cover - FilterOperator is closed
        raise PlanningError(f"unsupported filter operator {op!r}", field=rule.field)
    return (rule.field, test, op in _MATCH_WHEN_MISSING)


def apply_filter(
    outputs: Sequence[OutputRef], edge_filter: EdgeFilter | None
) -> tuple[OutputRef, ...]:
    """The outputs for which every rule matches, in source order.

    ``None`` or a filter without rules keeps everything. A missing field
    satisfies only NEQ, NOT_IN, NOT_CONTAINS and NOT_EXISTS; a present
    ``null`` is a value (EQ ``null`` matches it) except for EXISTS, which
    treats ``null`` and ``""`` as absent.
    """
    if edge_filter is None or not edge_filter.rules:
        return tuple(outputs)
    compiled = [_compile_rule(rule) for rule in edge_filter.rules]
    kept: list[OutputRef] = []
    for output in outputs:
        fields = output.fields
        for name, test, when_missing in compiled:
            value = fields.get(name, _MISSING)
            if value is _MISSING:
                if not when_missing:
                    break
            elif not test(value):
                break
        else:
            kept.append(output)
    return tuple(kept)


def apply_selection(
    outputs: Sequence[OutputRef], selection: Selection | None
) -> tuple[OutputRef, ...]:
    """The first ``limit`` outputs ordered by ``selection.field``.

    Outputs whose field is missing or ``null`` are dropped. The remaining
    values must be all strings or all non-boolean numbers; otherwise a
    :class:`~dagwerk.errors.PlanningError` names the first offending output
    ("not a sortable string or number", or "mixed string and number
    values"). Values sort ascending or descending; equal values keep output
    ID ascending in both orders. ``None`` keeps everything.
    """
    if selection is None:
        return tuple(outputs)
    name = selection.field
    # (value, output id, source position): the position keeps the sort
    # stable and means OutputRef objects are never compared.
    entries: list[tuple[str | int | float, str, int]] = []
    value_kind: type | None = None
    for position, output in enumerate(outputs):
        value = output.fields.get(name)
        if value is None:
            continue
        kind: type = type(value)
        if kind is float:
            kind = int  # one kind for every number
        elif kind is not int and kind is not str:
            raise PlanningError(
                f"selection field {name!r} on output {output.id!r} "
                "is not a sortable string or number",
                field=name,
            )
        if value_kind is None:
            value_kind = kind
        elif kind is not value_kind:
            raise PlanningError(
                f"selection field {name!r} contains mixed string and number values",
                field=name,
            )
        entries.append((value, output.id, position))

    limit = selection.limit
    descending = selection.order is SortOrder.DESC
    if descending and value_kind is str:
        # Strings cannot be negated: sort by id, then stably by value reversed.
        entries.sort(key=lambda entry: (entry[1], entry[2]))
        entries.sort(key=lambda entry: entry[0], reverse=True)
        chosen = entries[:limit]
    else:
        if descending:
            entries = [(-value, id_, pos) for value, id_, pos in entries]  # type: ignore[operator]
        chosen = (
            heapq.nsmallest(limit, entries) if limit * 8 < len(entries) else sorted(entries)[:limit]
        )
    return tuple(outputs[position] for _value, _id, position in chosen)
