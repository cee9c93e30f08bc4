"""Reads made with a batch of completions for the reconcile after it (private).

See :class:`~dagwerk.store_completion_reads.CompletionReadsStore`. Inside a
thread's ``reads_with_completions`` block, a completion transaction that
completed launches of a run whose topology is cached sends, with its
``COMMIT``, the reads the reconcile after it makes next: the run's frontier
around the completed nodes (``run_frontier``, ``frontier_of_nodes``) and the
outputs of the completed nodes that are the only parents of a child (what
that child's planning snapshot reads). They run under the run lock the
completions hold, after their writes. The block's next frontier of that run,
and each such child's next planning snapshot, answer from them once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from dagwerk.limits import Limits
from dagwerk.topology import RunTopology

from .gateway import Params, Row

__all__ = ["AheadReads", "CompletionReads", "ReadsPlan", "snapshot_limit"]


_RUN_COLUMNS = ("run_id", "status", "epoch", "node_count", "run_input", "has_failure")
"""run_frontier's columns but complete_nodes."""


def snapshot_limit(max_outputs_per_edge: int, max_outputs_total: int) -> int:
    """Outputs a planning snapshot reads per source: one beyond each count
    limit (the overflow signal), never more."""
    return min(max_outputs_per_edge, max_outputs_total) + 1


@dataclass(slots=True)
class AheadReads:
    """What one completion transaction read of a run after its writes."""

    run: Row  # run_frontier's row (it has run_head's columns)
    counted: bool  # complete_nodes was counted
    nodes: frozenset[int]  # the node indices of frontier_of_nodes
    node_rows: dict[int, Row]  # their rows (generation, revision, active launch)
    outputs: dict[int, list[Row]]  # completed node -> outputs_of_node rows
    limit: int  # the outputs_of_node limit they were read with
    children: set[int]  # children whose snapshot may still answer from here
    frontier_left: bool = True

    @property
    def launches(self) -> dict[int, Row]:
        return {i: row for i, row in self.node_rows.items() if row["launch_id"] is not None}


class ReadsPlan(NamedTuple):
    """The reads one completion transaction sends for the reconcile after it."""

    run_id: str
    queries: list[tuple[str, Params]]
    sources: list[int]  # the completed nodes whose outputs are read
    served: set[int]  # the children whose planning snapshot those answer
    counted: bool  # complete launches are counted (a completed node is a leaf)
    limit: int  # outputs read per source


@dataclass(slots=True)
class _Block:
    runs: dict[str, AheadReads] = field(default_factory=dict)


class CompletionReads:
    """The reads ahead of each thread's ``reads_with_completions`` block."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextmanager
    def block(self) -> Iterator[None]:
        outer: _Block | None = getattr(self._local, "block", None)
        self._local.block = _Block()
        try:
            yield
        finally:
            self._local.block = outer

    def _runs(self) -> dict[str, AheadReads] | None:
        block: _Block | None = getattr(self._local, "block", None)
        return None if block is None else block.runs

    @property
    def active(self) -> bool:
        """Whether this thread is inside a block."""
        return self._runs() is not None

    def plan(
        self,
        run_id: str,
        topology: RunTopology,
        completed: Iterable[int],
        limits: Limits,
    ) -> ReadsPlan:
        """The reads to send for ``completed`` (nodes whose launch just completed)."""
        done = set(completed)
        # What the reconcile after them asks for (dagwerk.frontier).
        children, wanted, counted = topology.neighbourhood(done)
        served = {kid for kid in children if set(topology.dependencies[kid]) <= done}
        sources = sorted({source for kid in served for source in topology.dependencies[kid]})
        limit = snapshot_limit(
            limits.max_snapshot_outputs_per_edge, limits.max_snapshot_outputs_per_node
        )
        queries: list[tuple[str, Params]] = [
            ("run_frontier", {"run_id": run_id, "count": 1 if counted else 0}),
            ("frontier_of_nodes", {"run_id": run_id, "nodes": json.dumps(wanted)}),
            *(
                ("outputs_of_node", {"run_id": run_id, "node_index": i, "limit": limit})
                for i in sources
            ),
        ]
        return ReadsPlan(run_id, queries, sources, served, counted, limit)

    def keep(self, plan: ReadsPlan, found: list[list[Row]]) -> None:
        """Keep what the reads of ``plan`` returned, once they are committed."""
        runs = self._runs()
        if runs is None or not found[0]:
            return
        rows = found[1]
        runs[plan.run_id] = AheadReads(
            run=found[0][0],
            counted=plan.counted,
            nodes=frozenset(row["node_index"] for row in rows),
            node_rows={row["node_index"]: row for row in rows},
            outputs=dict(zip(plan.sources, found[2:], strict=True)),
            limit=plan.limit,
            children=set(plan.served),
        )

    def take_frontier(
        self, run_id: str, nodes: list[int], count_complete: bool
    ) -> tuple[Row, list[Row]] | None:
        """The run row and the node rows of a frontier the block read ahead
        for these nodes, once; ``None`` when it has none that covers them."""
        runs = self._runs()
        ahead = None if runs is None else runs.get(run_id)
        if (
            runs is None
            or ahead is None
            or not ahead.frontier_left
            or (count_complete and not ahead.counted)
            or not ahead.nodes.issuperset(nodes)
        ):
            return None
        ahead.frontier_left = False
        self._drop_if_spent(runs, run_id, ahead)
        run = {key: ahead.run[key] for key in _RUN_COLUMNS}
        run["complete_nodes"] = ahead.run["complete_nodes"] if count_complete else None
        return run, [ahead.node_rows[i] for i in nodes]

    def take_snapshot(
        self, run_id: str, node_index: int, sources: Mapping[str, int], limit: int
    ) -> AheadReads | None:
        """The reads ahead that answer the planning snapshot of ``node_index``
        with these sources, once; ``None`` when they do not cover it."""
        runs = self._runs()
        ahead = None if runs is None else runs.get(run_id)
        if (
            runs is None
            or ahead is None
            or node_index not in ahead.children
            or ahead.limit != limit
            or not set(sources.values()) <= ahead.outputs.keys()
            or node_index not in ahead.nodes
        ):
            return None
        ahead.children.discard(node_index)
        self._drop_if_spent(runs, run_id, ahead)
        return ahead

    @staticmethod
    def _drop_if_spent(runs: dict[str, AheadReads], run_id: str, ahead: AheadReads) -> None:
        # Once nothing more can answer from them, the rows (a large node's
        # outputs, say) go with the caller's last use, not with the block.
        if not ahead.frontier_left and not ahead.children:
            del runs[run_id]
