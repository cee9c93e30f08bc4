"""The pipelines and plugins of the benchmark suite.

Worker processes import this module (``dagwerk worker --plugins
bench.workloads``), which registers the plugins in dagwerk's default
registry; the submitter imports it for the node lists.

Plugins:
  ``bench_emit``  emits ``count`` items (``{"n": i}``), the root of a fan-out
  ``bench_step``  returns one small output and does nothing else
  ``bench_hop``   like ``bench_step`` but records ``node start end`` for
                  the ledger file of its process in the execution root, so
                  the driver can compute per-hop latency (W2); the entries are
                  kept in memory and written when the worker process exits,
                  and the end is marked after the entry is filed, so none of
                  the ledger's own work is inside any hop

The ledger is written by the plugin, so a hop is measured from the parent
plugin's return to the child plugin's entry: it contains the parent's
settlement commit, the reconcile that launches the child, the enqueue, the
dequeue, the claim and the hand-off to the plugin thread. That is an upper
bound on "parent committed -> child started".
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from pathlib import Path

import dagwerk
from dagwerk.constants import InputMode
from dagwerk.models import DagNode, EdgeSource, InputEdge, TaskInputs
from dagwerk.runtime.context import TaskContext

__all__ = [
    "LEDGER_GLOB",
    "chain_nodes",
    "fanout_nodes",
    "read_hops",
    "small_run_nodes",
]

LEDGER_GLOB = "hops-*.txt"

_ledger_lock = threading.Lock()
# Per ledger file: its entries, each ``[node, start, end]`` (times from
# ``time.time()``), formatted only when written.
_ledger: dict[Path, list[list[float]]] = {}


@dagwerk.plugin("bench_emit")
def emit(inputs: TaskInputs, ctx: TaskContext) -> object:
    """``count`` items ``{"n": i}``; the root of a fan-out."""
    count = int(str(inputs.parameters.get("count", 1)))
    return [{"n": n} for n in range(count)]


@dagwerk.plugin("bench_step")
def step(inputs: TaskInputs, ctx: TaskContext) -> object:
    """One small output; the cost of a task is then the engine's alone."""
    return {"ok": 1}


@dagwerk.plugin("bench_hop")
def hop(inputs: TaskInputs, ctx: TaskContext) -> object:
    """One output, and a ledger entry with this task's node, start and end.
    The end is marked last: filing the entry (a path, a lock) is the
    benchmark's own work, not the engine's, and stays out of the hop."""
    start = time.time()
    entry = [ctx.node_index, start, start]
    _append(ctx.execution_root, entry)
    entry[2] = time.time()
    return {"n": ctx.node_index}


def _append(root: Path, entry: list[float]) -> None:
    """File ``entry`` (``[node, start, end]``, the end may be set later) for
    the ledger of this process in ``root``."""
    path = root / f"hops-{os.getpid()}.txt"
    with _ledger_lock:
        entries = _ledger.get(path)
        if entries is None:
            if not _ledger:
                atexit.register(_write_ledgers)
            entries = _ledger[path] = []
        entries.append(entry)


def _write_ledgers() -> None:
    """Write the recorded entries as ``node start end`` lines (at the worker
    process's exit)."""
    with _ledger_lock:
        for path, entries in _ledger.items():
            with path.open("a") as handle:
                handle.writelines(f"{int(n)} {start!r} {end!r}\n" for n, start, end in entries)
        _ledger.clear()


def read_hops(directory: Path) -> list[float]:
    """Per-hop latencies in seconds from every ledger in ``directory``: for
    each node after the first, its start minus its parent's end."""
    ends: dict[int, float] = {}
    starts: dict[int, float] = {}
    for path in directory.glob(LEDGER_GLOB):
        for line in path.read_text().splitlines():
            node, start, end = line.split()
            starts[int(node)] = float(start)
            ends[int(node)] = float(end)
    return [starts[n] - ends[n - 1] for n in sorted(starts) if n - 1 in ends]


def fanout_nodes() -> list[DagNode]:
    """W1/W3/W5: root emits ``count`` items -> one EACH task per item -> one ALL join."""
    return [
        DagNode(slug="root", plugin="bench_emit"),
        DagNode(
            slug="each",
            plugin="bench_step",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="items", source="root"),),
            bindings={"n": EdgeSource(edge="items", field="n")},
        ),
        DagNode(
            slug="join",
            plugin="bench_step",
            input_mode=InputMode.ALL,
            edges=(InputEdge(name="items", source="each"),),
        ),
    ]


def chain_nodes(length: int) -> list[DagNode]:
    """W2: ``length`` single-task steps in sequence, each recording its hop."""
    nodes = [DagNode(slug="s0", plugin="bench_hop")]
    for index in range(1, length):
        nodes.append(
            DagNode(
                slug=f"s{index}",
                plugin="bench_hop",
                input_mode=InputMode.EACH,
                edges=(InputEdge(name="prev", source=f"s{index - 1}"),),
            )
        )
    return nodes


def small_run_nodes() -> list[DagNode]:
    """W4: a five-node run: a -> (b, c) -> d (ALL over both) -> e (ALL)."""
    return [
        DagNode(slug="a", plugin="bench_step"),
        DagNode(
            slug="b",
            plugin="bench_step",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="a", source="a"),),
        ),
        DagNode(
            slug="c",
            plugin="bench_step",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="a", source="a"),),
        ),
        DagNode(
            slug="d",
            plugin="bench_step",
            input_mode=InputMode.ALL,
            edges=(InputEdge(name="b", source="b"), InputEdge(name="c", source="c")),
        ),
        DagNode(
            slug="e",
            plugin="bench_step",
            input_mode=InputMode.ALL,
            edges=(InputEdge(name="d", source="d"),),
        ),
    ]
