"""Per-node cost estimates and the ``cost=`` of plugin registration (BG-05).

The estimate a cost-limited run reserves comes from the node's
``cost_estimate`` when it has one, else from the plugin's registration
(``Engine.plugin(cost=...)``, ``dagwerk.plugin(cost=...)``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

import dagwerk
from dagwerk.backends.memory import MemoryStore
from dagwerk.budgets import Budget, cost_to_units
from dagwerk.constants import RunStatus
from dagwerk.engine import DEFAULT_REGISTRY, Engine, EngineRegistry
from dagwerk.models import DagNode
from dagwerk.pipelines.loader import parse_pipeline
from dagwerk.runtime.plugins import PluginSpec
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.worker import Worker


def test_bg_05_dag_node_cost_estimate_is_validated() -> None:
    assert DagNode(slug="a", plugin="p").cost_estimate is None
    assert DagNode(slug="a", plugin="p", cost_estimate=0).cost_estimate == 0
    for bad in (-0.1, math.nan, math.inf, "cheap"):
        with pytest.raises(ValidationError):
            DagNode(slug="a", plugin="p", cost_estimate=bad)


def test_bg_05_pipeline_files_accept_cost_estimate() -> None:
    pipeline = parse_pipeline(
        "nodes:\n  - slug: a\n    plugin: p\n    cost_estimate: 0.25\n  - slug: b\n    plugin: p\n"
    )
    assert [node.cost_estimate for node in pipeline.nodes] == [0.25, None]


def test_bg_05_node_estimate_comes_before_worker_and_plugin_estimates(tmp_path: Path) -> None:
    spec = PluginSpec("p", lambda i, c: None, RetryPolicy(), cost=0.5)
    worker = Worker(MemoryStore(), {}, execution_root=tmp_path, cost_estimates={"q": 0.75})
    try:
        assert (
            worker.cost_estimate_of(DagNode(slug="a", plugin="p", cost_estimate=0.1), spec) == 0.1
        )
        assert worker.cost_estimate_of(DagNode(slug="a", plugin="p"), spec) == 0.5
        q_spec = PluginSpec("q", spec.fn, RetryPolicy(), cost=0.5)
        assert worker.cost_estimate_of(DagNode(slug="a", plugin="q"), q_spec) == 0.75
    finally:
        worker.stop()


def _counts(inputs: object, ctx: object) -> dict[str, object]:
    return {"ok": True}


def test_bg_05_module_level_plugin_registers_a_cost(tmp_path: Path) -> None:
    dagwerk.plugin("test_cost_estimates_module", cost=0.2)(_counts)
    assert DEFAULT_REGISTRY.get("test_cost_estimates_module").cost == 0.2
    # Named by import path, the function keeps its registered estimate.
    assert __name__ in sys.modules
    assert EngineRegistry().get(f"{__name__}:_counts").cost == 0.2


def test_bg_05_engine_plugin_cost_is_reserved_and_charged(tmp_path: Path) -> None:
    with Engine("memory://", execution_root=tmp_path) as engine:
        engine.plugin("priced", cost=lambda inputs: 0.3)(_counts)
        result = engine.run(
            [
                DagNode(slug="a", plugin="priced"),
                DagNode(slug="b", plugin="priced", cost_estimate=0.1),
            ],
            timeout=30,
            budgets=Budget(max_cost=1),
        )
        assert result.status is RunStatus.COMPLETED
        (usage,) = engine.store.get_run_budget(result.run_id)
    assert usage.charged_units == cost_to_units(0.3) + cost_to_units(0.1)
    assert usage.reserved_units == 0
