"""Prometheus metrics of a worker, its backstop and its store.

One :class:`Metrics` owns one ``CollectorRegistry`` (never the process-global
one, so tests and several engines in one process do not collide). It is a
:class:`~dagwerk.runtime.observer.WorkerObserver`: give it to a worker with
``observers=[metrics]`` and ``callbacks=metrics.callbacks()`` and it counts
what the worker does. Store-wide gauges (runs by status, queue depth, age of
the oldest deliverable row) are read from the store at scrape time.

Counters by node and plugin: ``dagwerk_tasks_started_total``,
``..._completed_total``, ``..._failed_total``, ``..._retried_total``,
``..._timed_out_total``, ``..._dead_lettered_total``. Every delivery the
worker handles is also counted by action in ``dagwerk_deliveries_total``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dagwerk.constants import RUN_TERMINAL_STATUSES, RunStatus
from dagwerk.models import DagNode
from dagwerk.orchestrator import OrchestratorCallbacks
from dagwerk.runtime.backstop import BackstopReport
from dagwerk.runtime.clock import Clock, SystemClock
from dagwerk.runtime.observer import WorkerObserver
from dagwerk.runtime.sweep import SweepReport
from dagwerk.runtime.worker import DeliveryReport
from dagwerk.store import LeasedDelivery

__all__ = ["CONTENT_TYPE", "Metrics"]

_LOG = logging.getLogger("dagwerk.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400)
# Task outcome actions of the worker -> the counter they increment.
_OUTCOMES = ("completed", "failed", "retried", "timed_out", "dead_lettered")
# Started attempts remembered for durations; bounded so a lost report cannot leak.
_MAX_IN_FLIGHT = 100_000


class _StoreCollector(Collector):
    """Gauges read from the store at scrape time; an unreachable store yields none."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        store = self._metrics.store
        if store is None:
            return
        try:
            counts = store.run_status_counts()
            stats = store.queue_stats()
        except Exception:
            _LOG.exception("reading store gauges failed")
            return
        runs = GaugeMetricFamily("dagwerk_runs", "Runs by status.", labels=["status"])
        for status in RunStatus:
            runs.add_metric([status.value], float(counts.get(status, 0)))
        yield runs
        depth = GaugeMetricFamily(
            "dagwerk_queue_depth", "Queue rows waiting for a worker.", labels=["queue"]
        )
        age = GaugeMetricFamily(
            "dagwerk_queue_oldest_deliverable_age_seconds",
            "Seconds the oldest deliverable row of the queue has been deliverable.",
            labels=["queue"],
        )
        now = self._metrics.clock.time()
        for item in stats:
            depth.add_metric([item.queue], float(item.depth))
            oldest = item.oldest_available_at
            age.add_metric([item.queue], 0.0 if oldest is None else max(0.0, now - oldest))
        yield depth
        yield age


class Metrics(WorkerObserver):
    """The metrics of one worker (or engine); ``store`` feeds the scrape-time gauges."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        store: Any = None,
        clock: Clock | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.store = store
        self.clock = clock or SystemClock()
        reg = self.registry
        labels = ["node", "plugin"]
        self.tasks_started = Counter(
            "dagwerk_tasks_started", "Attempts started.", labels, registry=reg
        )
        self.outcomes = {
            action: Counter(
                f"dagwerk_tasks_{action}",
                f"Attempts that ended {action.replace('_', ' ')}.",
                labels,
                registry=reg,
            )
            for action in _OUTCOMES
        }
        self.deliveries = Counter(
            "dagwerk_deliveries", "Deliveries handled, by action.", ["action"], registry=reg
        )
        self.lease_expirations = Counter(
            "dagwerk_lease_expirations",
            "Deliveries taken over after their holder's lease expired.",
            registry=reg,
        )
        self.sweep_results = Counter(
            "dagwerk_sweep_results", "Idle sweep results, by action.", ["action"], registry=reg
        )
        self.task_duration = Histogram(
            "dagwerk_task_duration_seconds",
            "Attempt run time.",
            labels,
            buckets=_DURATION_BUCKETS,
            registry=reg,
        )
        self.run_duration = Histogram(
            "dagwerk_run_duration_seconds",
            "Run time from creation to its terminal status.",
            ["status"],
            buckets=_DURATION_BUCKETS,
            registry=reg,
        )
        self.backstop_duration = Histogram(
            "dagwerk_backstop_pass_duration_seconds", "Backstop pass duration.", registry=reg
        )
        self.backstop_passes = Counter(
            "dagwerk_backstop_passes",
            "Backstop passes, by outcome (ran, skipped, failed).",
            ["outcome"],
            registry=reg,
        )
        self.repaired_deliveries = Counter(
            "dagwerk_repaired_deliveries",
            "Lost deliveries of QUEUED tasks re-created by the backstop.",
            registry=reg,
        )
        self.stalled_runs = Gauge(
            "dagwerk_stalled_runs", "Runs found stalled by the last backstop pass.", registry=reg
        )
        self.stall_events = Counter(
            "dagwerk_stall_events", "New stalls (one per stall).", registry=reg
        )
        reg.register(_StoreCollector(self))
        self._lock = threading.Lock()
        self._started: dict[str, tuple[str, str, float]] = {}
        self._nodes: dict[str, tuple[DagNode, ...]] = {}

    # --- exposition ------------------------------------------------------------------

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    # --- worker observer ---------------------------------------------------------------

    def task_started(self, delivery: LeasedDelivery, node: DagNode) -> None:
        self.tasks_started.labels(node.slug, node.plugin).inc()
        with self._lock:
            if len(self._started) >= _MAX_IN_FLIGHT:
                self._started.clear()
            self._started[delivery.delivery_id] = (
                node.slug,
                node.plugin,
                self.clock.monotonic(),
            )

    def delivery_handled(self, report: DeliveryReport, delivery: LeasedDelivery | None) -> None:
        self.deliveries.labels(report.action).inc()
        if report.action == "recovered":
            self.lease_expirations.inc()
        with self._lock:
            started = self._started.pop(report.delivery_id, None) if report.delivery_id else None
        if report.action not in self.outcomes:
            return
        if started is not None:
            slug, plugin, at = started
            self.task_duration.labels(slug, plugin).observe(max(0.0, self.clock.monotonic() - at))
        else:
            slug, plugin = self._node_of(report.task_id)
        self.outcomes[report.action].labels(slug, plugin).inc()

    def swept(self, reports: Sequence[SweepReport]) -> None:
        for report in reports:
            self.sweep_results.labels(report.action).inc()

    def backstop_finished(self, report: BackstopReport) -> None:
        if not report.ran:
            self.backstop_passes.labels("failed" if report.errors else "skipped").inc()
            return
        self.backstop_passes.labels("failed" if report.errors else "ran").inc()
        self.backstop_duration.observe(report.duration)
        self.repaired_deliveries.inc(len(report.repaired))
        self.stalled_runs.set(len(report.stalls))
        self.stall_events.inc(sum(1 for stall in report.stalls if stall.new))

    # --- run durations -----------------------------------------------------------------

    def callbacks(self, then: OrchestratorCallbacks | None = None) -> OrchestratorCallbacks:
        """Orchestrator callbacks that record the run's duration (they fire once
        per terminal transition, in the process that committed it), then call
        ``then``'s callbacks."""

        def make(status: RunStatus) -> Any:
            def fire(run_id: str) -> None:
                self.run_finished(run_id, status)
                if then is not None:
                    then.fire(status, run_id)

            return fire

        return OrchestratorCallbacks(
            make(RunStatus.COMPLETED),
            make(RunStatus.FAILED),
            make(RunStatus.CRASHED),
            make(RunStatus.CANCELLED),
        )

    def run_finished(self, run_id: str, status: RunStatus) -> None:
        """Observe a terminal run's duration from its stored times."""
        if self.store is None or status not in RUN_TERMINAL_STATUSES:
            return
        try:
            record = self.store.get_run(run_id)
        except Exception:
            _LOG.exception("reading run %s for its duration failed", run_id)
            return
        if record is None or record.finished_at is None or not record.created_at:
            return
        self.run_duration.labels(status.value).observe(
            max(0.0, record.finished_at - record.created_at)
        )

    def _node_of(self, task_id: str) -> tuple[str, str]:
        """Node slug and plugin of a task not seen starting here (dead letters)."""
        try:
            task = self.store.get_task(task_id) if self.store is not None else None
            if task is None:
                return "unknown", "unknown"
            nodes = self._nodes.get(task.run_id)
            if nodes is None:
                found = self.store.get_run_nodes(task.run_id)
                nodes = tuple(found or ())
                self._nodes[task.run_id] = nodes
            node = nodes[task.node_index]
        except Exception:
            return "unknown", "unknown"
        return node.slug, node.plugin
