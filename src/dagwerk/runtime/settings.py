"""A worker's settings as one typed, frozen object.

:class:`WorkerSettings` holds every value a :class:`~dagwerk.runtime.worker.Worker`
is configured with (the collaborators it is handed, such as the store, the
clock or the executor, are arguments of the worker itself). Construction
validates and normalises: ``execution_root`` becomes an absolute, existing
directory, ``cancel_check_interval`` and ``idle_wait`` fall back to
``poll_interval``, the byte limits and cost estimates are copied so nothing
later can raise them (BG-01). ``worker_id`` and ``max_deliveries`` may stay
``None``: the worker fills them in (a fresh ID, the queue's bound).

:class:`WorkerOptions` names the same settings as keyword arguments, which
``Worker(store, plugins, lease_seconds=..., ...)`` accepts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import TypedDict

from dagwerk.constants import DEFAULT_CLAIM_AHEAD, DEFAULT_CONCURRENCY, MAX_CLAIM_AHEAD
from dagwerk.errors import DagwerkError
from dagwerk.lineage import DEFAULT_MAX_CHILD_DEPTH
from dagwerk.runtime.backstop import DEFAULT_BACKSTOP_INTERVAL
from dagwerk.runtime.budget_guard import ByteLimits, CostEstimate
from dagwerk.runtime.context import validate_execution_root
from dagwerk.runtime.retention import RetentionPolicy
from dagwerk.runtime.task_logs import TaskLogLimits
from dagwerk.scheduling.scheduler import DEFAULT_SCHEDULE_INTERVAL

__all__ = [
    "DEFAULT_CLAIM_AHEAD",
    "DEFAULT_CLAIM_AHEAD_HORIZON",
    "MAX_CLAIM_AHEAD",
    "MAX_CLAIM_AHEAD_HORIZON",
    "WorkerOptions",
    "WorkerSettings",
]

DEFAULT_CLAIM_AHEAD_HORIZON = 0.05
"""Seconds within which the worker must be able to start what it claims ahead."""

MAX_CLAIM_AHEAD_HORIZON = 60.0
"""The longest ``claim_ahead_horizon`` accepted (seconds)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """Everything a worker is configured with; see the module for defaults.

    - ``concurrency``: attempts run in parallel per batch (an int >= 1;
      default 4).
    - ``lease_seconds`` / ``lease_grace``: an attempt owns its delivery for
      ``max(timeout, lease_seconds) + lease_grace`` seconds (WK-03).
    - ``poll_interval``: the idle back-off and the delay before a delivery
      that failed in the worker is offered again; ``idle_wait`` how long an
      idle background step waits in dequeue; ``cancel_check_interval`` how
      often the attempt monitor reads the runs of running attempts.
    - ``default_timeout``: an attempt's deadline when neither node nor plugin
      sets one.
    - ``max_deliveries``: deliveries of a task before it is dead-lettered
      (``None``: the queue's own bound).
    - ``execution_root``: the directory every task gets as ``ctx.execution_root``.
    - ``worker_id``: the worker's name in leases and presence (``None``: a fresh one).
    - ``queues``: the queues served (``None``: every queue); ``prefer_run``:
      rows of this run are leased first.
    - ``backstop_interval``: seconds between backstop passes (``None`` disables).
    - ``max_child_depth``, ``byte_limits``, ``cost_estimates``: child runs and
      budgets (see :mod:`dagwerk.runtime.budget_guard`).
    - ``batched``: use the store's batched path when it has one.
    - ``retention``: delete runs finished longer ago than this (seconds, a
      timedelta, an age such as ``"30d"`` or a ``RetentionPolicy``) from the
      background loop (``None``: never).
    - ``task_log_limits``: the bounds of each attempt's stored log
      (``None``: :class:`~dagwerk.runtime.task_logs.TaskLogLimits` defaults).
    - ``schedule_interval``: seconds between scheduler passes (``None`` or 0:
      this worker fires no schedules).
    - ``claim_ahead``: the most deliveries a batch claims beyond
      ``concurrency`` (0: none), of plugins whose timed attempts let the
      worker start them within ``claim_ahead_horizon`` seconds (see
      :mod:`dagwerk.runtime.claim_ahead`; the thread executor's batches only).
    """

    concurrency: int = DEFAULT_CONCURRENCY
    lease_seconds: float = 30.0
    lease_grace: float = 30.0
    poll_interval: float = 0.5
    cancel_check_interval: float | None = None
    default_timeout: float | None = None
    max_deliveries: int | None = None
    execution_root: str | Path | None = None
    worker_id: str | None = None
    idle_wait: float | None = None
    queues: Sequence[str] | None = None
    backstop_interval: float | None = DEFAULT_BACKSTOP_INTERVAL
    max_child_depth: int = DEFAULT_MAX_CHILD_DEPTH
    byte_limits: ByteLimits = field(default_factory=ByteLimits)
    cost_estimates: Mapping[str, CostEstimate] = field(default_factory=lambda: MappingProxyType({}))
    batched: bool = True
    prefer_run: str | None = None
    retention: float | timedelta | str | RetentionPolicy | None = None
    task_log_limits: TaskLogLimits | None = None
    schedule_interval: float | None = DEFAULT_SCHEDULE_INTERVAL
    claim_ahead: int = DEFAULT_CLAIM_AHEAD
    claim_ahead_horizon: float = DEFAULT_CLAIM_AHEAD_HORIZON

    def __post_init__(self) -> None:
        concurrency = self.concurrency
        if type(concurrency) is not int or concurrency < 1:
            raise DagwerkError("concurrency must be an int >= 1", field="concurrency")
        ahead = self.claim_ahead
        if type(ahead) is not int or not 0 <= ahead <= MAX_CLAIM_AHEAD:
            raise DagwerkError(
                f"claim_ahead must be an int from 0 to {MAX_CLAIM_AHEAD}", field="claim_ahead"
            )
        horizon = self.claim_ahead_horizon
        if (
            isinstance(horizon, bool)
            or not isinstance(horizon, int | float)
            or not 0 < horizon <= MAX_CLAIM_AHEAD_HORIZON
        ):
            raise DagwerkError(
                f"claim_ahead_horizon must be seconds > 0 and <= {MAX_CLAIM_AHEAD_HORIZON}",
                field="claim_ahead_horizon",
            )
        # Checked before anything reads the store (WK-07).
        self._set("execution_root", validate_execution_root(self.execution_root))
        if not self.cancel_check_interval:
            self._set("cancel_check_interval", self.poll_interval)
        if self.idle_wait is None:
            self._set("idle_wait", self.poll_interval)
        if self.queues is not None:
            self._set("queues", list(self.queues))
        depth = self.max_child_depth
        if type(depth) is not int or depth < 0:
            raise DagwerkError("max_child_depth must be an int >= 0", field="max_child_depth")
        limits = self.byte_limits or ByteLimits()
        self._set("byte_limits", ByteLimits(limits.max_input_bytes, limits.max_output_bytes))
        self._set("cost_estimates", MappingProxyType(dict(self.cost_estimates or {})))

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    @property
    def root(self) -> Path:
        """The validated execution root."""
        root = self.execution_root
        assert isinstance(root, Path)
        return root

    @property
    def check_interval(self) -> float:
        """Seconds between the attempt monitor's passes."""
        interval = self.cancel_check_interval
        assert interval is not None
        return interval

    @property
    def idle_seconds(self) -> float:
        """How long an idle background step waits in dequeue."""
        wait = self.idle_wait
        assert wait is not None
        return wait

    def lease_bound(self, timeout: float | None) -> float:
        """Ownership bound = max(task timeout, lease setting) + grace (WK-03)."""
        return max(timeout or 0.0, self.lease_seconds) + self.lease_grace


class WorkerOptions(TypedDict, total=False):
    """:class:`WorkerSettings`' fields as keyword arguments of ``Worker``."""

    concurrency: int
    lease_seconds: float
    lease_grace: float
    poll_interval: float
    cancel_check_interval: float | None
    default_timeout: float | None
    max_deliveries: int | None
    execution_root: str | Path | None
    worker_id: str | None
    idle_wait: float | None
    queues: Sequence[str] | None
    backstop_interval: float | None
    max_child_depth: int
    byte_limits: ByteLimits
    cost_estimates: Mapping[str, CostEstimate]
    batched: bool
    prefer_run: str | None
    retention: float | timedelta | str | RetentionPolicy | None
    task_log_limits: TaskLogLimits | None
    schedule_interval: float | None
    claim_ahead: int
    claim_ahead_horizon: float
