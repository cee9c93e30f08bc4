"""Plan an EACH node over a 100,000-output snapshot and report time and memory.

Run from the repository root::

    python -m bench.plan_each [--outputs N] [--json-only]

The snapshot is built first (outside the measured region); then
``construct_task_plans`` runs twice: once plain, for wall time and the
process's peak resident set (``ru_maxrss``), and once under ``tracemalloc``
for the peak of Python allocations made by planning itself. The figures are
printed as a table and as one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import resource
import sys
import time
import tracemalloc
from typing import Any

from dagwerk.constants import InputMode, NodeDisposition
from dagwerk.json import FrozenDict
from dagwerk.limits import Limits
from dagwerk.models import (
    DagNode,
    EdgeSource,
    InputEdge,
    NodeDefinition,
    OutputRef,
    PlanningSnapshot,
)
from dagwerk.planning import PlanConstruction, construct_task_plans
from dagwerk.topology import RunTopology

TARGET_SECONDS = 2.0
TARGET_MB = 300.0


def _rss_mb() -> float:
    # ru_maxrss is KiB on Linux and bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def build_snapshot(count: int) -> PlanningSnapshot:
    """``count`` outputs on edge ``items``, each with two routing fields.

    Outputs are built with ``model_construct`` from frozen fields, as a store
    does when it loads rows it has already validated on publication.
    """
    outputs = tuple(
        OutputRef.model_construct(
            id=f"out-{n:06d}",
            fields=FrozenDict({"title": f"record {n}", "rank": n}),
            correlation_id=f"out-{n:06d}",
        )
        for n in range(count)
    )
    return PlanningSnapshot(
        token="bench",
        generation=1,
        outputs_by_edge={"items": outputs},
        source_dispositions={"items": NodeDisposition.LAUNCHED},
        runtime_inputs={},
    )


def build_node() -> NodeDefinition:
    """The EACH node, frozen by ``RunTopology`` as the orchestrator plans it."""
    topology = RunTopology.build(
        [
            DagNode(slug="load", plugin="load"),
            DagNode(
                slug="transform",
                plugin="transform",
                input_mode=InputMode.EACH,
                edges=(InputEdge(name="items", source="load"),),
                bindings={"title": EdgeSource(edge="items", field="title")},
            ),
        ]
    )
    return topology.nodes[1]


def _plan(node: NodeDefinition, snapshot: PlanningSnapshot) -> PlanConstruction:
    result = construct_task_plans(
        node, source_indices={"items": 0}, snapshot=snapshot, limits=Limits()
    )
    if result.disposition != NodeDisposition.LAUNCHED:
        raise SystemExit(f"planning failed: {result.error}")
    return result


def run(count: int) -> dict[str, Any]:
    node = build_node()
    started = time.perf_counter()
    snapshot = build_snapshot(count)
    snapshot_seconds = time.perf_counter() - started
    rss_before = _rss_mb()

    gc.collect()
    started = time.perf_counter()
    result = _plan(node, snapshot)
    plan_seconds = time.perf_counter() - started
    plans = len(result.plans)
    rss_peak = _rss_mb()
    del result
    gc.collect()

    tracemalloc.start()
    result = _plan(node, snapshot)
    _current, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del result

    return {
        "outputs": count,
        "plans": plans,
        "snapshot_build_s": round(snapshot_seconds, 3),
        "plan_wall_s": round(plan_seconds, 3),
        "plan_us_per_task": round(plan_seconds / max(plans, 1) * 1e6, 2),
        "planning_traced_peak_mb": round(traced_peak / (1024 * 1024), 1),
        "rss_before_planning_mb": round(rss_before, 1),
        "rss_peak_mb": round(rss_peak, 1),
        "target_s": TARGET_SECONDS,
        "target_mb": TARGET_MB,
        "within_target": plan_seconds < TARGET_SECONDS and rss_peak < TARGET_MB,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=int, default=100_000)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    figures = run(args.outputs)
    if not args.json_only:
        width = max(len(key) for key in figures)
        print(f"{'metric':<{width}}  value")
        print(f"{'-' * width}  -----")
        for key, value in figures.items():
            print(f"{key:<{width}}  {value}")
        print()
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
