"""The worker: its loop and lifecycle, composed of named collaborators.

One :class:`Worker` serves one store's queue. Its advancement actor is the
only caller of :meth:`Worker.process_once`, so one batch is in flight at a
time; inside a batch up to ``concurrency`` attempts run in parallel.

A worker leases only deliveries whose node's plugin it has
(:meth:`Worker.served_plugins`, a filter of the store's dequeue): another
plugin's task is never leased, failed or counted against its deliveries,
and waits for a worker that has it. The worker records itself and what it
serves (:mod:`dagwerk.runtime.presence`) for the stall diagnosis.

What a batch does is the delivery paths' (:mod:`dagwerk.runtime.batch` for
a :class:`~dagwerk.store.BatchQueueStore`, :mod:`dagwerk.runtime.single`
otherwise and for refused claims); they share the collaborators built here:
the :class:`~dagwerk.runtime.preparation.AttemptPreparer` (claim to
plugin), the :class:`~dagwerk.runtime.settlement.Settler` (outcome to ack),
the :class:`~dagwerk.runtime.monitor.AttemptMonitor` (the one watcher of
running attempts: cancellation and lease extension) and the background
loops (:mod:`dagwerk.runtime.background`). Settlement is fenced by the
attempt ID in the store, so a late or cancelled attempt changes nothing
(WK-14). Tasks the queue crashed by dead-lettering are settled by the run's
failure policy after each dequeue. When idle, the worker sweeps RUNNING
tasks that have no queue row at all, at most once per lease duration
(WK-17..WK-21).
"""

from __future__ import annotations

import dataclasses
import random
import threading
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Unpack

from dagwerk._fifo import FifoCache
from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import DEFAULT_BURST_HORIZON, RunStatus
from dagwerk.errors import DagwerkError
from dagwerk.lineage import RunLink
from dagwerk.models import DagNode
from dagwerk.orchestrator import OrchestratorCallbacks
from dagwerk.runtime._inline import InlineRunner
from dagwerk.runtime.actor import AdvancementActor
from dagwerk.runtime.attempts import LINKS_KEPT
from dagwerk.runtime.background import Background
from dagwerk.runtime.backstop import Backstop
from dagwerk.runtime.batch import BatchPath
from dagwerk.runtime.budget_guard import BudgetGuard, ByteLimits, CostEstimate
from dagwerk.runtime.children import ChildRuns
from dagwerk.runtime.clock import Clock, SystemClock
from dagwerk.runtime.context import validate_execution_root
from dagwerk.runtime.errors import WorkerStoppedError
from dagwerk.runtime.executors import ClosableExecutor, Executor, make_executor
from dagwerk.runtime.faults import FaultGate, FaultKind, classify
from dagwerk.runtime.monitor import AttemptMonitor
from dagwerk.runtime.observer import DeliveryReport, WorkerObserver
from dagwerk.runtime.plugins import PluginFn, PluginRegistry, PluginSpec
from dagwerk.runtime.preparation import AttemptPreparer, SecretResolver
from dagwerk.runtime.presence import Presence
from dagwerk.runtime.retention import PeriodicRetention
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.roles import WorkerStore
from dagwerk.runtime.settings import WorkerOptions, WorkerSettings
from dagwerk.runtime.settlement import STOPPING, Settler
from dagwerk.runtime.single import OneByOne
from dagwerk.runtime.status import RunStatusReader
from dagwerk.runtime.sweep import StaleSweeper, SweepReport
from dagwerk.runtime.task_logs import TaskLogWriter
from dagwerk.scheduling.scheduler import SchedulerThread
from dagwerk.store import ClaimedDelivery, DagQueueStore, LeasedDelivery
from dagwerk.tracing import WorkerTracing, traced_callbacks

__all__ = [
    "DEFAULT_BURST_HORIZON",
    "REPORTS_KEPT",
    "DeliveryReport",
    "SecretResolver",
    "SweepReport",
    "Worker",
    "WorkerSettings",
    "validate_execution_root",
]


REPORTS_KEPT = 10_000
"""How many of its latest :class:`DeliveryReport` a worker keeps in ``reports``."""


def _noop(run_id: str) -> None:
    return None


class Worker:
    """Runs the plugins of deliveries from ``store``'s queue.

    ``store`` is a :class:`~dagwerk.runtime.roles.WorkerStore` (the seed's
    ``DagWaitStore`` and ``OutputResolver``, and ``DagRunStore``) and a
    ``DagQueueStore``, whose leases hide a delivery while its attempt runs
    (a store without one raises :class:`~dagwerk.errors.DagwerkError`).
    A retry policy needs a ``DelayedRetryStore`` (without one a failure is
    final, as in the seed) and ``ctx.wait_response`` a ``WaitResponseStore``
    (without one it is ``None``).

    The worker's settings are one :class:`WorkerSettings`, or its fields as
    keyword arguments (``Worker(store, plugins, lease_seconds=10)``), which
    override the fields of ``settings`` when both are given. The other
    arguments are collaborators: the ``executor`` (a name, or an executor
    its caller keeps and closes), the ``clock``, the ``secret_resolver``,
    the orchestrator ``callbacks``, the ``rng`` of retry jitter and the
    ``observers``.
    """

    def __init__(
        self,
        store: WorkerStore,
        plugins: PluginRegistry | dict[str, PluginFn],
        settings: WorkerSettings | None = None,
        *,
        executor: str | Executor = "thread",
        clock: Clock | None = None,
        secret_resolver: SecretResolver | None = None,
        callbacks: OrchestratorCallbacks | None = None,
        rng: random.Random | None = None,
        observers: Sequence[WorkerObserver] | None = None,
        **options: Unpack[WorkerOptions],
    ) -> None:
        if settings is None:
            settings = WorkerSettings(**options)
        elif options:
            settings = dataclasses.replace(settings, **options)
        self.store = store
        self.plugins = plugins if isinstance(plugins, PluginRegistry) else PluginRegistry(plugins)
        self.executor = make_executor(executor, processes=settings.concurrency)
        # An executor made here from its name is this worker's to close (the
        # process executor's processes); one passed in is its caller's.
        self._owned_executor: ClosableExecutor | None = (
            self.executor
            if isinstance(executor, str) and isinstance(self.executor, ClosableExecutor)
            else None
        )
        self.clock = clock or SystemClock()
        # Store faults: one line each, a capped backoff, the settlements that
        # could not commit held until the store answers (runtime/faults.py).
        self.faults = faults = FaultGate(clock=self.clock)
        # Protocol checks walk every member of the protocol; a worker asks
        # them once here, not per delivery.
        self.capabilities = capabilities = StoreCapabilities.of(store)
        queue = capabilities.queue
        if queue is None:
            raise DagwerkError(
                "the worker needs a store that implements DagQueueStore", field="store"
            )
        self.queue: DagQueueStore = queue
        self.settings = settings = dataclasses.replace(
            settings,
            worker_id=settings.worker_id or f"worker-{uuid.uuid4().hex[:12]}",
            max_deliveries=(
                int(queue.max_deliveries)
                if settings.max_deliveries is None
                else settings.max_deliveries
            ),
        )
        self.worker_id: str = settings.worker_id or ""
        self.secret_resolver = secret_resolver
        self._callbacks = callbacks or OrchestratorCallbacks(_noop, _noop, _noop, _noop)
        self.observers: list[WorkerObserver] = list(observers or ())
        # Kept across batches (immutable), the most recent LINKS_KEPT runs'.
        self.run_links: dict[str, RunLink | None] = FifoCache(LINKS_KEPT)
        # Set once stop() began: admission is closed.
        self.stopping = threading.Event()
        self.status = RunStatusReader(store, faults=faults)
        # The latest reports only: a long-lived worker must not grow with
        # every delivery it ever handled.
        self.reports: deque[DeliveryReport] = deque(maxlen=REPORTS_KEPT)
        # What plugins log during an attempt, stored per attempt (task_logs.py).
        self.task_logs = task_logs = TaskLogWriter(
            capabilities.task_logs, settings.task_log_limits, faults=faults
        )
        # OpenTelemetry spans, when this process traces (dagwerk/tracing.py).
        self.tracing = tracing = WorkerTracing.create(capabilities.run_traces, capabilities.runs)
        if tracing is not None:
            self._callbacks = traced_callbacks(self._callbacks, tracing)
        callbacks = self._callbacks

        budget = BudgetGuard(settings.byte_limits, capabilities.budgets)
        self._children = children = ChildRuns(
            store,
            capabilities.children,
            callbacks=callbacks,
            max_child_depth=settings.max_child_depth,
            limits=capabilities.limits,
        )
        self.settler = Settler(
            store,
            queue,
            worker_id=self.worker_id,
            callbacks=callbacks,
            clock=self.clock,
            rng=rng or random.Random(),
            retry_store=capabilities.delayed_retry,
            budget=budget,
            children=children,
            observers=self.observers,
            reports=self.reports,
            poll_interval=settings.poll_interval,
            task_logs=task_logs,
            tracing=tracing,
            faults=faults,
            tracebacks=capabilities.tracebacks,
        )
        self.preparer = AttemptPreparer(
            store,
            queue,
            capabilities,
            self.plugins,
            settings,
            worker_id=self.worker_id,
            clock=self.clock,
            settler=self.settler,
            budget=budget,
            children=children,
            secret_resolver=secret_resolver,
            observers=self.observers,
            task_logs=task_logs,
            tracing=tracing,
        )
        self.background = Background(
            store,
            queue,
            capabilities,
            settings,
            worker_id=self.worker_id,
            max_deliveries=self.max_deliveries,
            serve=self.process_once,
            served=self.served_plugins,
            status=self.status,
            clock=self.clock,
            callbacks=callbacks,
            observers=self.observers,
            faults=faults,
        )
        self._pool = ThreadPoolExecutor(
            max_workers=settings.concurrency, thread_name_prefix="dagwerk-w"
        )
        # Runs a batch's lone attempt on the actor's loop thread (batch.py).
        self.inline = InlineRunner(self.clock)
        self.single = OneByOne(
            store,
            status=self.status,
            settler=self.settler,
            preparer=self.preparer,
            monitor=self.monitor,
            executor=self.executor,
            clock=self.clock,
            pool=self._pool,
        )
        # A store that claims and completes several attempts per commit gets
        # the batched path (runtime/batch.py); any other the one-by-one path.
        batch_store = capabilities.batch if settings.batched else None
        self.batch: BatchPath | None = (
            None
            if batch_store is None
            else BatchPath(
                store,
                batch_store,
                capabilities,
                settings,
                worker_id=self.worker_id,
                served=self.served_plugins,
                callbacks=callbacks,
                clock=self.clock,
                status=self.status,
                settler=self.settler,
                preparer=self.preparer,
                monitor=self.monitor,
                single=self.single,
                executor=self.executor,
                inline=self.inline,
                actor=self.actor,
                pool=self._pool,
                links=self.run_links,
                stopping=self.stopping,
                step_finished=self.background.step_finished,
                task_logs=task_logs,
                tracing=tracing,
            )
        )

    # --- settings and collaborators ----------------------------------------------------

    @property
    def callbacks(self) -> OrchestratorCallbacks:
        """The orchestrator callbacks of the transitions this worker commits.
        Replacing them (``worker.callbacks = metrics.callbacks(worker.callbacks)``)
        re-points every collaborator; the backstop keeps its own."""
        return self._callbacks

    @callbacks.setter
    def callbacks(self, callbacks: OrchestratorCallbacks) -> None:
        self._callbacks = callbacks
        self.settler.callbacks = callbacks
        self.sweeper.callbacks = callbacks
        self._children.callbacks = callbacks
        if self.batch is not None:
            self.batch.callbacks = callbacks

    @property
    def concurrency(self) -> int:
        return self.settings.concurrency

    @property
    def lease_seconds(self) -> float:
        return self.settings.lease_seconds

    @property
    def lease_grace(self) -> float:
        return self.settings.lease_grace

    @property
    def poll_interval(self) -> float:
        return self.settings.poll_interval

    @property
    def cancel_check_interval(self) -> float:
        return self.settings.check_interval

    @property
    def idle_wait(self) -> float:
        return self.settings.idle_seconds

    @property
    def default_timeout(self) -> float | None:
        return self.settings.default_timeout

    @property
    def max_deliveries(self) -> int:
        value = self.settings.max_deliveries
        assert value is not None
        return value

    @property
    def execution_root(self) -> Path:
        return self.settings.root

    @property
    def queues(self) -> Sequence[str] | None:
        return self.settings.queues

    @property
    def prefer_run(self) -> str | None:
        return self.settings.prefer_run

    @property
    def max_child_depth(self) -> int:
        return self.settings.max_child_depth

    @property
    def byte_limits(self) -> ByteLimits:
        return self.settings.byte_limits

    @property
    def cost_estimates(self) -> Mapping[str, CostEstimate]:
        return self.settings.cost_estimates

    @property
    def actor(self) -> AdvancementActor:
        return self.background.actor

    @property
    def monitor(self) -> AttemptMonitor:
        return self.background.monitor

    @property
    def sweeper(self) -> StaleSweeper:
        return self.background.sweeper

    @property
    def backstop(self) -> Backstop | None:
        return self.background.backstop

    @property
    def presence(self) -> Presence | None:
        return self.background.presence

    @property
    def retention(self) -> PeriodicRetention | None:
        return self.background.retention

    @property
    def scheduler(self) -> SchedulerThread | None:
        return self.background.scheduler

    @property
    def claimed_ahead(self) -> list[ClaimedDelivery]:
        """Deliveries the last batch's completions claimed for the next batch."""
        return [] if self.batch is None else self.batch.claimed_ahead

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Serve the queue in the background; idempotent; after stop it raises."""
        if self.stopping.is_set():
            raise WorkerStoppedError("the worker was stopped")
        self.background.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop admission, abort running attempts, wait for the batch in flight
        and stop the plugin processes of the executor this worker made."""
        self.stopping.set()
        self.monitor.abort_all(STOPPING)
        self.background.stop_loop(timeout)
        if self.batch is not None:
            self.batch.release_claimed_ahead()
        self.background.stop_watchers()
        self.inline.stop()
        self._pool.shutdown(wait=True)
        self.background.retire()
        if self._owned_executor is not None:
            self._owned_executor.close()
        self.task_logs.close()

    def wait_for_run(self, run_id: str, timeout: float | None = None) -> RunStatus:
        """Block until the run is terminal (see :meth:`AdvancementActor.wait_for_run`)."""
        return self.actor.wait_for_run(run_id, timeout)

    def served_plugins(self) -> frozenset[str]:
        """The plugins this worker leases rows of: every name its registry
        resolves (import paths once resolved). A row of any other plugin is
        left in the queue for a worker that has it."""
        return self.plugins.names()

    def run_until_idle(self, max_batches: int = 100_000) -> int:
        """Process batches in this thread until a dequeue finds nothing (and the
        idle sweep requeued nothing); the count handled."""
        if self.presence is not None:
            self.presence.beat()
        total = 0
        for _ in range(max_batches):
            handled = self.process_once()
            if handled == 0:
                break
            total += handled
        return total

    def run_burst(self, horizon: float = DEFAULT_BURST_HORIZON) -> int:
        """Process batches in this thread until nothing this worker serves is
        deliverable now or becomes deliverable within ``horizon`` seconds (a
        retry on its backoff, a released delivery, a row under this worker's
        own lease that no attempt of it holds any more, such as one a store
        fault left behind; rows under another worker's live lease are not
        waited for); the count handled. Without a
        :class:`~dagwerk.store.QueueForecastStore` it stops when idle, as
        :meth:`run_until_idle` does. The worker is recorded as live meanwhile.

        A transient store fault is waited out as the background loop does (one
        line, the capped backoff, held settlements committed before the end);
        a fatal one is raised."""
        if self.presence is not None:
            self.presence.start()
        try:
            total = 0
            while not self.stopping.is_set():
                try:
                    if not self.faults.retry_parked():
                        self._pause_after_fault()
                        continue  # held settlements first: nothing may be left behind
                    total += self.run_until_idle()
                    due = self._next_due()
                    if self.faults.parked:
                        self._pause_after_fault()  # the held settlements, again
                        continue
                    self.faults.pause()  # a fault that cleared is said once
                    if due is None or due > horizon:
                        break
                    # The dequeue waits (up to a little past the row's time) for it.
                    total += self.process_once(wait_seconds=due + self.poll_interval)
                except Exception as exc:
                    if classify(exc) is not FaultKind.TRANSIENT:
                        raise
                    self.faults.note(exc, "serving the queue")
                    self._pause_after_fault()
            return total
        finally:
            if self.presence is not None:
                self.presence.stop()

    def _pause_after_fault(self) -> None:
        """The fault gate's backoff (or a fatal fault, raised)."""
        fatal = self.faults.fatal
        if fatal is not None:
            raise fatal
        self.clock.wait(self.stopping, max(self.faults.pause(), self.poll_interval))

    def _next_due(self) -> float | None:
        forecast = self.capabilities.forecast
        if forecast is None:
            return None
        return forecast.next_delivery_in(
            queues=self.queues, plugins=self.served_plugins(), worker_id=self.worker_id
        )

    def _step(self) -> bool:
        return self.background.step()

    # --- one batch -------------------------------------------------------------------

    def process_once(self, wait_seconds: float = 0.0) -> int:
        """Lease up to ``concurrency`` deliveries (waiting up to ``wait_seconds``
        for work) and handle them; the number leased. With nothing to lease it
        settles dead-lettered tasks and runs the throttled idle sweep, and
        returns the number of tasks the sweep requeued."""
        if self.stopping.is_set():
            if self.batch is not None:
                self.batch.release_claimed_ahead()
            return 0  # admission is closed: nothing more is leased
        if self.batch is not None:
            leased = self.batch.process(wait_seconds)
            if leased is not None:
                return leased
            return self.background.idle_sweep()
        settings = self.settings
        batch: list[LeasedDelivery] = self.queue.dequeue(
            self.worker_id,
            limit=settings.concurrency,
            lease_seconds=settings.lease_seconds,
            queues=settings.queues,
            wait_seconds=wait_seconds,
            plugins=self.served_plugins(),
            prefer_run=settings.prefer_run,
        )
        self.settler.settle_dead_lettered()
        if not batch:
            return self.background.idle_sweep()
        self.single.serve(batch)
        return len(batch)

    # --- per-node settings -------------------------------------------------------------

    @staticmethod
    def retry_policy(node: DagNode, spec: PluginSpec) -> RetryPolicy:
        """The node's stored retry setting over the plugin's registration default."""
        return AttemptPreparer.retry_policy(node, spec)

    def timeout_of(self, node: DagNode, spec: PluginSpec) -> float | None:
        """Node timeout, else the plugin's, else the worker default (WK-03)."""
        return self.preparer.timeout_of(node, spec)

    def cost_estimate_of(self, node: DagNode, spec: PluginSpec) -> CostEstimate | None:
        """The node's ``cost_estimate``, else the worker's estimate for the
        plugin, else the plugin's registered ``cost``."""
        return self.preparer.cost_estimate_of(node, spec)

    def lease_bound(self, timeout: float | None) -> float:
        """Ownership bound = max(task timeout, lease setting) + grace (WK-03)."""
        return self.settings.lease_bound(timeout)
