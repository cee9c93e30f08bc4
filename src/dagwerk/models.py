"""Pipeline, routing and plan models (pydantic v2).

Except :class:`DagNode`, every model is frozen, forbids unknown fields and
re-validates on ``model_copy(update=...)``. JSON-valued fields are frozen on
input (:class:`~dagwerk.json.FrozenDict`, tuples) and thawed on
serialisation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Literal,
    Protocol,
    Self,
    TypeAlias,
    runtime_checkable,
)

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    Strict,
    StringConstraints,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from typing_extensions import TypeAliasType

from dagwerk._trusted import trusted_model
from dagwerk.constants import (
    MAX_EXPRESSION_LENGTH,
    MAX_FILTER_MEMBERSHIP_VALUES,
    MAX_FILTER_RULES_PER_EDGE,
    MAX_INPUT_EDGES_PER_NODE,
    MAX_NODE_BINDINGS,
    MAX_OUTPUT_FIELDS_BYTES,
    MAX_OUTPUT_ID_LENGTH,
    MAX_OUTPUT_REFS_PER_PLAN,
    MAX_TASK_PLAN_BYTES,
    CorrelationMode,
    FilterOperator,
    InputMode,
    InputRole,
    LaunchCreateStatus,
    NodeDisposition,
    SortOrder,
)
from dagwerk.errors import ExpressionError, MaterializationError, PlanningError
from dagwerk.json import (
    FrozenDict,
    JsonValue,
    ReadOnlyDict,
    bounded_json_size,
    freeze_json,
    thaw_json,
)

__all__ = [
    "DagNode",
    "EdgeFilter",
    "EdgeSource",
    "EmittedOutput",
    "ExpressionError",
    "ExpressionSource",
    "FilterRule",
    "InputBinding",
    "InputEdge",
    "LaunchCreateResult",
    "LiteralSource",
    "MaterializationError",
    "NodeDefinition",
    "NodeLaunch",
    "OutputId",
    "OutputRef",
    "PlanNode",
    "PlannedEdgeInput",
    "PlanningError",
    "PlanningSnapshot",
    "ResolvedOutput",
    "RetryPolicySpec",
    "RuntimeSource",
    "SecretSource",
    "Selection",
    "TaskContext",
    "TaskInputPlan",
    "TaskInputs",
    "output_ref_routing_size",
]

_EDGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*", re.ASCII)
RESERVED_EDGE_NAME = "input"


def validate_edge_name(value: object) -> str:
    """Edge names: an ASCII letter or ``_``, then letters, digits, ``_``, ``-``; not ``input``."""
    if not isinstance(value, str):
        raise ValueError("edge name must be a string")
    if value == RESERVED_EDGE_NAME:
        raise ValueError("edge name 'input' is reserved for run input")
    if not _EDGE_NAME.fullmatch(value):
        raise ValueError(
            f"invalid edge name {value!r}: use an ASCII letter or '_' first, "
            "then letters, digits, '_' or '-'"
        )
    return value


def _freeze_json_field(value: object) -> JsonValue:
    return freeze_json(value)


OutputId: TypeAlias = Annotated[
    str, StringConstraints(strict=True, min_length=1, max_length=MAX_OUTPUT_ID_LENGTH)
]
EdgeName: TypeAlias = Annotated[str, PlainValidator(validate_edge_name)]
NonEmptyStr: TypeAlias = Annotated[str, StringConstraints(strict=True, min_length=1)]
ExpressionText: TypeAlias = Annotated[
    str, StringConstraints(strict=True, min_length=1, max_length=MAX_EXPRESSION_LENGTH)
]
StrictIndex: TypeAlias = Annotated[int, Strict(), Field(ge=0)]
if TYPE_CHECKING:
    JsonField: TypeAlias = JsonValue
else:
    # The recursive alias is for type checkers; pydantic only needs the hooks.
    # Model schemas name the JSON value type once under ``$defs`` as
    # ``JsonValue`` and refer to it.
    _JsonSchemaValue = TypeAliasType(
        "JsonValue",
        "bool | int | float | str | list[_JsonSchemaValue] | dict[str, _JsonSchemaValue] | None",
    )
    JsonField = Annotated[
        Any,
        PlainValidator(_freeze_json_field, json_schema_input_type=_JsonSchemaValue),
        PlainSerializer(thaw_json, return_type=_JsonSchemaValue),
    ]


class _FrozenModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; ``update`` values are validated like constructor arguments."""
        if not update:
            return self if not deep else super().model_copy(deep=True)
        values = {name: getattr(self, name) for name in type(self).model_fields}
        values.update(update)
        return type(self).model_validate(values)


# --- bindings -------------------------------------------------------------


class _BindingBase(_FrozenModel):
    when: ExpressionText | None = Field(
        default=None,
        description="An expression; the binding applies only to tasks where it is true "
        '(Python truth: "", 0, false, null, [] and {} are false). Without it, always.',
    )


class EdgeSource(_BindingBase):
    """Read ``field`` from the outputs planned on edge ``edge``."""

    source: Literal["edge"] = "edge"
    edge: EdgeName = Field(description="Name of one of the node's input edges.")
    field: NonEmptyStr = Field(
        description="Routing field to read from the outputs planned on that edge for the "
        "task: one output's value, or the list of values when several outputs have it."
    )


class LiteralSource(_BindingBase):
    """A constant value (``null`` included)."""

    source: Literal["literal"] = "literal"
    value: JsonField = Field(default=None, description="The JSON value every task receives.")


class RuntimeSource(_BindingBase):
    """A value from the run input, with a default and an optional requirement."""

    source: Literal["runtime"] = "runtime"
    key: NonEmptyStr = Field(description="Key of the run input to read.")
    label: str = Field(default="", description="Title of the input in the pipeline's input schema.")
    placeholder: str = Field(
        default="", description="Example value shown for the input in its schema."
    )
    required: bool = Field(
        default=False, description="Planning fails when the value (or default) is null or empty."
    )
    default: JsonField = Field(default=None, description="Value used when the key is absent.")


class SecretSource(_BindingBase):
    """A secret reference; the worker resolves it, plans never hold its value."""

    source: Literal["secret"] = "secret"
    name: NonEmptyStr = Field(
        description="Name of the secret; the worker's secret resolver supplies its value."
    )


class ExpressionSource(_BindingBase):
    """An expression such as ``{records.title | trim}`` evaluated at planning."""

    source: Literal["expression"] = "expression"
    expression: ExpressionText = Field(
        description="Text with {edge.field}, {input.key} and pipes, e.g. {orders.title | trim}."
    )


InputBinding: TypeAlias = Annotated[
    EdgeSource | LiteralSource | RuntimeSource | SecretSource | ExpressionSource,
    Field(discriminator="source"),
]


# --- routing configuration ------------------------------------------------


class FilterRule(_FrozenModel):
    """One test of an output's routing field."""

    field: NonEmptyStr = Field(description="Routing field of the output to test.")
    operator: FilterOperator = Field(
        description="eq/neq compare JSON values; gt/gte/lt/lte compare numbers (numeric "
        "strings count); in/not_in test membership in a list; contains, starts_with and "
        'ends_with test text; exists/not_exists test presence (null and "" are absent).'
    )
    value: JsonField = Field(
        default=None, description="What the field is compared with (a list for in/not_in)."
    )

    @model_validator(mode="after")
    def _membership_size(self) -> Self:
        if (
            self.operator in (FilterOperator.IN, FilterOperator.NOT_IN)
            and isinstance(self.value, tuple)
            and len(self.value) > MAX_FILTER_MEMBERSHIP_VALUES
        ):
            raise ValueError(
                f"{self.operator.value} membership filter has {len(self.value)} values; "
                f"maximum is {MAX_FILTER_MEMBERSHIP_VALUES}"
            )
        return self


class EdgeFilter(_FrozenModel):
    """Keeps the outputs of an edge for which every rule holds."""

    rules: tuple[FilterRule, ...] = Field(
        default=(),
        max_length=MAX_FILTER_RULES_PER_EDGE,
        description="Rules that must all hold; a missing field satisfies only the negative "
        "operators (neq, not_in, not_contains, not_exists).",
    )


class Selection(_FrozenModel):
    """Keeps the first ``limit`` outputs of an edge, ordered by a field (after the filter)."""

    field: NonEmptyStr = Field(
        description="Routing field to sort by (all strings or all numbers; outputs without "
        "it are dropped)."
    )
    order: SortOrder = Field(default=SortOrder.ASC, description="asc or desc.")
    limit: Annotated[int, Strict(), Field(ge=1)] = Field(
        default=1, description="How many outputs to keep."
    )


class InputEdge(_FrozenModel):
    """A named input of a node: the outputs of another node."""

    name: EdgeName = Field(
        description="Name bindings and expressions use for this input (letters, digits, _ "
        "and -; not 'input')."
    )
    source: NonEmptyStr = Field(description="Slug of the node whose outputs flow in.")
    role: InputRole = Field(
        default=InputRole.MAIN,
        description="main edges decide the tasks (one per output with each, grouped with "
        "by_correlation); a side edge's outputs go to every task as they are.",
    )
    required: bool = Field(
        default=True,
        description="When the source is skipped or filters out everything, a required edge "
        "skips this node; an optional one gives its tasks no outputs on it.",
    )
    filter: EdgeFilter | None = Field(
        default=None, description="Keep only the outputs that pass these rules."
    )
    selection: Selection | None = Field(
        default=None, description="Keep only the top outputs by a field (after the filter)."
    )


# --- nodes ----------------------------------------------------------------


class RetryPolicySpec(BaseModel):
    """A node's retry settings, stored with the run (the worker turns them into
    a runtime ``RetryPolicy``).

    ``max_attempts`` counts the first attempt (1 = never retry). The delay
    before attempt ``n + 1`` is ``min(backoff_max, backoff_base * 2 ** (n - 1))``,
    drawn from ``[0, that]`` with ``jitter``. ``retry_on`` and ``give_up_on``
    name exception classes (``"TimeoutError"`` or ``"module.Class"``); an empty
    ``retry_on`` retries every exception.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(
        default=1, ge=1, le=1000, description="Attempts in all, the first included (1: no retry)."
    )
    backoff_base: float = Field(
        default=1.0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds before the first retry; the delay doubles with each retry.",
    )
    backoff_max: float = Field(
        default=60.0, ge=0, allow_inf_nan=False, description="Longest delay between attempts."
    )
    jitter: bool = Field(
        default=True, description="Draw each delay at random from 0 up to its computed value."
    )
    retry_on: tuple[NonEmptyStr, ...] = Field(
        default=(),
        description="Exception classes that are retried ('TimeoutError', 'module.Class'); "
        "empty: every exception.",
    )
    give_up_on: tuple[NonEmptyStr, ...] = Field(
        default=(), description="Exception classes that are never retried."
    )

    @model_validator(mode="after")
    def _check_backoff(self) -> Self:
        if self.backoff_max < self.backoff_base:
            raise ValueError("backoff_max must be >= backoff_base")
        return self


class DagNode(BaseModel):
    """One step of a pipeline. Mutable, validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True)

    name: str = Field(default="", description="A human-readable name (optional).")
    slug: NonEmptyStr = Field(
        description="The node's ID, unique in the pipeline; edges name their source by it."
    )
    plugin: NonEmptyStr = Field(
        description="The plugin that runs each task: a registered name or 'module:function'."
    )
    edges: tuple[InputEdge, ...] = Field(
        default=(),
        max_length=MAX_INPUT_EDGES_PER_NODE,
        description="The node's inputs: outputs of other nodes. A node without edges is a "
        "root and receives the run input as its parameters.",
    )
    bindings: dict[str, InputBinding] = Field(
        default_factory=dict,
        max_length=MAX_NODE_BINDINGS,
        description="The parameters each task receives, by name: from an edge's field, a "
        "literal, the run input, a secret or an expression.",
    )
    input_mode: InputMode | None = Field(
        default=None,
        description="How tasks are planned from the main edges: each (one task per output), "
        "all (one task for everything) or by_correlation (one task per correlation ID). "
        "Required on a node with edges; a root runs once.",
    )
    correlation_mode: CorrelationMode = Field(
        default=CorrelationMode.DEFAULT,
        description="Which correlation ID this node's outputs carry: new (each output starts "
        "a group), inherit (the task's group), none, or default (new for a root, inherit "
        "for each and by_correlation, none for all). See docs/correlation.md.",
    )
    timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds an attempt may run before it is stopped; it is retried under "
        "retry, else the task crashes. Default: the worker's.",
    )
    retry: RetryPolicySpec | None = Field(
        default=None,
        description="Retries of a failed attempt; default: the plugin's registered policy, "
        "else no retry.",
    )
    queue: NonEmptyStr = Field(
        default="default", description="Queue of this node's tasks; a worker serves chosen queues."
    )
    priority: int = Field(
        default=0, description="Among due tasks of a queue, higher priority runs first."
    )
    wait_timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="A task of this node WAITING longer than this is reported as stalled.",
    )
    cost_estimate: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="Cost a cost-limited run reserves for each task of this node (before the "
        "plugin's registered estimate).",
    )

    @field_validator("bindings")
    @classmethod
    def _check_bindings(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not isinstance(key, str) or not key:
                raise ValueError("binding names must not be empty")
        return value

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; ``update`` values are validated like constructor arguments."""
        if not update and type(self) is DagNode:
            # Every value here passed validation (on construction or
            # assignment) and every nested model is frozen, so re-validating
            # would only rebuild the containers: a copy with its own bindings
            # dict is the same result for a fraction of the cost (the worker
            # copies a cached node per task).
            state = dict(self.__dict__)
            state["bindings"] = dict(self.bindings)
            copy = type(self).__new__(type(self))
            object.__setattr__(copy, "__dict__", state)
            object.__setattr__(copy, "__pydantic_fields_set__", set(state))
            object.__setattr__(copy, "__pydantic_extra__", None)
            object.__setattr__(copy, "__pydantic_private__", None)
            return copy
        values: dict[str, Any] = {name: getattr(self, name) for name in type(self).model_fields}
        values["bindings"] = dict(self.bindings)
        if update:
            values.update(update)
        return type(self).model_validate(values)


@runtime_checkable
class NodeDefinition(Protocol):
    """A read-only node, as held by :class:`dagwerk.topology.RunTopology`."""

    @property
    def name(self) -> str: ...
    @property
    def slug(self) -> str: ...
    @property
    def plugin(self) -> str: ...
    @property
    def edges(self) -> tuple[InputEdge, ...]: ...
    @property
    def bindings(self) -> Mapping[str, InputBinding]: ...
    @property
    def input_mode(self) -> InputMode: ...
    @property
    def correlation_mode(self) -> CorrelationMode: ...


PlanNode: TypeAlias = NodeDefinition | DagNode
"""What planning and binding resolution accept: a topology's frozen node, or
a :class:`DagNode` as declared (an undeclared ``input_mode`` is then ALL for a
root and an error for any other node)."""


# --- outputs and plans ----------------------------------------------------


def _check_fields_size(value: FrozenDict) -> FrozenDict:
    if bounded_json_size(value, MAX_OUTPUT_FIELDS_BYTES) > MAX_OUTPUT_FIELDS_BYTES:
        raise ValueError(f"output fields exceed the {MAX_OUTPUT_FIELDS_BYTES}-byte limit")
    return value


def _read_only_copy(value: object) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ValueError("data must be a mapping")
    return value if type(value) is ReadOnlyDict else ReadOnlyDict(value)


OutputFields: TypeAlias = FrozenDict
"""Routing fields: a JSON object (each use defaults to an empty one with
``Field(default_factory=FrozenDict)`` on the field itself, where type
checkers see the default; inside ``Annotated`` they did not)."""
ReadOnlyData: TypeAlias = Annotated[
    Mapping[str, object],
    PlainValidator(_read_only_copy),
    PlainSerializer(dict, return_type=dict),
    WithJsonSchema({"type": "object"}),
]


class OutputRef(_FrozenModel):
    """Routing metadata of one published output."""

    id: OutputId
    fields: OutputFields = Field(default_factory=FrozenDict)
    correlation_id: OutputId | None = None

    @field_validator("fields")
    @classmethod
    def _fields_size(cls, value: FrozenDict) -> FrozenDict:
        return _check_fields_size(value)


def output_ref_routing_size(output: OutputRef, *, limit: int = 1 << 62) -> int:
    """Canonical byte size of ``{"correlation_id", "fields", "id"}`` of one output."""
    return bounded_json_size(
        {"correlation_id": output.correlation_id, "fields": output.fields, "id": output.id},
        limit,
    )


class PlannedEdgeInput(_FrozenModel):
    edge: EdgeName
    source_index: StrictIndex
    role: InputRole
    output_ids: tuple[OutputId, ...] = ()

    @field_validator("output_ids")
    @classmethod
    def _unique(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("planned edge contains duplicate output IDs")
        return value


def _secret_refs(value: object) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError("secret_refs must be a mapping")
    for key, name in value.items():
        if not isinstance(key, str) or not isinstance(name, str):
            raise ValueError("secret targets and names must be strings")
        if not key:
            raise ValueError("secret reference targets must not be empty")
        if not name:
            raise ValueError("secret reference names must not be empty")
    return value if type(value) is ReadOnlyDict else ReadOnlyDict(value)


SecretRefs: TypeAlias = Annotated[
    Mapping[str, str],
    PlainValidator(_secret_refs),
    PlainSerializer(dict, return_type=dict),
    WithJsonSchema({"type": "object"}),
]


def _schema_version(value: object) -> Literal[1]:
    if type(value) is not int or value != 1:
        raise ValueError("unsupported task plan schema_version; expected the integer 1")
    return 1


class TaskInputPlan(_FrozenModel):
    """The routing decision for one task, fixed at planning."""

    schema_version: Annotated[Literal[1], PlainValidator(_schema_version)] = 1
    generation: StrictIndex
    edges: tuple[PlannedEdgeInput, ...] = Field(default=(), max_length=MAX_INPUT_EDGES_PER_NODE)
    parameters: OutputFields = Field(default_factory=FrozenDict)
    secret_refs: SecretRefs = Field(default_factory=ReadOnlyDict)
    correlation_id: OutputId | None = None

    @model_validator(mode="after")
    def _check_plan(self) -> Self:
        names = [edge.edge for edge in self.edges]
        if len(set(names)) != len(names):
            raise ValueError("plan edge names must be unique")
        overlap = set(self.parameters) & set(self.secret_refs)
        if overlap:
            raise ValueError(f"parameter and secret targets overlap: {sorted(overlap)}")
        refs = sum(len(edge.output_ids) for edge in self.edges)
        if refs > MAX_OUTPUT_REFS_PER_PLAN:
            raise ValueError(
                f"plan references {refs} outputs; maximum is {MAX_OUTPUT_REFS_PER_PLAN}"
            )
        size = task_plan_size(self, limit=MAX_TASK_PLAN_BYTES)
        if size > MAX_TASK_PLAN_BYTES:
            raise ValueError(f"task plan exceeds the {MAX_TASK_PLAN_BYTES}-byte limit")
        return self


def task_plan_size(plan: TaskInputPlan, *, limit: int) -> int:
    """Canonical serialised size of a plan, or ``limit + 1`` once past ``limit``."""
    wire = {
        "correlation_id": plan.correlation_id,
        "edges": [
            {
                "edge": e.edge,
                "output_ids": e.output_ids,
                "role": e.role.value,
                "source_index": e.source_index,
            }
            for e in plan.edges
        ],
        "generation": plan.generation,
        "parameters": plan.parameters,
        "schema_version": plan.schema_version,
        "secret_refs": dict(plan.secret_refs),
    }
    return bounded_json_size(wire, limit)


class EmittedOutput(_FrozenModel):
    """An output reported by a worker: routing ``fields`` plus materialised ``data``."""

    id: OutputId
    fields: OutputFields = Field(default_factory=FrozenDict)
    data: ReadOnlyData = Field(default_factory=ReadOnlyDict)

    @field_validator("fields")
    @classmethod
    def _fields_size(cls, value: FrozenDict) -> FrozenDict:
        return _check_fields_size(value)


_ID_AND_FIELDS = frozenset({"id", "fields"})
_NO_DATA: ReadOnlyDict[str, object] = ReadOnlyDict()


def emitted_output(output_id: str, fields: dict[str, object]) -> EmittedOutput:
    """``EmittedOutput(id=output_id, fields=fields)``: the same checks and the
    same result, without pydantic's per-call work (a worker builds one per
    plugin output). Values that fail a check go through validation, which
    raises its usual error."""
    if (
        type(fields) is dict
        and type(output_id) is str
        and 0 < len(output_id) <= MAX_OUTPUT_ID_LENGTH
    ):
        try:
            frozen = _check_fields_size(FrozenDict(fields))
        except ValueError:
            pass
        else:
            return trusted_model(
                EmittedOutput,
                {"id": output_id, "fields": frozen, "data": _NO_DATA},
                _ID_AND_FIELDS,
            )
    return EmittedOutput(id=output_id, fields=fields)


class ResolvedOutput(_FrozenModel):
    """A materialised output, as a worker receives it."""

    id: OutputId
    fields: OutputFields = Field(default_factory=FrozenDict)
    data: ReadOnlyData = Field(default_factory=ReadOnlyDict)

    @field_validator("fields")
    @classmethod
    def _fields_size(cls, value: FrozenDict) -> FrozenDict:
        return _check_fields_size(value)


class TaskInputs(_FrozenModel):
    """What a plugin receives: resolved outputs per edge and the plan's parameters."""

    edges: Annotated[Mapping[str, tuple[ResolvedOutput, ...]], AfterValidator(ReadOnlyDict)]
    parameters: OutputFields = Field(default_factory=FrozenDict)


class PlanningSnapshot(_FrozenModel):
    """One consistent view of a node's sources, as loaded by the store."""

    token: NonEmptyStr
    generation: StrictIndex
    outputs_by_edge: Annotated[Mapping[str, tuple[OutputRef, ...]], AfterValidator(ReadOnlyDict)]
    source_dispositions: Annotated[Mapping[str, NodeDisposition], AfterValidator(ReadOnlyDict)]
    runtime_inputs: OutputFields = Field(default_factory=FrozenDict)


class NodeLaunch(_FrozenModel):
    """The record of one node generation's planning outcome."""

    id: NonEmptyStr
    run_id: NonEmptyStr
    node_index: StrictIndex
    plugin_name: NonEmptyStr
    generation: StrictIndex
    disposition: NodeDisposition
    task_ids: tuple[str, ...] = ()
    complete: bool = False
    error: str = ""

    @model_validator(mode="after")
    def _check_disposition(self) -> Self:
        if any(not task_id for task_id in self.task_ids):
            raise ValueError("task ids must be non-empty")
        if len(set(self.task_ids)) != len(self.task_ids):
            raise ValueError("task ids must be unique")
        if self.disposition is NodeDisposition.LAUNCHED:
            if not self.task_ids:
                raise ValueError("a launched node must own at least one task")
        else:
            if self.task_ids:
                raise ValueError(f"a {self.disposition.value} launch owns no tasks")
            if not self.complete:
                raise ValueError(f"a {self.disposition.value} launch is complete on creation")
            if self.disposition is NodeDisposition.FAILED and not self.error:
                raise ValueError("a failed launch must carry an error")
        return self


class LaunchCreateResult(_FrozenModel):
    status: LaunchCreateStatus
    launch: NodeLaunch | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.status is LaunchCreateStatus.STALE:
            if self.launch is not None:
                raise ValueError("a stale result carries no launch")
        elif self.launch is None:
            raise ValueError(f"a {self.status.value} result must carry its launch")
        return self


class TaskContext(_FrozenModel):
    """Where a task sits: its run, node and generation."""

    run_id: NonEmptyStr
    node_index: StrictIndex
    generation: StrictIndex
