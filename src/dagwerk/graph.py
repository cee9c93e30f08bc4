"""Pipeline graph validation and dependency queries.

A pipeline is a list of :class:`~dagwerk.models.DagNode`. Dependencies come
only from ``InputEdge.source`` slugs; several edges from one source make one
dependency. Validation works on re-validated copies and never changes the
caller's nodes. Every rejection is a :class:`~dagwerk.errors.GraphValidationError`
(a ``ValueError``) naming the node, the field and a stable rule.

Validation order (GV-14), first failure wins: empty list, model re-validation
of every node, slug uniqueness, unknown sources, per node (duplicate edge
names, then input and correlation modes), binding references and the binding
step budget, and finally the cycle check (Kahn's algorithm, no recursion).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from pydantic import ValidationError

from dagwerk.bindings import binding_evaluation_steps
from dagwerk.constants import CorrelationMode, InputMode, InputRole
from dagwerk.errors import ExpressionError, GraphValidationError
from dagwerk.expressions import extract_refs, validate_expression
from dagwerk.limits import DEFAULT_LIMITS, Limits
from dagwerk.models import (
    DagNode,
    EdgeSource,
    ExpressionSource,
    InputBinding,
    InputEdge,
    NodeDefinition,
    PlanNode,
)

__all__ = [
    "BindingProblem",
    "FrozenNode",
    "ValidatedPipeline",
    "build_children",
    "build_slug_to_index_map",
    "downstream_closure",
    "find_binding_problem",
    "find_ready_nodes",
    "find_root_nodes",
    "node_label",
    "normalise_node",
    "resolve_dependency_indices",
    "validate_graph",
    "validate_pipeline",
]

_MISSING: Final = object()
# The discriminator values of ``InputBinding``; pydantic puts the tag into the
# error location of a binding, which is noise in a field path.
_BINDING_TAGS: Final = frozenset({"edge", "literal", "runtime", "secret", "expression"})
# A 1,500-node ring must not produce a 20 kB message; ``cycle`` keeps all of it.
_CYCLE_MESSAGE_NODES: Final = 8


@dataclass(frozen=True, slots=True)
class FrozenNode:
    """An immutable node as held by a validated topology (a ``NodeDefinition``).

    ``input_mode`` is the effective mode: a root that omitted it reads ALL.
    ``bindings`` is a read-only mapping of frozen binding models.
    """

    name: str
    slug: str
    plugin: str
    edges: tuple[InputEdge, ...]
    bindings: Mapping[str, InputBinding] = field(hash=False)
    input_mode: InputMode
    correlation_mode: CorrelationMode

    @classmethod
    def from_dag_node(cls, node: DagNode, *, input_mode: InputMode) -> FrozenNode:
        """A frozen copy of a validated ``DagNode`` with its effective mode."""
        return cls(
            name=node.name,
            slug=node.slug,
            plugin=node.plugin,
            edges=tuple(node.edges),
            bindings=MappingProxyType(dict(node.bindings)),
            input_mode=input_mode,
            correlation_mode=node.correlation_mode,
        )

    def to_dag_node(self) -> DagNode:
        """A new mutable ``DagNode`` with the same definition (effective mode kept)."""
        return DagNode(
            name=self.name,
            slug=self.slug,
            plugin=self.plugin,
            edges=self.edges,
            bindings=dict(self.bindings),
            input_mode=self.input_mode,
            correlation_mode=self.correlation_mode,
        )


@dataclass(frozen=True, slots=True)
class ValidatedPipeline:
    """The result of :func:`validate_pipeline`: frozen copies and the graph."""

    nodes: tuple[FrozenNode, ...]
    slug_to_index: Mapping[str, int]
    dependencies: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class BindingProblem:
    """The first binding problem of one node, without the node prefix."""

    field: str
    rule: str
    message: str
    limit: int | None = None


def node_label(node: object, index: int) -> str:
    """The slug of ``node``, or ``"Node N"`` (1-based) when it has none."""
    slug = getattr(node, "slug", None)
    return slug if isinstance(slug, str) and slug else f"Node {index + 1}"


def _format_location(location: Sequence[int | str]) -> str:
    parts = list(location)
    if len(parts) >= 3 and parts[0] == "bindings" and parts[2] in _BINDING_TAGS:
        del parts[2]
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "node"


def _node_model_error(error: ValidationError, label: str) -> GraphValidationError:
    details = error.errors(include_url=False)
    first = details[0]
    where = _format_location(first["loc"])
    more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    return GraphValidationError(
        f"node '{label}': invalid {where}: {first['msg']}{more}",
        node=label,
        field=where,
        rule="invalid_field",
    )


def normalise_node(node: object, index: int) -> DagNode:
    """A re-validated copy of ``node``; the caller's node is never changed.

    Values set by bypassing validation (``model_construct``, or a raw dict put
    into ``node.bindings``) are validated here; a malformed one is reported
    as a :class:`GraphValidationError` naming the node and the field (GV-15).
    """
    label = node_label(node, index)
    if not isinstance(node, DagNode):
        raise GraphValidationError(
            f"{label}: pipeline entries must be DagNode objects, not {type(node).__name__}",
            node=label,
            field="node",
            rule="invalid_field",
        )
    values: dict[str, Any] = {}
    for name in DagNode.model_fields:
        value = getattr(node, name, _MISSING)
        if value is not _MISSING:
            values[name] = value
    # A new dict, so pydantic builds new binding models without touching the
    # caller's mapping (a raw dict placed there stays a dict).
    if isinstance(values.get("bindings"), Mapping):
        values["bindings"] = dict(values["bindings"])
    try:
        return DagNode.model_validate(values)
    except ValidationError as error:
        raise _node_model_error(error, label) from None


def _check_node_sizes(node: DagNode, limits: Limits) -> None:
    """Engine limits tighter than the model's own (LM-05, LM-06)."""
    for attribute, count, limit in (
        ("edges", len(node.edges), limits.max_input_edges_per_node),
        ("bindings", len(node.bindings), limits.max_node_bindings),
    ):
        if count > limit:
            raise GraphValidationError(
                f"node '{node.slug}' has {count} {attribute}; maximum is {limit}",
                node=node.slug,
                field=attribute,
                rule=f"too_many_{attribute}",
                limit=limit,
            )


def build_slug_to_index_map(nodes: Sequence[DagNode]) -> dict[str, int]:
    """Slug → index; an empty or duplicate slug raises ``GraphValidationError``."""
    index: dict[str, int] = {}
    for position, node in enumerate(nodes):
        slug = getattr(node, "slug", None)
        if not isinstance(slug, str) or not slug:
            label = f"Node {position + 1}"
            raise GraphValidationError(
                f"{label} has an empty slug", node=label, field="slug", rule="empty_slug"
            )
        if slug in index:
            raise GraphValidationError(
                f"duplicate node slug '{slug}' (nodes {index[slug] + 1} and {position + 1})",
                node=slug,
                field="slug",
                rule="duplicate_slug",
            )
        index[slug] = position
    return index


def _dependencies(
    nodes: Sequence[DagNode | NodeDefinition], slug_to_index: Mapping[str, int]
) -> list[list[int]]:
    dependencies: list[list[int]] = []
    for node in nodes:
        parents: list[int] = []
        for position, edge in enumerate(node.edges):
            parent = slug_to_index.get(edge.source)
            if parent is None:
                raise GraphValidationError(
                    f"node '{node.slug}' edge '{edge.name}' references unknown source "
                    f"'{edge.source}'",
                    node=node.slug,
                    field=f"edges[{position}].source",
                    rule="unknown_source",
                )
            # Several edges from one source are one barrier (GV-05); the
            # parent list is short (at most 64 edges), so a scan is cheapest.
            if parent not in parents:
                parents.append(parent)
        dependencies.append(parents)
    return dependencies


def resolve_dependency_indices(nodes: Sequence[DagNode]) -> list[list[int]]:
    """Parent indices per node, one per distinct source in first-seen order.

    Raises ``GraphValidationError`` for an empty or duplicate slug and for an
    edge naming an unknown source. Sources may follow their consumer.
    """
    return _dependencies(nodes, build_slug_to_index_map(nodes))


def build_children(dependencies: Sequence[Sequence[int]]) -> list[list[int]]:
    """Child indices per node, ascending, each child once."""
    count = len(dependencies)
    children: list[list[int]] = [[] for _ in range(count)]
    for child, parents in enumerate(dependencies):
        for parent in parents:
            if type(parent) is not int or not 0 <= parent < count:
                raise GraphValidationError(
                    f"node {child} depends on unknown node index {parent!r}",
                    node=f"Node {child + 1}",
                    field="dependencies",
                    rule="unknown_node_index",
                )
            siblings = children[parent]
            # Children are appended in ascending order, so a repeat is adjacent.
            if not siblings or siblings[-1] != child:
                siblings.append(child)
    return children


def _check_node_shape(node: DagNode) -> InputMode:
    """Edge-name and mode rules of one node (GV-06..GV-11); the effective mode."""
    seen: set[str] = set()
    for position, edge in enumerate(node.edges):
        if edge.name in seen:
            raise GraphValidationError(
                f"node '{node.slug}' has a duplicate edge name '{edge.name}'",
                node=node.slug,
                field=f"edges[{position}].name",
                rule="duplicate_edge_name",
            )
        seen.add(edge.name)

    if not node.edges:
        if node.input_mode not in (None, InputMode.ALL):
            raise GraphValidationError(
                f"root node '{node.slug}' must use ALL input mode, not "
                f"{node.input_mode.value.upper()}",
                node=node.slug,
                field="input_mode",
                rule="root_mode",
            )
        mode = InputMode.ALL
    else:
        if node.input_mode is None:
            raise GraphValidationError(
                f"non-root node '{node.slug}' must declare an input mode",
                node=node.slug,
                field="input_mode",
                rule="missing_input_mode",
            )
        mode = node.input_mode
        mains = [edge for edge in node.edges if edge.role is InputRole.MAIN]
        if mode is InputMode.EACH and (len(mains) != 1 or not mains[0].required):
            raise GraphValidationError(
                f"EACH node '{node.slug}' requires exactly one required main edge; "
                f"it has {len(mains)} main edge(s)"
                + ("" if len(mains) != 1 else " and that edge is optional"),
                node=node.slug,
                field="edges",
                rule="each_main_edge",
            )
        if mode is InputMode.BY_CORRELATION and not mains:
            raise GraphValidationError(
                f"BY_CORRELATION node '{node.slug}' requires at least one main edge",
                node=node.slug,
                field="edges",
                rule="by_correlation_main_edge",
            )

    if mode is InputMode.ALL and node.correlation_mode is CorrelationMode.INHERIT:
        raise GraphValidationError(
            f"node '{node.slug}' uses ALL input mode and cannot inherit a correlation ID",
            node=node.slug,
            field="correlation_mode",
            rule="inherit_correlation",
        )
    return mode


def find_binding_problem(
    node: PlanNode, *, max_evaluations: int = DEFAULT_LIMITS.max_node_binding_evaluations
) -> BindingProblem | None:
    """The first binding problem of ``node`` (GV-12, LM-07), or ``None``.

    Checks, binding by binding: an ``EdgeSource`` naming an edge the node
    does not have; expression and ``when`` syntax (pipes and arity
    included); expression and ``when`` namespaces that are neither ``input``
    nor an edge name. Then the node's binding step budget.
    """
    edge_names = {edge.name for edge in node.edges}
    for name, binding in node.bindings.items():
        if isinstance(binding, EdgeSource) and binding.edge not in edge_names:
            return BindingProblem(
                f"bindings.{name}.edge",
                "binding_reference",
                f"binding '{name}' references unknown edge '{binding.edge}'",
            )
        texts: list[tuple[str, str, str]] = []
        if isinstance(binding, ExpressionSource):
            texts.append(("expression", "expression", binding.expression))
        if binding.when is not None:
            texts.append(("when", "when-clause", binding.when))
        for attribute, kind, text in texts:
            where = f"bindings.{name}.{attribute}"
            error = validate_expression(text)
            namespaces: set[str] = set()
            if error is None:
                try:
                    namespaces, _input_keys = extract_refs(text)
                except ExpressionError as exc:
                    error = str(exc)
            if error is not None:
                return BindingProblem(
                    where, "binding_reference", f"binding '{name}' {kind} error: {error}"
                )
            unknown = namespaces - edge_names
            if unknown:
                return BindingProblem(
                    where,
                    "binding_reference",
                    f"binding '{name}' {kind} references unknown edges {sorted(unknown)!r}",
                )
    steps = binding_evaluation_steps(node)
    if steps > max_evaluations:
        return BindingProblem(
            "bindings",
            "binding_budget",
            f"bindings require {steps} evaluations; maximum is {max_evaluations}",
            limit=max_evaluations,
        )
    return None


def _find_cycle(dependencies: Sequence[Sequence[int]]) -> list[int] | None:
    """A cycle in data-flow order (each node feeds the next), or ``None``.

    Kahn's algorithm removes every node that can be ordered; what is left
    contains a cycle, and every node left keeps at least one parent that is
    left, so walking such parents must come back to a node already visited.
    Both passes are loops, so deep graphs cannot exhaust the Python stack.
    """
    children = build_children(dependencies)
    pending = [len(parents) for parents in dependencies]
    ready = deque(index for index, count in enumerate(pending) if count == 0)
    ordered = 0
    while ready:
        index = ready.popleft()
        ordered += 1
        for child in children[index]:
            pending[child] -= 1
            if pending[child] == 0:
                ready.append(child)
    if ordered == len(dependencies):
        return None

    current = next(index for index, count in enumerate(pending) if count > 0)
    visited: dict[int, int] = {}
    walk: list[int] = []
    while current not in visited:
        visited[current] = len(walk)
        walk.append(current)
        current = next(parent for parent in dependencies[current] if pending[parent] > 0)
    cycle = walk[visited[current] :]
    cycle.reverse()
    # Start at the lowest index so the report does not depend on the walk.
    start = cycle.index(min(cycle))
    return cycle[start:] + cycle[:start]


def _cycle_error(nodes: Sequence[FrozenNode], cycle: list[int]) -> GraphValidationError:
    slugs = tuple(nodes[index].slug for index in cycle)
    first = nodes[cycle[0]]
    feeding = slugs[-1]
    position = next(i for i, edge in enumerate(first.edges) if edge.source == feeding)
    shown = list(slugs[:_CYCLE_MESSAGE_NODES])
    if len(slugs) > _CYCLE_MESSAGE_NODES:
        shown.append(f"... {len(slugs) - _CYCLE_MESSAGE_NODES} more")
    shown.append(slugs[0])
    return GraphValidationError(
        f"cycle detected involving node '{slugs[0]}': {' -> '.join(shown)}",
        node=slugs[0],
        field=f"edges[{position}].source",
        rule="cycle",
        cycle=slugs,
    )


def validate_pipeline(
    nodes: Sequence[DagNode], *, limits: Limits = DEFAULT_LIMITS, parsed: bool = False
) -> ValidatedPipeline:
    """Validate a pipeline and return frozen copies of its nodes and its graph.

    Raises :class:`GraphValidationError` for the first problem in the order
    of GV-14. The caller's list and nodes are not changed; later changes to
    them do not reach the returned copies. ``parsed``: every node was just
    built by ``DagNode.model_validate`` from plain data and nothing else has
    held it since (a store parsing a stored definition), so it needs no
    re-validated copy (GV-15 guards values set around validation).
    """
    if not nodes:
        raise GraphValidationError("pipeline has no nodes", field="nodes", rule="empty_pipeline")
    copies = (
        list(nodes)
        if parsed and all(type(node) is DagNode for node in nodes)
        else [normalise_node(node, index) for index, node in enumerate(nodes)]
    )
    for copy in copies:
        _check_node_sizes(copy, limits)
    slug_to_index = build_slug_to_index_map(copies)
    dependencies = _dependencies(copies, slug_to_index)
    frozen = tuple(
        FrozenNode.from_dag_node(node, input_mode=_check_node_shape(node)) for node in copies
    )
    for node in frozen:
        problem = find_binding_problem(node, max_evaluations=limits.max_node_binding_evaluations)
        if problem is not None:
            raise GraphValidationError(
                f"node '{node.slug}': {problem.message}",
                node=node.slug,
                field=problem.field,
                rule=problem.rule,
                limit=problem.limit,
            )
    cycle = _find_cycle(dependencies)
    if cycle is not None:
        raise _cycle_error(frozen, cycle)
    return ValidatedPipeline(
        nodes=frozen,
        slug_to_index=MappingProxyType(slug_to_index),
        dependencies=tuple(tuple(parents) for parents in dependencies),
    )


def validate_graph(nodes: Sequence[DagNode], *, limits: Limits = DEFAULT_LIMITS) -> list[list[int]]:
    """Validate a pipeline (see :func:`validate_pipeline`); parent indices per node."""
    pipeline = validate_pipeline(nodes, limits=limits)
    return [list(parents) for parents in pipeline.dependencies]


def find_root_nodes(nodes: Sequence[DagNode], *, limits: Limits = DEFAULT_LIMITS) -> list[int]:
    """Indices of nodes without parents; ``[]`` for an empty list (not validated).

    A non-empty pipeline is validated first (GV-01).
    """
    if not nodes:
        return []
    return [
        index for index, parents in enumerate(validate_graph(nodes, limits=limits)) if not parents
    ]


def find_ready_nodes(
    dependencies: Sequence[Sequence[int]],
    completed: AbstractSet[int],
    launched: AbstractSet[int],
) -> list[int]:
    """Unlaunched nodes whose parents have all completed, in index order."""
    return [
        index
        for index, parents in enumerate(dependencies)
        if index not in launched and all(parent in completed for parent in parents)
    ]


def downstream_closure(
    dependencies: Sequence[Sequence[int]], boundary_indices: Iterable[int]
) -> set[int]:
    """The boundary nodes and all their descendants.

    An index outside the graph raises ``GraphValidationError``.
    """
    children = build_children(dependencies)
    closure: set[int] = set()
    stack: list[int] = []
    for index in boundary_indices:
        if type(index) is not int or not 0 <= index < len(children):
            raise GraphValidationError(
                f"boundary index {index!r} is not a node of this graph",
                field="boundary_indices",
                rule="unknown_node_index",
            )
        if index not in closure:
            closure.add(index)
            stack.append(index)
    while stack:
        for child in children[stack.pop()]:
            if child not in closure:
                closure.add(child)
                stack.append(child)
    return closure
