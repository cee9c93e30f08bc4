"""Enums, status sets and the default limits of the engine.

The ``MAX_*`` values are dagwerk's defaults. Where ``decisions.md`` keeps a
seed-001 limit the value is the seed's; where dagwerk deliberately goes
further (fan-out and fan-in up to 100,000) the seed value is kept in
``SEED_LIMIT_VALUES`` and the larger default is used. Every limit can be
changed per engine through :class:`dagwerk.limits.Limits`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class RunStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CRASHED = "crashed"
    CANCELLED = "cancelled"


class TaskStatus(StrEnum):
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CRASHED = "crashed"
    CANCELLED = "cancelled"


class NodeDisposition(StrEnum):
    LAUNCHED = "launched"
    SKIPPED = "skipped"
    FILTERED = "filtered"
    FAILED = "failed"
    # dagwerk: a node that can never run because a required source failed
    # (used by the ``continue_others`` failure policy).
    UPSTREAM_FAILED = "upstream_failed"


class InputMode(StrEnum):
    """How a node plans its tasks: one per output of its main edge (each), one
    for all outputs (all), one per correlation ID (by_correlation)."""

    EACH = "each"
    ALL = "all"
    BY_CORRELATION = "by_correlation"


class InputRole(StrEnum):
    """A main edge decides a node's tasks; a side edge's outputs go to every task."""

    MAIN = "main"
    SIDE = "side"


class CorrelationMode(StrEnum):
    """Which correlation ID a node's outputs carry: new (each output starts a
    group), inherit (the task's group), none, or default (new for a root,
    inherit for each and by_correlation nodes, none for all nodes)."""

    DEFAULT = "default"
    INHERIT = "inherit"
    NEW = "new"
    NONE = "none"


class FilterOperator(StrEnum):
    """How a filter rule tests an output's field."""

    EQ = "eq"
    NEQ = "neq"
    GT = "gt"
    GTE = "gte"
    LT = "lt"
    LTE = "lte"
    IN = "in"
    NOT_IN = "not_in"
    CONTAINS = "contains"
    NOT_CONTAINS = "not_contains"
    STARTS_WITH = "starts_with"
    ENDS_WITH = "ends_with"
    EXISTS = "exists"
    NOT_EXISTS = "not_exists"


class SortOrder(StrEnum):
    """Ascending or descending order of a selection."""

    ASC = "asc"
    DESC = "desc"


class LaunchCreateStatus(StrEnum):
    CREATED = "created"
    ALREADY_EXISTS = "already_exists"
    STALE = "stale"


class FailurePolicy(StrEnum):
    """What a run does after its first failure: fail_fast ends the run at once;
    stop_on_first_failure starts nothing new and ends the run when the running
    tasks are done; continue_others keeps independent branches going and ends
    the run when nothing more can run."""

    FAIL_FAST = "fail_fast"
    STOP_ON_FIRST_FAILURE = "stop_on_first_failure"
    CONTINUE_OTHERS = "continue_others"


RUN_TERMINAL_STATUSES: Final = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CRASHED, RunStatus.CANCELLED}
)
TASK_TERMINAL_STATUSES: Final = frozenset(
    {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CRASHED, TaskStatus.CANCELLED}
)
RUN_RETRYABLE_STATUSES: Final = RUN_TERMINAL_STATUSES - {RunStatus.COMPLETED}

# --- worker defaults -----------------------------------------------------
DEFAULT_CONCURRENCY: Final = 4
"""Attempts a worker runs at once, and deliveries its batch claims, unless
told otherwise (``Worker``, ``Engine.worker``, ``dagwerk worker``)."""

DEFAULT_BURST_HORIZON: Final = 300.0
"""Seconds ahead a burst worker waits for a delivery to become due (a retry
on its backoff) before it exits."""

DEFAULT_CLAIM_AHEAD: Final = 64
"""The most deliveries a worker's batch claims beyond its concurrency
(``dagwerk.runtime.claim_ahead``)."""

MAX_CLAIM_AHEAD: Final = 1024
"""The highest claim ahead a worker accepts."""

# --- JSON value limits (seed values) -------------------------------------
MAX_OUTPUT_FIELDS_BYTES: Final = 65_536
MAX_JSON_DEPTH: Final = 16
MAX_JSON_KEYS: Final = 512
MAX_JSON_VALUES: Final = 10_000

# --- node, binding and filter limits (seed values) -----------------------
MAX_INPUT_EDGES_PER_NODE: Final = 64
MAX_NODE_BINDINGS: Final = 64
MAX_NODE_BINDING_EVALUATIONS: Final = 64
MAX_FILTER_RULES_PER_EDGE: Final = 64
MAX_FILTER_MEMBERSHIP_VALUES: Final = 256
MAX_OUTPUT_ID_LENGTH: Final = 512
MAX_WAIT_ID_LENGTH: Final = 512
MAX_PIPELINE_NAME_LENGTH: Final = 512
"""The longest pipeline name a run records (``RunRecord.pipeline``)."""

# --- fan-out and fan-in (dagwerk goes beyond the seed: decisions.md) -----
MAX_TASK_PLANS_PER_LAUNCH: Final = 100_000
MAX_SNAPSHOT_OUTPUTS_PER_EDGE: Final = 100_000
MAX_SNAPSHOT_OUTPUTS_PER_NODE: Final = 200_000
MAX_OUTPUTS_PER_TASK_COMPLETION: Final = 100_000
MAX_OUTPUT_REFS_PER_PLAN: Final = 100_000
MAX_SNAPSHOT_ROUTING_BYTES: Final = 64 * 1024 * 1024
MAX_TASK_COMPLETION_ROUTING_BYTES: Final = 64 * 1024 * 1024
# A plan holding 100,000 output ids of up to ~100 characters still fits.
MAX_TASK_PLAN_BYTES: Final = 16 * 1024 * 1024
# Launch-wide binding work scales with the number of plans it may hold.
MAX_LAUNCH_BINDING_EVALUATIONS: Final = 1_000_000
MAX_LAUNCH_BINDING_EVALUATED_BYTES: Final = 256 * 1024 * 1024

# --- run input and expressions (seed values) -----------------------------
MAX_RUN_INPUT_BYTES: Final = 262_144
MAX_EXPRESSION_LENGTH: Final = 16_384
MAX_EXPRESSION_RESULT_BYTES: Final = 524_288
MAX_EXPRESSION_EVALUATION_STEPS: Final = 64
MAX_PIPE_ARGUMENT_LENGTH: Final = 4_096
MAX_PIPE_INTEGER_DIGITS: Final = 4_096
MAX_SNAPSHOT_RETRIES: Final = 3

# The seed-001 values of the limits dagwerk raises, kept for reference and
# for ``Limits.seed()``.
SEED_LIMIT_VALUES: Final = {
    "max_task_plans_per_launch": 200,
    "max_snapshot_outputs_per_edge": 10_000,
    "max_snapshot_outputs_per_node": 50_000,
    "max_outputs_per_task_completion": 50_000,
    "max_output_refs_per_plan": 5_000,
    "max_snapshot_routing_bytes": 16_777_216,
    "max_task_completion_routing_bytes": 16_777_216,
    "max_task_plan_bytes": 524_288,
    "max_launch_binding_evaluations": 10_000,
    "max_launch_binding_evaluated_bytes": 16_777_216,
}
