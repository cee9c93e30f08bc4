"""The frozen, validated graph of one run.

A run's node definitions must not change after the run record is created.
:meth:`RunTopology.build` therefore validates the stored definition and keeps
immutable copies: later changes to the caller's ``DagNode`` objects do not
reach it, and nothing in it can be assigned or mutated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import MappingProxyType

from dagwerk.graph import (
    FrozenNode,
    build_children,
    downstream_closure,
    find_ready_nodes,
    validate_pipeline,
)
from dagwerk.limits import DEFAULT_LIMITS, Limits
from dagwerk.models import DagNode, NodeDefinition

__all__ = ["FrozenNode", "RunTopology"]


@dataclass(frozen=True, slots=True)
class RunTopology:
    """Validated, immutable nodes with their dependency graph.

    ``dependencies[i]`` lists the parents of node ``i`` (one per distinct
    source, first-seen order); ``children[i]`` its children in ascending
    order. ``slug_to_index`` is read-only. Root nodes read ``input_mode``
    ALL even when their definition omitted it.
    """

    nodes: tuple[NodeDefinition, ...]
    slug_to_index: Mapping[str, int] = field(hash=False)
    dependencies: tuple[tuple[int, ...], ...]
    children: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        # Direct construction gets the same protection as ``build``.
        if not isinstance(self.slug_to_index, MappingProxyType):
            object.__setattr__(self, "slug_to_index", MappingProxyType(dict(self.slug_to_index)))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(
            self, "dependencies", tuple(tuple(parents) for parents in self.dependencies)
        )
        object.__setattr__(self, "children", tuple(tuple(kids) for kids in self.children))

    @classmethod
    def build(
        cls, nodes: Sequence[DagNode], *, limits: Limits = DEFAULT_LIMITS, parsed: bool = False
    ) -> RunTopology:
        """Validate ``nodes`` (GV-01..GV-15) and freeze copies of them.

        Raises :class:`~dagwerk.errors.GraphValidationError` (a ``ValueError``),
        including for values that bypassed ``DagNode`` validation. ``parsed``:
        see :func:`~dagwerk.graph.validate_pipeline`.
        """
        pipeline = validate_pipeline(nodes, limits=limits, parsed=parsed)
        return cls(
            nodes=pipeline.nodes,
            slug_to_index=pipeline.slug_to_index,
            dependencies=pipeline.dependencies,
            children=tuple(tuple(kids) for kids in build_children(pipeline.dependencies)),
        )

    @property
    def roots(self) -> tuple[int, ...]:
        """Indices of the nodes without parents, ascending."""
        return tuple(index for index, parents in enumerate(self.dependencies) if not parents)

    def source_indices(self, node_index: int) -> Mapping[str, int]:
        """Edge name → source node index for one node (for planning snapshots)."""
        node = self.nodes[node_index]
        return MappingProxyType({edge.name: self.slug_to_index[edge.source] for edge in node.edges})

    def neighbourhood(self, completed: Iterable[int]) -> tuple[list[int], list[int], bool]:
        """After the launches of the ``completed`` nodes completed: their
        children, the nodes a reconcile of them reads (the children and every
        parent of theirs), both ascending, and whether a completed node is a
        leaf (only then can the run have completed)."""
        done = set(completed)
        children = sorted({kid for index in done for kid in self.children[index]})
        wanted = set(children)
        for kid in children:
            wanted.update(self.dependencies[kid])
        return children, sorted(wanted), any(not self.children[index] for index in done)

    def ready_nodes(self, completed: AbstractSet[int], launched: AbstractSet[int]) -> list[int]:
        """Unlaunched nodes whose parents have all completed (see ``find_ready_nodes``)."""
        return find_ready_nodes(self.dependencies, completed, launched)

    def downstream_closure(self, boundary_indices: Iterable[int]) -> set[int]:
        """The boundary nodes and all their descendants."""
        return downstream_closure(self.dependencies, boundary_indices)
