"""Engine limits as one immutable settings object.

``Limits()`` holds dagwerk's defaults (the ``MAX_*`` values of
:mod:`dagwerk.constants`); ``Limits.seed()`` holds seed 001's values. Planning
and publication take a ``Limits`` so that an engine can tighten or loosen them
without touching module globals.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from dagwerk import constants as c


@dataclass(frozen=True, slots=True)
class Limits:
    max_output_fields_bytes: int = c.MAX_OUTPUT_FIELDS_BYTES
    max_input_edges_per_node: int = c.MAX_INPUT_EDGES_PER_NODE
    max_node_bindings: int = c.MAX_NODE_BINDINGS
    max_node_binding_evaluations: int = c.MAX_NODE_BINDING_EVALUATIONS
    max_launch_binding_evaluations: int = c.MAX_LAUNCH_BINDING_EVALUATIONS
    max_launch_binding_evaluated_bytes: int = c.MAX_LAUNCH_BINDING_EVALUATED_BYTES
    max_filter_rules_per_edge: int = c.MAX_FILTER_RULES_PER_EDGE
    max_snapshot_outputs_per_edge: int = c.MAX_SNAPSHOT_OUTPUTS_PER_EDGE
    max_snapshot_outputs_per_node: int = c.MAX_SNAPSHOT_OUTPUTS_PER_NODE
    max_snapshot_routing_bytes: int = c.MAX_SNAPSHOT_ROUTING_BYTES
    max_outputs_per_task_completion: int = c.MAX_OUTPUTS_PER_TASK_COMPLETION
    max_task_completion_routing_bytes: int = c.MAX_TASK_COMPLETION_ROUTING_BYTES
    max_task_plans_per_launch: int = c.MAX_TASK_PLANS_PER_LAUNCH
    max_output_refs_per_plan: int = c.MAX_OUTPUT_REFS_PER_PLAN
    max_task_plan_bytes: int = c.MAX_TASK_PLAN_BYTES
    max_run_input_bytes: int = c.MAX_RUN_INPUT_BYTES
    max_expression_result_bytes: int = c.MAX_EXPRESSION_RESULT_BYTES
    max_snapshot_retries: int = c.MAX_SNAPSHOT_RETRIES

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if type(value) is not int or value < 0:
                raise ValueError(f"limit {f.name} must be a non-negative int, got {value!r}")

    @classmethod
    def seed(cls) -> Limits:
        """The limits of seed 001, for compatibility and boundary tests."""
        return cls(**c.SEED_LIMIT_VALUES)

    def with_(self, **changes: Any) -> Limits:
        """A copy with some limits changed (validated)."""
        return replace(self, **changes)


DEFAULT_LIMITS = Limits()
