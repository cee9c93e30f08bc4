"""A run's published outputs, every node's at once.

A run's result holds the outputs of every node. Read node by node that is
two reads per node (the node's output IDs, then their data): for a chain of
200 steps, 400 transactions after the run ended, which a waiting client
paid in full. :class:`RunOutputsStore` answers with one read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from dagwerk.models import ResolvedOutput

__all__ = ["RunOutputsStore"]


@runtime_checkable
class RunOutputsStore(Protocol):
    """Every node's valid outputs of a run in one read (dagwerk extension;
    every bundled store). Without it a caller reads ``get_output_ids`` and
    ``resolve_outputs`` per node."""

    def get_run_outputs(self, run_id: str) -> Mapping[int, tuple[ResolvedOutput, ...]]:
        """The valid (not invalidated) outputs of the run, keyed by node
        index, each node's in publication order: what ``get_output_ids``
        and ``resolve_outputs`` give node by node, in one snapshot. A node
        without outputs, and an unknown run, have no entry."""
        ...
