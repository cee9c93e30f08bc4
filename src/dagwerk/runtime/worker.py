"""The worker: dequeue, claim, execute with a deadline, settle, acknowledge.

One :class:`Worker` serves one store's queue. Its advancement actor is the
only caller of :meth:`Worker.process_once`, so one batch is in flight at a
time; inside a batch up to ``concurrency`` attempts run in parallel.

A worker leases only deliveries whose node's plugin it has
(:meth:`Worker.served_plugins`, a filter of the store's dequeue): another
plugin's task is never leased, failed or counted against its deliveries,
and waits for a worker that has it. The worker records itself and what it
serves (:mod:`dagwerk.runtime.presence`) for the stall diagnosis.

Per delivery (WK-15): read the run (not RUNNING: nothing runs) → claim the
attempt → register the attempt's abort signal → read the run again (an
unreadable run crashes the attempt) → resolve inputs → execute with the
deadline → settle → acknowledge. While the attempt runs, a watcher reads the
run's durable status every ``cancel_check_interval`` and fires the abort on
cancellation, and extends the delivery's lease (``ctx.heartbeat()`` extends
it at once). Settlement is fenced by the attempt ID in the store, so a late
or cancelled attempt changes nothing (WK-14).

A delivery whose task is still RUNNING under the same attempt was
redelivered because its previous holder lost the lease: the new holder
recovers the task (a new attempt; the old attempt's late settle is stale)
and the store carries the lost-delivery count forward, so a task that keeps
killing its worker reaches the dead-letter queue after ``max_deliveries``.
Tasks the queue crashed by dead-lettering are settled by the run's failure
policy after each dequeue. When idle, the worker sweeps RUNNING tasks that
have no queue row at all, at most once per lease duration (WK-17..WK-21).
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dagwerk._fifo import FifoCache
from dagwerk.budgets import BudgetExhaustedError
from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import DEFAULT_BURST_HORIZON, RunStatus, TaskStatus
from dagwerk.errors import DagwerkError
from dagwerk.execution import claim_task, recover_task
from dagwerk.lineage import DEFAULT_MAX_CHILD_DEPTH, RunLink
from dagwerk.models import DagNode
from dagwerk.orchestrator import (
    OrchestratorCallbacks,
    complete_attempt,
    on_task_crashed,
    on_task_failed,
    settle_crashed_task,
)
from dagwerk.runtime._inline import InlineRunner
from dagwerk.runtime._threads import spawn
from dagwerk.runtime.actor import AdvancementActor
from dagwerk.runtime.attempts import LINKS_KEPT, Attempt, BatchReads, Running
from dagwerk.runtime.backstop import DEFAULT_BACKSTOP_INTERVAL, Backstop
from dagwerk.runtime.batch import process_batch
from dagwerk.runtime.budget_guard import ByteLimits, CostEstimate, admit_task, check_output_limit
from dagwerk.runtime.children import guard_lineage, settle_child_wait
from dagwerk.runtime.clock import Clock, SystemClock
from dagwerk.runtime.context import TaskContext, validate_execution_root
from dagwerk.runtime.durable import open_journal
from dagwerk.runtime.errors import (
    NonRetryableError,
    TaskTimedOut,
    WorkerStoppedError,
)
from dagwerk.runtime.executors import (
    AttemptSignal,
    ClosableExecutor,
    ExecutionOutcome,
    Executor,
    OutcomeKind,
    make_executor,
)
from dagwerk.runtime.monitor import AttemptMonitor
from dagwerk.runtime.observer import WorkerObserver, notify
from dagwerk.runtime.plugins import PluginFn, PluginRegistry, PluginSpec
from dagwerk.runtime.presence import Presence
from dagwerk.runtime.retention import PeriodicRetention, RetentionPolicy
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.sweep import StaleSweeper, SweepReport
from dagwerk.runtime.task_logs import TaskLogLimits, TaskLogWriter
from dagwerk.runtime.traced import attempt_started, attempts_settled, attempts_settling
from dagwerk.scheduling.scheduler import DEFAULT_SCHEDULE_INTERVAL, worker_scheduler
from dagwerk.store import (
    BatchQueueStore,
    ClaimedDelivery,
    DagBudgetStore,
    DagChildStore,
    DagQueueStore,
    DelayedRetryStore,
    LeasedDelivery,
    QueueForecastStore,
    TaskRecord,
    WaitResponseStore,
)
from dagwerk.task_input import resolve_task_inputs
from dagwerk.tracing import WorkerTracing, traced_callbacks
from dagwerk.waiting import wait_task

__all__ = [
    "DEFAULT_BURST_HORIZON",
    "DeliveryReport",
    "SecretResolver",
    "SweepReport",
    "Worker",
    "validate_execution_root",
]

_LOG = logging.getLogger("dagwerk.runtime.worker")

REPORTS_KEPT = 10_000
"""How many of its latest :class:`DeliveryReport` a worker keeps in ``reports``."""

SecretResolver = Callable[[str, str], Mapping[str, str]]
"""``(run_id, plugin_name) -> secrets`` handed to the task as ``ctx.secrets``."""


def _noop(run_id: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """What the worker did with one delivery (for tests and logs)."""

    delivery_id: str
    task_id: str
    action: str  # completed, failed, retried, recovered, dead_lettered, waited, cancelled, ...
    detail: str = ""


class Worker:
    """Runs the plugins of deliveries from ``store``'s queue.

    ``store`` is a ``DagStore`` + ``DagRunStore`` + ``OutputResolver`` (and
    ``DagRetryStore`` for retries, ``DagWaitStore`` for ``ctx.wait``) and a
    ``DagQueueStore``, whose leases hide a delivery while its attempt runs.
    A retry policy needs a ``DelayedRetryStore`` (without one a failure is
    final, as in the seed) and ``ctx.wait_response`` a ``WaitResponseStore``
    (without one it is ``None``).
    """

    def __init__(
        self,
        store: Any,
        plugins: PluginRegistry | dict[str, PluginFn],
        *,
        concurrency: int = 1,
        executor: str | Executor = "thread",
        lease_seconds: float = 30.0,
        lease_grace: float = 30.0,
        poll_interval: float = 0.5,
        cancel_check_interval: float | None = None,
        default_timeout: float | None = None,
        clock: Clock | None = None,
        max_deliveries: int | None = None,
        execution_root: str | Path | None = None,
        secret_resolver: SecretResolver | None = None,
        worker_id: str | None = None,
        callbacks: OrchestratorCallbacks | None = None,
        rng: random.Random | None = None,
        idle_wait: float | None = None,
        queues: list[str] | None = None,
        observers: list[WorkerObserver] | None = None,
        backstop_interval: float | None = DEFAULT_BACKSTOP_INTERVAL,
        max_child_depth: int = DEFAULT_MAX_CHILD_DEPTH,
        byte_limits: ByteLimits | None = None,
        cost_estimates: Mapping[str, CostEstimate] | None = None,
        batched: bool = True,
        prefer_run: str | None = None,
        retention: float | timedelta | str | RetentionPolicy | None = None,
        task_log_limits: TaskLogLimits | None = None,
        schedule_interval: float | None = DEFAULT_SCHEDULE_INTERVAL,
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise DagwerkError("concurrency must be an int >= 1", field="concurrency")
        self.execution_root = validate_execution_root(
            execution_root if execution_root is not None else None
        )
        self.store = store
        self.plugins = plugins if isinstance(plugins, PluginRegistry) else PluginRegistry(plugins)
        self.concurrency = concurrency
        self.executor = make_executor(executor, processes=concurrency)
        # An executor made here from its name is this worker's to close (the
        # process executor's processes); one passed in is its caller's.
        self._owned_executor: ClosableExecutor | None = (
            self.executor
            if isinstance(executor, str) and isinstance(self.executor, ClosableExecutor)
            else None
        )
        self.lease_seconds = lease_seconds
        self.lease_grace = lease_grace
        self.poll_interval = poll_interval
        self.cancel_check_interval = cancel_check_interval or poll_interval
        self.default_timeout = default_timeout
        self.clock = clock or SystemClock()
        # Protocol checks walk every member of the protocol; a worker asks
        # them once here, not per delivery.
        self.capabilities = StoreCapabilities.of(store)
        queue = self.capabilities.queue
        if queue is None:
            raise DagwerkError(
                "the worker needs a store that implements DagQueueStore", field="store"
            )
        self.queue: DagQueueStore = queue
        if max_deliveries is None:
            max_deliveries = int(queue.max_deliveries)
        self.max_deliveries = max_deliveries
        self.secret_resolver = secret_resolver
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:12]}"
        self.callbacks = callbacks or OrchestratorCallbacks(_noop, _noop, _noop, _noop)
        self.child_store: DagChildStore | None = self.capabilities.children
        self.retry_store: DelayedRetryStore | None = self.capabilities.delayed_retry
        self.wait_responses: WaitResponseStore | None = self.capabilities.wait_responses
        # Kept across batches (immutable), the most recent LINKS_KEPT runs'.
        self.run_links: dict[str, RunLink | None] = FifoCache(LINKS_KEPT)
        self.budget_store: DagBudgetStore | None = self.capabilities.budgets
        # A store that claims and completes several attempts per commit gets
        # the batched path (runtime/batch.py); any other the one-by-one path.
        self._batch_store: BatchQueueStore | None = self.capabilities.batch if batched else None
        self._rng = rng or random.Random()
        # How long an idle background step waits in dequeue for new work.
        self.idle_wait = poll_interval if idle_wait is None else idle_wait
        self.queues = queues
        # Rows of this run are leased first (``Engine.run``'s own run); a
        # preference, not a filter.
        self.prefer_run = prefer_run
        self.forecast: QueueForecastStore | None = self.capabilities.forecast
        presence = self.capabilities.presence
        self.presence: Presence | None = (
            None
            if presence is None
            else Presence(presence, self.worker_id, plugins=self.served_plugins, queues=queues)
        )
        self.sweeper = StaleSweeper(self)
        # Child runs and budgets: the depth limit every run's
        # persisted lineage is checked against, and the byte limits, copied
        # now so nothing later can raise them (BG-01).
        if type(max_child_depth) is not int or max_child_depth < 0:
            raise DagwerkError("max_child_depth must be an int >= 0", field="max_child_depth")
        self.max_child_depth = max_child_depth
        limits = byte_limits or ByteLimits()
        self.byte_limits = ByteLimits(limits.max_input_bytes, limits.max_output_bytes)
        self.cost_estimates: dict[str, CostEstimate] = dict(cost_estimates or {})
        # What plugins log during an attempt, stored per attempt (task_logs.py).
        self.task_logs = TaskLogWriter(self.capabilities.task_logs, task_log_limits)
        # OpenTelemetry spans, when this process traces (dagwerk/tracing.py).
        self.tracing = WorkerTracing.create(self.capabilities.run_traces, self.capabilities.runs)
        if self.tracing is not None:
            self.callbacks = traced_callbacks(self.callbacks, self.tracing)
        # Gated dispatch: observers (metrics) and the periodic backstop, which
        # runs from the background loop only (once at start, then every
        # ``backstop_interval`` seconds; ``None`` disables it).
        self.observers: list[WorkerObserver] = list(observers or ())
        self.backstop: Backstop | None = None
        if self.capabilities.backstop is not None:
            self.backstop = Backstop(
                self.capabilities.backstop,
                interval=backstop_interval,
                clock=self.clock,
                holder=self.worker_id,
                callbacks=self.callbacks,
                on_report=lambda report: notify(self.observers, "backstop_finished", report),
            )
        # Deleting old runs (``retention``: their age, or a RetentionPolicy),
        # from the background loop next to the backstop.
        self.retention = PeriodicRetention.for_worker(
            self.capabilities, retention, clock=self.clock, holder=self.worker_id
        )
        # Schedules: this worker takes part in firing them (scheduling/).
        self.scheduler = worker_scheduler(
            store, interval=schedule_interval, clock=self.clock, holder=self.worker_id
        )
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="dagwerk-w")
        self._running: dict[str, Running] = {}
        self.monitor = AttemptMonitor(self)
        # Runs a batch's lone attempt on the actor's loop thread (batch.py).
        self.inline = InlineRunner(self.clock)
        self._running_lock = threading.Lock()
        # The latest reports only: a long-lived worker must not grow with
        # every delivery it ever handled.
        self.reports: deque[DeliveryReport] = deque(maxlen=REPORTS_KEPT)
        self._stopped = False
        # Deliveries the last batch's completions claimed for the next batch.
        self._claimed_ahead: list[ClaimedDelivery] = []
        self.actor = AdvancementActor(
            self._step,
            self._read_status,
            clock=self.clock,
            background=True,
            idle_backoff_min=min(0.025, poll_interval),
            idle_backoff_max=poll_interval,
            # process_once(idle_wait) is a long poll when the queue is empty.
            step_waits=self.idle_wait * 0.9,
        )

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Serve the queue in the background; idempotent; after stop it raises."""
        if self._stopped:
            raise WorkerStoppedError("the worker was stopped")
        if self.presence is not None:
            self.presence.start()
        self.actor.start()
        if self.scheduler is not None:
            self.scheduler.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop admission, abort running attempts, wait for the batch in flight
        and stop the plugin processes of the executor this worker made."""
        self._stopped = True
        if self.scheduler is not None:
            self.scheduler.stop()
        with self._running_lock:
            running = list(self._running.values())
        for entry in running:
            entry.signal.fire("worker stopping")
        self.actor.stop(timeout)
        self._release_claimed_ahead()
        self.monitor.stop()
        self.inline.stop()
        self._pool.shutdown(wait=True)
        if self.presence is not None:
            self.presence.stop()
        if self._owned_executor is not None:
            self._owned_executor.close()
        self.task_logs.close()

    def _take_claimed_ahead(self) -> list[ClaimedDelivery]:
        taken, self._claimed_ahead = self._claimed_ahead, []
        return taken

    def _release_claimed_ahead(self) -> None:
        """Give back what was claimed for a batch that will not run: as for an
        attempt the stop aborted, the delivery goes back and its redelivery
        recovers the task under a new attempt."""
        for claim in self._take_claimed_ahead():
            delivery = claim.delivery
            try:
                self.queue.nack(delivery.delivery_id, self.worker_id)
            except Exception:
                _LOG.exception("releasing delivery %s failed", delivery.delivery_id)
                continue
            self._report(delivery, "released", "worker stopping")

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
        retry on its backoff, a released delivery; rows under another
        worker's live lease are not waited for); the count handled. Without a
        :class:`~dagwerk.store.QueueForecastStore` it stops when idle, as
        :meth:`run_until_idle` does. The worker is recorded as live meanwhile."""
        if self.presence is not None:
            self.presence.start()
        try:
            total = 0
            while not self._stopped:
                total += self.run_until_idle()
                due = self._next_due()
                if due is None or due > horizon:
                    break
                # The dequeue waits (up to a little past the row's time) for it.
                total += self.process_once(wait_seconds=due + self.poll_interval)
            return total
        finally:
            if self.presence is not None:
                self.presence.stop()

    def _next_due(self) -> float | None:
        if self.forecast is None:
            return None
        return self.forecast.next_delivery_in(queues=self.queues, plugins=self.served_plugins())

    def _step(self) -> bool:
        if self.backstop is not None:
            self.backstop.maybe_run()
        if self.retention is not None:
            self.retention.maybe_run()
        handled = self.process_once(self.idle_wait) > 0
        self._step_finished()
        return handled

    def _step_finished(self) -> None:
        notify(self.observers, "step_finished")

    def _read_status(self, run_id: str) -> RunStatus | None:
        status: RunStatus | None = self.store.get_run_status(run_id)
        return status

    # --- one batch -------------------------------------------------------------------

    def process_once(self, wait_seconds: float = 0.0) -> int:
        """Lease up to ``concurrency`` deliveries (waiting up to ``wait_seconds``
        for work) and handle them; the number leased. With nothing to lease it
        settles dead-lettered tasks and runs the throttled idle sweep, and
        returns the number of tasks the sweep requeued."""
        if self._stopped:
            self._release_claimed_ahead()
            return 0  # admission is closed: nothing more is leased
        if self._batch_store is not None:
            leased = process_batch(self, self._batch_store, wait_seconds)
            if leased is not None:
                return leased
            return self._idle_sweep()
        batch: list[LeasedDelivery] = self.queue.dequeue(
            self.worker_id,
            limit=self.concurrency,
            lease_seconds=self.lease_seconds,
            queues=self.queues,
            wait_seconds=wait_seconds,
            plugins=self.served_plugins(),
            prefer_run=self.prefer_run,
        )
        self._settle_dead_lettered()
        if not batch:
            return self._idle_sweep()
        if len(batch) == 1:
            self._handle(batch[0])
        else:
            for future in [self._pool.submit(self._handle, d) for d in batch]:
                future.result()
        return len(batch)

    def _idle_sweep(self) -> int:
        swept = self.sweeper.maybe_sweep()
        if swept:
            notify(self.observers, "swept", swept)
        return sum(1 for report in swept if report.action == "requeued")

    def _report(self, delivery: LeasedDelivery, action: str, detail: str = "") -> None:
        report = DeliveryReport(delivery.delivery_id, delivery.task_id, action, detail)
        self.reports.append(report)
        notify(self.observers, "delivery_handled", report, delivery)

    def _ack(self, delivery: LeasedDelivery, action: str, detail: str = "") -> None:
        self.queue.ack(delivery.delivery_id, self.worker_id)
        self._report(delivery, action, detail)

    def _handle(self, delivery: LeasedDelivery) -> None:
        try:
            self._handle_unchecked(delivery)
        except Exception as exc:  # one bad delivery never stops the loop
            _LOG.exception("delivery %s failed in the worker", delivery.delivery_id)
            self.queue.nack(delivery.delivery_id, self.worker_id, delay=self.poll_interval)
            self._report(delivery, "error", f"{type(exc).__name__}: {exc}")

    def _handle_unchecked(self, delivery: LeasedDelivery) -> None:
        # First run check: a cancelled or finished run admits nothing.
        try:
            status = self._read_status(delivery.run_id)
        except Exception as exc:
            # Unreadable before the claim: nothing ran, so the delivery goes
            # back (acking it would strand the QUEUED task).
            _LOG.exception("reading run %s failed", delivery.run_id)
            self.queue.nack(delivery.delivery_id, self.worker_id, delay=self.poll_interval)
            self._report(delivery, "unreadable", f"{type(exc).__name__}: {exc}")
            return
        if status is not RunStatus.RUNNING:
            self._ack(delivery, "closed", f"run is {status}")
            return
        claimed = claim_task(
            self.store,
            delivery.task_id,
            expected_attempt_id=delivery.attempt_id,
            expected_generation=delivery.generation,
        )
        if claimed is None:
            self._unclaimable(delivery)
            return
        self._execute(delivery)

    def _safe_status(self, run_id: str) -> RunStatus | None:
        try:
            return self._read_status(run_id)
        except Exception:  # unreadable never authorises anything
            _LOG.exception("reading run %s failed", run_id)
            return None

    def _settle_dead_lettered(self) -> None:
        """Apply the failure policy to tasks this process's dequeue crashed by
        dead-lettering (the crash committed with the dead letter)."""
        for ref in self.queue.take_dead_lettered():
            try:
                settle_crashed_task(self.store, ref.task_id, callbacks=self.callbacks)
            except Exception:
                _LOG.exception("settling dead-lettered task %s failed", ref.task_id)
            report = DeliveryReport("", ref.task_id, "dead_lettered", "max_deliveries")
            self.reports.append(report)
            notify(self.observers, "delivery_handled", report, None)

    def _unclaimable(self, delivery: LeasedDelivery) -> None:
        task = self.store.get_task(delivery.task_id)
        if task is None or task.attempt_id != delivery.attempt_id or task.invalidated:
            self._ack(delivery, "stale")
            return
        if task.status == TaskStatus.RUNNING:
            # Redelivered while RUNNING: the previous lease holder died or lost
            # its lease, and this delivery now holds it (WK-05). The task is
            # recovered under a new attempt, so a late settle of the old one is
            # stale; the store carries the lost-delivery count forward.
            recovered = recover_task(
                self.store,
                task.task_id,
                expected_attempt_id=task.attempt_id,
                expected_generation=task.generation,
            )
            detail = recovered.recovered_attempt_id if recovered is not None else "refused"
            self._ack(delivery, "recovered", detail)
            return
        self._ack(delivery, "not_claimable", task.status.value)

    # --- one attempt -----------------------------------------------------------------

    def _execute(self, delivery: LeasedDelivery) -> None:
        attempt = self._prepare(delivery, self.store.get_task(delivery.task_id))
        if attempt is None:
            return
        # The signal is registered before the final read, so a cancellation that
        # commits after the read still aborts the attempt (WK-15).
        self._register(attempt)
        try:
            try:
                status = self._read_status(delivery.run_id)
            except Exception as exc:
                self._crash_unreadable(delivery, exc)
                return
            if status is not RunStatus.RUNNING:
                self._ack(delivery, "cancelled", f"run is {status}")
                return
            self._settle_attempt(attempt, self._run(attempt))
        finally:
            self._unregister(attempt)

    def _prepare(
        self,
        delivery: LeasedDelivery,
        task: TaskRecord | None,
        *,
        reads: BatchReads | None = None,
        leased_bound: float | None = None,
    ) -> Attempt | None:
        """Everything between the claim and the plugin: node, lineage guard,
        inputs, budget admission, timeout and the lease's bound. ``None`` when
        a guard settled the delivery. ``reads`` shares a batch's reads;
        the lease is extended unless ``leased_bound`` already covers it."""
        node = self._node(delivery)
        if task is None or node is None:
            self._ack(delivery, "stale")
            return None
        link_of = None if reads is None else reads.link
        if not guard_lineage(self, delivery, link_of=link_of):
            return None
        try:
            spec = self.plugins.get(node.plugin)
            resolver = self.store if reads is None else reads.resolver(delivery.run_id)
            inputs = resolve_task_inputs(resolver, run_id=delivery.run_id, plan=task.plan)
        except DagwerkError as exc:
            self._fail(delivery, exc)
            return None
        estimate = self.cost_estimate_of(node, spec)
        accounts_of = None if reads is None else reads.budget
        if not admit_task(self, delivery, node.plugin, estimate, inputs, accounts_of=accounts_of):
            return None
        timeout = self.timeout_of(node, spec)
        bound = self.lease_bound(timeout)
        if leased_bound is None or bound > leased_bound:
            self.queue.extend_lease(delivery.delivery_id, self.worker_id, bound)
        attempt = Attempt(
            delivery, task, node, spec, inputs, self.retry_policy(node, spec), timeout, bound
        )
        # The lease runs its whole bound from about now (the claim's, or the
        # extension just made): the monitor and heartbeats fold what follows.
        attempt.entry.last_beat = self.clock.monotonic()
        return attempt

    def _register(self, attempt: Attempt) -> None:
        with self._running_lock:
            self._running[attempt.delivery.delivery_id] = attempt.entry
        if self._stopped:
            attempt.entry.signal.fire("worker stopping")

    def _unregister(self, attempt: Attempt) -> None:
        with self._running_lock:
            self._running.pop(attempt.delivery.delivery_id, None)

    def _start_attempt(self, attempt: Attempt) -> TaskContext:
        """The attempt's context, announced to the observers as started."""
        attempt.ctx = self._context(
            attempt.delivery,
            attempt.node,
            attempt.task.resumed_from_wait_id,
            attempt=attempt.task.attempt_number,
            entry=attempt.entry,
            bound=attempt.bound,
        )
        notify(self.observers, "task_started", attempt.delivery, attempt.node)
        attempt_started(self.tracing, attempt)
        return attempt.ctx

    def _run(self, attempt: Attempt, *, watch: bool = True) -> ExecutionOutcome:
        """Run the plugin with its deadline while a watcher follows the run
        (its own watcher thread; ``watch=False``: the worker's monitor)."""
        delivery, entry = attempt.delivery, attempt.entry
        ctx = self._start_attempt(attempt)
        watcher = (
            spawn(
                lambda: self._watch(delivery, entry, attempt.bound),
                name=f"dagwerk-watch-{delivery.task_id}",
            )
            if watch
            else None
        )
        try:
            return self.executor.execute(
                attempt.spec.fn,
                attempt.inputs,
                ctx,
                timeout=attempt.timeout,
                signal=entry.signal,
                clock=self.clock,
            )
        finally:
            entry.finish()
            if watcher is not None:
                watcher.join()

    def _handle_settle(self, attempt: Attempt, outcome: ExecutionOutcome) -> None:
        """:meth:`_settle_attempt`; an error is handled as :meth:`_handle` does."""
        delivery = attempt.delivery
        try:
            self._settle_attempt(attempt, outcome)
        except Exception as exc:
            _LOG.exception("delivery %s failed in the worker", delivery.delivery_id)
            self.queue.nack(delivery.delivery_id, self.worker_id, delay=self.poll_interval)
            self._report(delivery, "error", f"{type(exc).__name__}: {exc}")

    def _settle_attempt(self, attempt: Attempt, outcome: ExecutionOutcome) -> None:
        self.task_logs.flush()  # the attempt's lines are stored before it settles
        attempts_settling(self.tracing, [attempt], [outcome])
        try:
            self._settle(
                attempt.delivery,
                outcome,
                attempt.task.attempt_number,
                attempt.policy,
                attempt.entry.signal,
                ctx=attempt.ctx,
            )
        finally:
            attempts_settled(self.tracing, [attempt])

    def _node(self, delivery: LeasedDelivery) -> DagNode | None:
        # A RunTopologyStore hands out one cached definition instead of
        # copying every node of the run per delivery.
        topology = self.capabilities.topology
        if topology is not None:
            return topology.get_run_node(delivery.run_id, delivery.node_index)
        nodes = self.store.get_run_nodes(delivery.run_id)
        return None if nodes is None else nodes[delivery.node_index]

    # --- per-node settings -------------------------------------------------------------

    @staticmethod
    def retry_policy(node: DagNode, spec: PluginSpec) -> RetryPolicy:
        """The node's stored retry setting over the plugin's registration default."""
        return RetryPolicy.from_spec(node.retry) if node.retry is not None else spec.retry

    def timeout_of(self, node: DagNode, spec: PluginSpec) -> float | None:
        """Node timeout, else the plugin's, else the worker default (WK-03)."""
        if node.timeout_seconds is not None:
            return node.timeout_seconds
        return spec.timeout_seconds or self.default_timeout

    def cost_estimate_of(self, node: DagNode, spec: PluginSpec) -> CostEstimate | None:
        """The node's ``cost_estimate``, else the worker's estimate for the
        plugin, else the plugin's registered ``cost``."""
        if node.cost_estimate is not None:
            return node.cost_estimate
        return self.cost_estimates.get(node.plugin, spec.cost)

    def lease_bound(self, timeout: float | None) -> float:
        """Ownership bound = max(task timeout, lease setting) + grace (WK-03)."""
        return max(timeout or 0.0, self.lease_seconds) + self.lease_grace

    def _context(
        self,
        delivery: LeasedDelivery,
        node: DagNode,
        resumed_from: str | None,
        *,
        attempt: int,
        entry: Running,
        bound: float,
    ) -> TaskContext:
        secrets = (
            MappingProxyType(dict(self.secret_resolver(delivery.run_id, node.plugin)))
            if self.secret_resolver is not None
            else MappingProxyType({})
        )
        response = None
        if resumed_from is not None and self.wait_responses is not None:
            response = self.wait_responses.get_wait_response(delivery.task_id, resumed_from)

        def heartbeat() -> None:
            self._heartbeat(delivery, entry, bound)

        return TaskContext(
            run_id=delivery.run_id,
            task_id=delivery.task_id,
            node_index=delivery.node_index,
            generation=delivery.generation,
            attempt_id=delivery.attempt_id,
            attempt=attempt,
            plugin=node.plugin,
            execution_root=self.execution_root,
            cancelled=entry.signal.abort,
            resumed_from_wait_id=resumed_from,
            secrets=secrets,
            logger=logging.getLogger(f"dagwerk.task.{node.plugin}"),
            heartbeat_fn=heartbeat,
            wait_response=response,
            byte_limits=self.byte_limits,
            journal=open_journal(
                self.capabilities.durable,
                delivery,
                attempt=attempt,
                resumed_from=resumed_from,
                wait_response=response,
            ),
            task_log=self.task_logs.open(
                run_id=delivery.run_id,
                task_id=delivery.task_id,
                node_index=delivery.node_index,
                attempt=attempt,
                secrets=secrets,
            ),
        )

    def _heartbeat(self, delivery: LeasedDelivery, entry: Running, bound: float) -> None:
        """Extend the lease now; beats closer than a tenth of the lease are folded."""
        now = self.clock.monotonic()
        if now - entry.last_beat < self.lease_seconds / 10:
            return
        entry.last_beat = now
        self.queue.extend_lease(delivery.delivery_id, self.worker_id, bound)

    def _crash_unreadable(self, delivery: LeasedDelivery, exc: BaseException) -> None:
        """The run became unreadable after the claim: the attempt is closed as
        CRASHED rather than stranded RUNNING (WK-15)."""
        _LOG.exception("reading run %s after the claim failed", delivery.run_id)
        reason = f"run unreadable after claim: {type(exc).__name__}: {exc}"
        try:
            on_task_crashed(
                self.store,
                task_id=delivery.task_id,
                expected_attempt_id=delivery.attempt_id,
                error_message=reason,
                callbacks=self.callbacks,
            )
        except Exception:
            # Still unreadable: leave the lease to expire; the redelivery recovers.
            self._report(delivery, "unreadable", reason)
            return
        self._ack(delivery, "crashed", reason)

    def _watch(self, delivery: LeasedDelivery, entry: Running, bound: float) -> None:
        """Observe durable run state at a bounded interval; extend the lease."""
        while not self.clock.wait(entry.done, self.cancel_check_interval):
            status = self._safe_status(delivery.run_id)
            if status is not RunStatus.RUNNING:
                entry.signal.fire(f"run is {status}")
                return
            self.queue.extend_lease(delivery.delivery_id, self.worker_id, bound)

    def _settle(
        self,
        delivery: LeasedDelivery,
        outcome: ExecutionOutcome,
        attempt: int,
        policy: RetryPolicy,
        signal: AttemptSignal,
        *,
        ctx: TaskContext | None = None,
    ) -> None:
        if outcome.kind is OutcomeKind.OK:
            if not check_output_limit(self, delivery, outcome.outputs):
                return
            try:
                # The store's completion record says whether this attempt won
                # (an exact repeat returns the first record), so no read follows.
                won = complete_attempt(
                    self.store,
                    task_id=delivery.task_id,
                    expected_attempt_id=delivery.attempt_id,
                    outputs=outcome.outputs,
                    callbacks=self.callbacks,
                )
            except BudgetExhaustedError as exc:
                # The completion wrote nothing; the task fails without retry.
                self._fail(delivery, exc)
                return
            self._ack(delivery, "completed" if won is not None else "discarded")
            return
        if outcome.kind is OutcomeKind.WAIT:
            assert outcome.wait_id is not None
            if ctx is not None and settle_child_wait(self, delivery, ctx, outcome.wait_id):
                return
            waited = wait_task(
                self.store,
                delivery.task_id,
                outcome.wait_id,
                expected_attempt_id=delivery.attempt_id,
                expected_generation=delivery.generation,
            )
            self._ack(delivery, "waited" if waited else "stale", outcome.wait_id)
            return
        if outcome.kind is OutcomeKind.CANCELLED:
            if signal.reason == "worker stopping":
                # Nothing is settled: the delivery goes back, and its redelivery
                # recovers the task under a new attempt.
                self.queue.nack(delivery.delivery_id, self.worker_id)
                self._report(delivery, "released", "worker stopping")
                return
            self._ack(delivery, "cancelled", signal.reason or "")
            return
        error: BaseException
        if outcome.kind is OutcomeKind.TIMEOUT:
            error = TaskTimedOut(f"task timed out ({outcome.detail})")
        else:
            error = outcome.error or RuntimeError("Unknown error")
        if (
            outcome.retryable
            and self.retry_store is not None
            and policy.should_retry(error, attempt)
        ):
            self._reserve_retry(self.retry_store, delivery, error, attempt, policy)
        elif outcome.kind is OutcomeKind.TIMEOUT:
            # A timeout that cannot be retried is recorded as a crash (decisions.md).
            on_task_crashed(
                self.store,
                task_id=delivery.task_id,
                expected_attempt_id=delivery.attempt_id,
                error_message=_describe(error),
                callbacks=self.callbacks,
            )
            self._ack(delivery, "timed_out", _describe(error))
        else:
            self._fail(delivery, error)

    def _fail(self, delivery: LeasedDelivery, error: BaseException) -> None:
        on_task_failed(
            self.store,
            task_id=delivery.task_id,
            expected_attempt_id=delivery.attempt_id,
            error_message=_describe(error),
            callbacks=self.callbacks,
        )
        self._ack(delivery, "failed", _describe(error))

    def _reserve_retry(
        self,
        store: DelayedRetryStore,
        delivery: LeasedDelivery,
        error: BaseException,
        attempt: int,
        policy: RetryPolicy,
    ) -> None:
        # One commit records the failure and reserves the next attempt with a
        # delayed delivery, so no finaliser can close the run in between (WK-13).
        delay = policy.next_delay(attempt, self._rng)
        new_attempt = store.try_fail_task_with_retry(
            delivery.task_id,
            _describe(error),
            expected_attempt_id=delivery.attempt_id,
            available_at=self.clock.time() + delay,
        )
        if new_attempt is None:
            self._ack(delivery, "stale", "failure not accepted")
            return
        self._ack(delivery, "retried", f"attempt {attempt} failed; retry in {delay:.3f}s")


def _describe(error: BaseException) -> str:
    if isinstance(error, NonRetryableError | TaskTimedOut):
        return str(error)
    return f"{type(error).__name__}: {error}"
