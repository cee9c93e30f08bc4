"""Attempt preparation: everything between a claim and the plugin.

An :class:`AttemptPreparer` turns a claimed delivery into an
:class:`~dagwerk.runtime.attempts.Attempt`: it reads the node, runs the
lineage guard, resolves the inputs, admits the attempt against its budget,
decides the timeout (node, else plugin, else the worker default, WK-03) and
the ownership bound, and extends the lease to that bound. A guard that
refuses settles the delivery through the worker's settler. When the attempt
starts, :meth:`AttemptPreparer.start` builds its :class:`TaskContext`
(secrets, the wait response it resumed with, heartbeats that extend the
lease) and tells the observers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from dagwerk.capabilities import StoreCapabilities
from dagwerk.errors import DagwerkError
from dagwerk.models import DagNode
from dagwerk.runtime.attempts import Attempt, BatchReads, Running
from dagwerk.runtime.budget_guard import BudgetGuard, CostEstimate
from dagwerk.runtime.children import ChildRuns
from dagwerk.runtime.clock import Clock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.durable import open_journal
from dagwerk.runtime.observer import WorkerObserver, notify
from dagwerk.runtime.plugins import PluginRegistry, PluginSpec
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.roles import WorkerStore
from dagwerk.runtime.settings import WorkerSettings
from dagwerk.runtime.settlement import Settler
from dagwerk.runtime.task_logs import TaskLogWriter, task_logger
from dagwerk.runtime.traced import attempt_started
from dagwerk.store import DagQueueStore, LeasedDelivery, TaskRecord
from dagwerk.task_input import resolve_task_inputs
from dagwerk.tracing import WorkerTracing

__all__ = ["AttemptPreparer", "SecretResolver"]

SecretResolver = Callable[[str, str], Mapping[str, str]]
"""``(run_id, plugin_name) -> secrets`` handed to the task as ``ctx.secrets``."""


class AttemptPreparer:
    """Prepares and starts the attempts of one worker (see the module)."""

    def __init__(
        self,
        store: WorkerStore,
        queue: DagQueueStore,
        capabilities: StoreCapabilities,
        plugins: PluginRegistry,
        settings: WorkerSettings,
        *,
        worker_id: str,
        clock: Clock,
        settler: Settler,
        budget: BudgetGuard,
        children: ChildRuns,
        secret_resolver: SecretResolver | None,
        observers: Sequence[WorkerObserver],
        task_logs: TaskLogWriter,
        tracing: WorkerTracing | None,
    ) -> None:
        self._store = store
        self._durable = capabilities.durable
        self._task_logs = task_logs
        self._tracing = tracing
        self._queue = queue
        self._topology = capabilities.topology
        self._wait_responses = capabilities.wait_responses
        self._plugins = plugins
        self._settings = settings
        self._worker_id = worker_id
        self._clock = clock
        self._settler = settler
        self._budget = budget
        self._children = children
        self._secret_resolver = secret_resolver
        self._observers = observers

    def prepare(
        self,
        delivery: LeasedDelivery,
        task: TaskRecord | None,
        *,
        reads: BatchReads | None = None,
        leased_bound: float | None = None,
    ) -> Attempt | None:
        """The attempt of a claimed delivery; ``None`` when a guard settled the
        delivery. ``reads`` shares a batch's reads; the lease is extended
        unless ``leased_bound`` already covers it."""
        settler = self._settler
        node = self.node(delivery)
        if task is None or node is None:
            settler.ack(delivery, "stale")
            return None
        link_of = None if reads is None else reads.link
        if not self._children.guard_lineage(settler, delivery, link_of=link_of):
            return None
        try:
            spec = self._plugins.get(node.plugin)
            resolver = self._store if reads is None else reads.resolver(delivery.run_id)
            inputs = resolve_task_inputs(resolver, run_id=delivery.run_id, plan=task.plan)
        except DagwerkError as exc:
            settler.fail(delivery, exc)
            return None
        estimate = self.cost_estimate_of(node, spec)
        accounts_of = None if reads is None else reads.budget
        if not self._budget.admit(
            settler, delivery, node.plugin, estimate, inputs, accounts_of=accounts_of
        ):
            return None
        timeout = self.timeout_of(node, spec)
        bound = self._settings.lease_bound(timeout)
        if leased_bound is None or bound > leased_bound:
            self._queue.extend_lease(delivery.delivery_id, self._worker_id, bound)
        attempt = Attempt(
            delivery, task, node, spec, inputs, self.retry_policy(node, spec), timeout, bound
        )
        # The lease runs its whole bound from about now (the claim's, or the
        # extension just made): the monitor and heartbeats fold what follows.
        attempt.entry.last_beat = self._clock.monotonic()
        return attempt

    def node(self, delivery: LeasedDelivery) -> DagNode | None:
        """The delivery's node definition (``None``: the run is gone)."""
        # A RunTopologyStore hands out one cached definition instead of
        # copying every node of the run per delivery.
        topology = self._topology
        if topology is not None:
            return topology.get_run_node(delivery.run_id, delivery.node_index)
        nodes = self._store.get_run_nodes(delivery.run_id)
        return None if nodes is None else nodes[delivery.node_index]

    def start(self, attempt: Attempt) -> TaskContext:
        """The attempt's context, announced to the observers as started."""
        attempt.ctx = self._context(attempt)
        notify(self._observers, "task_started", attempt.delivery, attempt.node)
        attempt_started(self._tracing, attempt)
        return attempt.ctx

    # --- per-node settings -------------------------------------------------------------

    @staticmethod
    def retry_policy(node: DagNode, spec: PluginSpec) -> RetryPolicy:
        """The node's stored retry setting over the plugin's registration default."""
        return RetryPolicy.from_spec(node.retry) if node.retry is not None else spec.retry

    def timeout_of(self, node: DagNode, spec: PluginSpec) -> float | None:
        """Node timeout, else the plugin's, else the worker default (WK-03)."""
        if node.timeout_seconds is not None:
            return node.timeout_seconds
        return spec.timeout_seconds or self._settings.default_timeout

    def cost_estimate_of(self, node: DagNode, spec: PluginSpec) -> CostEstimate | None:
        """The node's ``cost_estimate``, else the worker's estimate for the
        plugin, else the plugin's registered ``cost``."""
        if node.cost_estimate is not None:
            return node.cost_estimate
        return self._settings.cost_estimates.get(node.plugin, spec.cost)

    # --- the context -------------------------------------------------------------------

    def _context(self, attempt: Attempt) -> TaskContext:
        delivery, node, entry = attempt.delivery, attempt.node, attempt.entry
        resumed_from = attempt.task.resumed_from_wait_id
        secrets = (
            MappingProxyType(dict(self._secret_resolver(delivery.run_id, node.plugin)))
            if self._secret_resolver is not None
            else MappingProxyType({})
        )
        response = None
        if resumed_from is not None and self._wait_responses is not None:
            response = self._wait_responses.get_wait_response(delivery.task_id, resumed_from)
        bound = attempt.bound
        task_log = self._task_logs.open(
            run_id=delivery.run_id,
            task_id=delivery.task_id,
            node_index=delivery.node_index,
            attempt=attempt.task.attempt_number,
            secrets=secrets,
        )

        def heartbeat() -> None:
            self._heartbeat(delivery, entry, bound)

        return TaskContext(
            run_id=delivery.run_id,
            task_id=delivery.task_id,
            node_index=delivery.node_index,
            generation=delivery.generation,
            attempt_id=delivery.attempt_id,
            attempt=attempt.task.attempt_number,
            plugin=node.plugin,
            execution_root=self._settings.root,
            cancelled=entry.signal.abort,
            resumed_from_wait_id=resumed_from,
            secrets=secrets,
            # With a log, ctx.logger's INFO records are kept whatever the
            # application's logging configuration shows.
            logger=(
                logging.getLogger(f"dagwerk.task.{node.plugin}")
                if task_log is None
                else task_logger(node.plugin)
            ),
            heartbeat_fn=heartbeat,
            wait_response=response,
            byte_limits=self._settings.byte_limits,
            journal=open_journal(
                self._durable,
                delivery,
                attempt=attempt.task.attempt_number,
                resumed_from=resumed_from,
                wait_response=response,
            ),
            task_log=task_log,
        )

    def _heartbeat(self, delivery: LeasedDelivery, entry: Running, bound: float) -> None:
        """Extend the lease now; beats closer than a tenth of the lease are folded."""
        now = self._clock.monotonic()
        if now - entry.last_beat < self._settings.lease_seconds / 10:
            return
        entry.last_beat = now
        self._queue.extend_lease(delivery.delivery_id, self._worker_id, bound)
