"""A pipeline's run-input schema, run-input merging and binding checks.

Schema fields come from three places, in this order: the ``runtime`` inputs
that plugins declare, ``RuntimeSource`` bindings, and ``input.*`` references
in binding expressions and ``when`` clauses. Each name appears once; the
first declaration wins (RI-01).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dagwerk.constants import MAX_RUN_INPUT_BYTES, InputMode
from dagwerk.errors import DagwerkError, GraphValidationError
from dagwerk.expressions import extract_refs
from dagwerk.graph import FrozenNode, find_binding_problem, normalise_node
from dagwerk.json import FrozenDict, JsonInput, JsonValue, bounded_json_size, freeze_json
from dagwerk.limits import DEFAULT_LIMITS
from dagwerk.models import DagNode, ExpressionSource, NodeDefinition, RuntimeSource
from dagwerk.plugins import PluginLookup

__all__ = [
    "InputFieldSpec",
    "RunInputError",
    "get_pipeline_input_schema",
    "merge_run_input",
    "validate_binding_references",
]

RUNTIME_SOURCE = "runtime"


class RunInputError(DagwerkError, ValueError):
    """Run input cannot be accepted: missing, not JSON, or too large.

    ``code`` is ``missing_required_input``, ``run_input_invalid`` or
    ``run_input_too_large``.
    """

    code = "run_input_invalid"


@dataclass(frozen=True, slots=True)
class InputFieldSpec:
    """One field of a pipeline's run-input schema.

    ``name`` is non-empty; ``default`` must be JSON and is stored frozen.
    """

    name: str
    label: str
    placeholder: str = ""
    required: bool = False
    default: JsonInput = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise RunInputError("input field name must not be empty", field="name")
        try:
            frozen = freeze_json(self.default)
        except ValueError as error:
            raise RunInputError(
                f"default of input field '{self.name}' is not JSON-compatible: {error}",
                field=self.name,
            ) from error
        object.__setattr__(self, "default", frozen)


def _title(name: str) -> str:
    return name.replace("_", " ").title()


def get_pipeline_input_schema(
    nodes: Sequence[DagNode | NodeDefinition], plugin_lookup: PluginLookup
) -> list[InputFieldSpec]:
    """The run-input fields of a pipeline, each name once (RI-01).

    First every plugin's ``runtime`` inputs (nodes in order; plugins the
    lookup does not know are skipped), then per binding: a ``RuntimeSource``
    key (label: the binding's label, else the parameter name title-cased),
    and the ``input.*`` keys of its expression and ``when`` clause (sorted per
    expression, label: the key title-cased). Raises
    :class:`~dagwerk.errors.ExpressionError` for invalid expression syntax.
    """
    fields: list[InputFieldSpec] = []
    seen: set[str] = set()

    def add(spec: InputFieldSpec) -> None:
        seen.add(spec.name)
        fields.append(spec)

    for node in nodes:
        plugin = plugin_lookup(node.plugin)
        if plugin is None:
            continue
        for item in plugin.get_effective_inputs():
            if item.source == RUNTIME_SOURCE and item.name not in seen:
                add(
                    InputFieldSpec(
                        name=item.name,
                        label=item.description,
                        placeholder=item.placeholder,
                        required=item.required,
                        default=item.default,
                    )
                )

    for node in nodes:
        for parameter, binding in node.bindings.items():
            if isinstance(binding, RuntimeSource) and binding.key not in seen:
                add(
                    InputFieldSpec(
                        name=binding.key,
                        label=binding.label or _title(parameter),
                        placeholder=binding.placeholder,
                        required=binding.required,
                        default=binding.default,
                    )
                )
            texts: list[str] = []
            if isinstance(binding, ExpressionSource):
                texts.append(binding.expression)
            if binding.when is not None:
                texts.append(binding.when)
            for text in texts:
                _namespaces, input_keys = extract_refs(text)
                for key in sorted(input_keys):
                    if key not in seen:
                        add(InputFieldSpec(name=key, label=_title(key)))
    return fields


def _is_blank(value: object) -> bool:
    # ``0`` and ``False`` are values; only null and the empty string are blank.
    return value is None or (isinstance(value, str) and value == "")


def merge_run_input(
    schema_fields: Sequence[InputFieldSpec],
    default_input: Mapping[str, object],
    run_input: Mapping[str, object],
    *,
    max_bytes: int = MAX_RUN_INPUT_BYTES,
) -> FrozenDict:
    """Merge schema defaults, pipeline defaults and supplied run input (RI-02).

    Precedence, lowest first: schema defaults that are not null or ``""``;
    every pipeline default (null and ``""`` included); supplied values that
    are not null or ``""`` (``0`` and ``false`` do override). A required
    field whose merged value is null or ``""`` raises :class:`RunInputError`
    ("missing required input: <labels>"). Keys must be strings and values
    JSON; the result is a frozen copy of at most ``max_bytes`` canonical
    bytes (the exact limit is accepted).
    """
    for name, supplied in (("default_input", default_input), ("run_input", run_input)):
        if not isinstance(supplied, Mapping):
            raise RunInputError(f"{name} must be a JSON object", field=name)

    merged: dict[object, object] = {
        spec.name: spec.default for spec in schema_fields if not _is_blank(spec.default)
    }
    merged.update(default_input)
    for key, value in run_input.items():
        if not _is_blank(value):
            merged[key] = value

    missing = [spec for spec in schema_fields if spec.required and _is_blank(merged.get(spec.name))]
    if missing:
        raise RunInputError(
            f"missing required input: {', '.join(spec.label or spec.name for spec in missing)}",
            code="missing_required_input",
            field=", ".join(spec.name for spec in missing),
        )

    frozen: dict[str, JsonValue] = {}
    for raw_key, raw_value in merged.items():
        if not isinstance(raw_key, str):
            raise RunInputError(
                f"run input keys must be strings, got {raw_key!r}", field="run_input"
            )
        try:
            frozen[raw_key] = freeze_json(raw_value)
        except ValueError as error:
            raise RunInputError(
                f"run input {raw_key!r} is not JSON-compatible: {error}", field=raw_key
            ) from error
    try:
        result = FrozenDict(frozen)
    except ValueError as error:
        # Each value passed alone; together they cross a whole-object limit.
        raise RunInputError(f"run input exceeds a JSON limit: {error}") from error
    try:
        size = bounded_json_size(result, max_bytes)
    except ValueError as error:
        # Freezing accepts lone surrogates; only the UTF-8 size finds them.
        raise RunInputError(f"run input is not JSON-compatible: {error}") from error
    if size > max_bytes:
        raise RunInputError(
            f"run input exceeds the {max_bytes}-byte limit",
            code="run_input_too_large",
            limit=max_bytes,
        )
    return result


def validate_binding_references(
    nodes: Sequence[DagNode],
    *,
    max_evaluations: int = DEFAULT_LIMITS.max_node_binding_evaluations,
) -> str | None:
    """The first binding problem as text, or ``None`` (RI-03, GV-12).

    The text starts with the node's name, or ``"Node N"`` (1-based) when it
    has none. Node shape (modes, sources) is not checked here; see
    :func:`dagwerk.graph.validate_graph`.
    """
    for index, node in enumerate(nodes):
        label = getattr(node, "name", "") or f"Node {index + 1}"
        try:
            copy = normalise_node(node, index)
        except GraphValidationError as error:
            return f"{label}: invalid {error.field}: {error}"
        # Binding checks do not read the mode; ALL stands in for an absent one.
        frozen = FrozenNode.from_dag_node(copy, input_mode=copy.input_mode or InputMode.ALL)
        problem = find_binding_problem(frozen, max_evaluations=max_evaluations)
        if problem is not None:
            return f"{label}: {problem.message}"
    return None
