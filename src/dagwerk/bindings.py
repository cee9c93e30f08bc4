"""Task-plan parameters from bindings, routing fields and run input.

Bindings are resolved once, during planning, and their results are stored in
the task plan; workers never evaluate them again (BD-11). Expressions read the
named input edges of the node and the reserved ``input`` namespace (run
input).

:func:`resolve_plan_bindings` is the seed API for one plan.
:class:`PlanBindingResolver` prepares a node's bindings once per launch and
then resolves them for every plan of the launch; planning uses it so that a
launch of 100,000 plans does not repeat per-node work 100,000 times.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring as _encode_string
from types import MappingProxyType
from typing import Final, TypeAlias

from dagwerk.errors import PlanningError
from dagwerk.expressions import (
    EvaluationBudget,
    Lookup,
    expression_evaluation_steps,
    resolve_expression,
)
from dagwerk.json import FrozenDict, JsonValue, bounded_json_size, freeze_json
from dagwerk.models import (
    EdgeSource,
    ExpressionSource,
    InputBinding,
    LiteralSource,
    OutputRef,
    PlanNode,
    RuntimeSource,
    SecretSource,
)

__all__ = [
    "FieldValueCache",
    "PlanBindingResolver",
    "binding_evaluation_steps",
    "build_expression_lookup",
    "canonical_size",
    "extract_edge_field",
    "resolve_plan_bindings",
]

FieldValueCache: TypeAlias = dict[tuple[str, str, int], tuple[Sequence[OutputRef], JsonValue]]
"""Extracted edge fields keyed by ``(edge, field, id(outputs))``.

The entry keeps the output sequence itself so that a recycled ``id`` of a
collected sequence can never return a stale value.
"""

INPUT_NAMESPACE: Final = "input"
_MISSING: Final = object()
_EMPTY_SECRETS: Final[Mapping[str, str]] = MappingProxyType({})
_EMPTY_PARAMETERS: Final = FrozenDict()

# Binding kinds, decided once per binding instead of once per plan.
_EDGE, _LITERAL, _RUNTIME, _SECRET, _EXPRESSION = range(5)


def extract_edge_field(outputs: Sequence[OutputRef], field: str) -> JsonValue:
    """The value of ``field`` across ``outputs`` (BD-01).

    No output has the field: ``None``. Exactly one has it: that value. Several
    have it: a tuple of their values in output order; outputs without the
    field are skipped, so positions need not align with the outputs.
    """
    values = [output.fields[field] for output in outputs if field in output.fields]
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return tuple(values)


def _edge_field(
    edge: str, outputs: Sequence[OutputRef], field: str, cache: FieldValueCache
) -> JsonValue:
    if len(outputs) == 1:
        # One output is one dict read, cheaper than a cache entry; EACH plans
        # each hold a fresh one-output tuple that no other plan shares.
        fields = outputs[0].fields
        single: JsonValue = fields.get(field)
        return single
    key = (edge, field, id(outputs))
    cached = cache.get(key)
    if cached is not None and cached[0] is outputs:
        return cached[1]
    value = extract_edge_field(outputs, field)
    cache[key] = (outputs, value)
    return value


def build_expression_lookup(
    outputs_by_edge: Mapping[str, Sequence[OutputRef]],
    runtime_inputs: Mapping[str, JsonValue],
    *,
    field_cache: FieldValueCache | None = None,
) -> Lookup:
    """A lookup over run input (``input``) and the edges of one plan.

    ``lookup("input", key)`` reads run input; ``lookup(edge, field)`` extracts
    ``field`` from the outputs planned on ``edge`` (shared through
    ``field_cache``); an unknown namespace or key gives ``None``.
    """
    cache: FieldValueCache = field_cache if field_cache is not None else {}

    def lookup(namespace: str, key: str) -> object | None:
        if namespace == INPUT_NAMESPACE:
            return runtime_inputs.get(key)
        outputs = outputs_by_edge.get(namespace)
        if outputs is None:
            return None
        return _edge_field(namespace, outputs, key, cache)

    return lookup


def binding_evaluation_steps(node: PlanNode) -> int:
    """Evaluation steps of one plan's bindings (LM-07).

    Each binding counts one step, plus the reference lookups, ``list``
    arguments and pipe calls of its expression and of its ``when``.
    """
    steps = len(node.bindings)
    for binding in node.bindings.values():
        if isinstance(binding, ExpressionSource):
            steps += expression_evaluation_steps(binding.expression)
        if binding.when is not None:
            steps += expression_evaluation_steps(binding.when)
    return steps


_SCALARS: Final = (type(None), bool, int, str)
_UNBOUNDED: Final = 1 << 62


def string_size(value: str) -> int:
    """Canonical size of a JSON string, quotes included."""
    text = _encode_string(value)
    # Escaped ASCII text is its own UTF-8 encoding; only other text needs
    # encoding (which also rejects lone surrogates, as the canonical form does).
    return len(text) if value.isascii() else len(text.encode("utf-8"))


def canonical_size(value: object) -> int:
    """Exact canonical JSON size of a frozen value (JS-05).

    Equal to ``bounded_json_size(value, limit)`` whenever that is within
    ``limit``, but walks frozen objects and arrays directly: planning sizes
    every plan and every snapshot output, so this is on the hot path. Any
    other container type is measured by :func:`dagwerk.json.bounded_json_size`.
    """
    if type(value) is str:
        return string_size(value)
    if type(value) is int:
        return len(int.__repr__(value))
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    if type(value) is float:
        if not math.isfinite(value):
            raise ValueError("JSON numbers must be finite")
        return len(float.__repr__(value))
    if type(value) is FrozenDict:
        items = value.items()
        count = len(items)
        total = 1 + 2 * count if count else 2
        for key, item in items:
            total += string_size(key) + canonical_size(item)
        return total
    if type(value) is tuple:
        count = len(value)
        total = 1 + count if count else 2
        for item in value:
            total += canonical_size(item)
        return total
    return bounded_json_size(value, _UNBOUNDED)


def _freeze_value(name: str, value: object) -> JsonValue:
    """Freeze a binding result; non-JSON data is a planning error (BD-08)."""
    kind = type(value)
    if kind in _SCALARS:
        return value  # type: ignore[return-value]
    if kind is float and math.isfinite(value):  # type: ignore[arg-type]
        return value  # type: ignore[return-value]
    try:
        return freeze_json(value)
    except ValueError as exc:
        raise PlanningError(
            f"parameter {name!r} did not resolve to JSON-compatible data: {exc}",
            code="binding_invalid",
            field=name,
        ) from exc


def _freeze_parameters(parameters: dict[str, JsonValue]) -> FrozenDict:
    """Freeze a parameter mapping whose values are already frozen JSON."""
    if not parameters:
        return _EMPTY_PARAMETERS
    # A flat object of scalars is copied without a walk; frozen members
    # are reused with their recorded counts.
    return FrozenDict(parameters)


class PlanBindingResolver:
    """A node's bindings, prepared once and resolved for each plan of a launch.

    The field cache and the evaluation budget are shared by every plan the
    resolver serves, so side-edge fields are extracted once (BD-10) and the
    launch byte budget is cumulative (BD-09).
    """

    __slots__ = ("_bindings", "_budget", "_cache", "_runtime_inputs", "_uses_lookup")

    def __init__(
        self,
        node: PlanNode,
        runtime_inputs: Mapping[str, JsonValue],
        *,
        field_cache: FieldValueCache | None = None,
        evaluation_budget: EvaluationBudget | None = None,
    ) -> None:
        prepared: list[tuple[str, int, InputBinding]] = []
        uses_lookup = False
        for name, binding in node.bindings.items():
            if isinstance(binding, EdgeSource):
                kind = _EDGE
            elif isinstance(binding, LiteralSource):
                kind = _LITERAL
            elif isinstance(binding, RuntimeSource):
                kind = _RUNTIME
            elif isinstance(binding, SecretSource):
                kind = _SECRET
            elif isinstance(binding, ExpressionSource):
                kind = _EXPRESSION
                uses_lookup = True
            else:
                raise PlanningError(
                    f"unsupported binding for parameter {name!r}",
                    code="binding_invalid",
                    field=name,
                )
            if binding.when is not None:
                uses_lookup = True
            prepared.append((name, kind, binding))
        self._bindings = tuple(prepared)
        self._runtime_inputs = runtime_inputs
        self._cache: FieldValueCache = field_cache if field_cache is not None else {}
        self._budget = evaluation_budget
        self._uses_lookup = uses_lookup

    def resolve(
        self,
        outputs_by_edge: Mapping[str, Sequence[OutputRef]],
        *,
        base_parameters: Mapping[str, JsonValue] | None = None,
    ) -> tuple[FrozenDict, Mapping[str, str]]:
        """``(parameters, secret_refs)`` of one plan.

        Parameters start from ``base_parameters`` (the run input of a root
        plan, BD-07). An active binding replaces a same-named parameter; an
        inactive one (falsy ``when``, BD-06) leaves it alone. Dynamic
        bindings (edge, runtime, expression) that resolve to ``null`` remove
        the parameter (BD-04); literal ``null`` is kept (BD-02). A secret
        binding records only its reference name (BD-05).

        Raises :class:`~dagwerk.errors.PlanningError` or
        :class:`~dagwerk.errors.ExpressionError`.
        """
        parameters: dict[str, JsonValue] = dict(base_parameters) if base_parameters else {}
        if not self._bindings:
            return _freeze_parameters(parameters), _EMPTY_SECRETS
        runtime_inputs = self._runtime_inputs
        budget = self._budget
        cache = self._cache
        lookup: Lookup | None = None
        if self._uses_lookup:
            lookup = build_expression_lookup(outputs_by_edge, runtime_inputs, field_cache=cache)
        secret_refs: dict[str, str] | None = None

        for name, kind, binding in self._bindings:
            when = binding.when
            if when is not None:
                assert lookup is not None
                # Python truth value testing decides: "" 0 false null [] {}
                # are false, the string "false" is true. Errors propagate.
                if not resolve_expression(when, lookup, budget=budget):
                    continue
            value: object
            if kind == _EDGE:
                assert isinstance(binding, EdgeSource)
                outputs = outputs_by_edge.get(binding.edge)
                if outputs is None:
                    value = None
                else:
                    value = _edge_field(binding.edge, outputs, binding.field, cache)
            elif kind == _LITERAL:
                assert isinstance(binding, LiteralSource)
                parameters[name] = binding.value
                continue
            elif kind == _RUNTIME:
                assert isinstance(binding, RuntimeSource)
                value = runtime_inputs.get(binding.key, _MISSING)
                if value is _MISSING:
                    value = binding.default
                if binding.required and (value is None or value == ""):
                    raise PlanningError(
                        f"required runtime input {binding.key!r} is missing",
                        code="runtime_input_missing",
                        field=binding.key,
                    )
            elif kind == _SECRET:
                assert isinstance(binding, SecretSource)
                parameters.pop(name, None)
                if secret_refs is None:
                    secret_refs = {}
                secret_refs[name] = binding.name
                continue
            else:
                assert isinstance(binding, ExpressionSource)
                assert lookup is not None
                value = resolve_expression(binding.expression, lookup, budget=budget)

            frozen = _freeze_value(name, value)
            if budget is not None:
                budget.charge_size(canonical_size(frozen))
            if frozen is None:
                parameters.pop(name, None)
            else:
                parameters[name] = frozen

        secrets = _EMPTY_SECRETS if secret_refs is None else MappingProxyType(secret_refs)
        return _freeze_parameters(parameters), secrets


def resolve_plan_bindings(
    node: PlanNode,
    outputs_by_edge: Mapping[str, Sequence[OutputRef]],
    runtime_inputs: Mapping[str, JsonValue],
    *,
    base_parameters: Mapping[str, JsonValue] | None = None,
    field_cache: FieldValueCache | None = None,
    evaluation_budget: EvaluationBudget | None = None,
) -> tuple[FrozenDict, Mapping[str, str]]:
    """Resolve one plan's bindings into ``(parameters, secret_refs)``.

    See :meth:`PlanBindingResolver.resolve` for the rules. Raises
    :class:`~dagwerk.errors.PlanningError` for a missing required runtime
    input or non-JSON data, and :class:`~dagwerk.errors.ExpressionError` for
    expression failures and budget exhaustion.
    """
    resolver = PlanBindingResolver(
        node, runtime_inputs, field_cache=field_cache, evaluation_budget=evaluation_budget
    )
    return resolver.resolve(outputs_by_edge, base_parameters=base_parameters)
