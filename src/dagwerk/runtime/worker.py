"""The worker: dequeue, claim, execute with a deadline, settle, acknowledge.

One :class:`Worker` serves one store's queue. Its advancement actor is the
only caller of :meth:`Worker.process_once`, so one batch is in flight at a
time; inside a batch up to ``concurrency`` attempts run in parallel.

Per delivery (WK-15): read the run (not RUNNING or unreadable: nothing runs)
→ claim the attempt → register the attempt's abort signal → read the run
again → resolve inputs → execute with the deadline → settle → acknowledge.
While the attempt runs, a watcher reads the run's durable status every
``cancel_check_interval`` and fires the abort on cancellation, and extends
the delivery's lease. Settlement is fenced by the attempt ID in the store, so
a late or cancelled attempt changes nothing (WK-14).
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.errors import DagwerkError
from dagwerk.execution import claim_task
from dagwerk.orchestrator import (
    OrchestratorCallbacks,
    on_task_complete,
    on_task_crashed,
    on_task_failed,
)
from dagwerk.retry import retry_task
from dagwerk.runtime.actor import AdvancementActor
from dagwerk.runtime.clock import Clock, SystemClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.errors import (
    ExecutionRootError,
    NonRetryableError,
    TaskTimedOut,
    WorkerStoppedError,
)
from dagwerk.runtime.executors import (
    AttemptSignal,
    ExecutionOutcome,
    Executor,
    OutcomeKind,
    make_executor,
)
from dagwerk.runtime.plugins import PluginFn, PluginRegistry
from dagwerk.store import DagQueueStore, LeasedDelivery
from dagwerk.task_input import resolve_task_inputs
from dagwerk.waiting import wait_task

__all__ = ["DeliveryReport", "SecretResolver", "Worker", "validate_execution_root"]

_LOG = logging.getLogger("dagwerk.runtime.worker")

SecretResolver = Callable[[str, str], Mapping[str, str]]
"""``(run_id, plugin_name) -> secrets`` handed to the task as ``ctx.secrets``."""


def validate_execution_root(root: object) -> Path:
    """An existing directory, made absolute; never ``None``, ``""`` or ``"."`` (AA-08)."""
    if root is None or not isinstance(root, str | Path):
        raise ExecutionRootError("execution root is required", field="execution_root")
    if str(root) in ("", "."):
        raise ExecutionRootError(
            f"execution root {str(root)!r} is not an explicit directory", field="execution_root"
        )
    path = Path(root)
    if not path.is_absolute():
        raise ExecutionRootError(
            f"execution root {str(root)!r} must be an absolute path", field="execution_root"
        )
    resolved = path.resolve()
    if not resolved.is_dir():
        raise ExecutionRootError(
            f"execution root {str(root)!r} is not an existing directory", field="execution_root"
        )
    return resolved


def _noop(run_id: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """What the worker did with one delivery (for tests and logs)."""

    delivery_id: str
    task_id: str
    action: str  # completed, failed, retried, retry_released, waited, cancelled, ...
    detail: str = ""


@dataclass(slots=True)
class _Running:
    signal: AttemptSignal
    done: threading.Event = field(default_factory=threading.Event)
    heartbeat: threading.Event = field(default_factory=threading.Event)


class Worker:
    """Runs the plugins of deliveries from ``store``'s queue.

    ``store`` is a ``DagStore`` + ``DagRunStore`` + ``OutputResolver`` (and
    ``DagRetryStore`` for retries, ``DagWaitStore`` for ``ctx.wait``) and a
    ``DagQueueStore``, whose leases hide a delivery while its attempt runs.
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
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise DagwerkError("concurrency must be an int >= 1", field="concurrency")
        self.execution_root = validate_execution_root(
            execution_root if execution_root is not None else None
        )
        self.store = store
        self.plugins = plugins if isinstance(plugins, PluginRegistry) else PluginRegistry(plugins)
        self.concurrency = concurrency
        self.executor = make_executor(executor)
        self.lease_seconds = lease_seconds
        self.lease_grace = lease_grace
        self.poll_interval = poll_interval
        self.cancel_check_interval = cancel_check_interval or poll_interval
        self.default_timeout = default_timeout
        self.clock = clock or SystemClock()
        if max_deliveries is None:
            max_deliveries = int(getattr(store, "max_deliveries", 3))
        self.max_deliveries = max_deliveries
        self.secret_resolver = secret_resolver
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:12]}"
        self.callbacks = callbacks or OrchestratorCallbacks(_noop, _noop, _noop, _noop)
        if not isinstance(store, DagQueueStore):
            raise DagwerkError(
                "the worker needs a store that implements DagQueueStore", field="store"
            )
        self.queue: DagQueueStore = store
        self._rng = rng or random.Random()
        # Attempt numbers the worker assigned when it reserved a retry; the
        # store has no attempt counter yet, so this is process-local.
        self._attempt_numbers: dict[str, int] = {}
        self._numbers_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="dagwerk-w")
        self._running: dict[str, _Running] = {}
        self._running_lock = threading.Lock()
        self.reports: list[DeliveryReport] = []
        self._stopped = False
        self.actor = AdvancementActor(
            self._step,
            self._read_status,
            clock=self.clock,
            background=True,
            idle_backoff_min=min(0.025, poll_interval),
            idle_backoff_max=poll_interval,
        )

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Serve the queue in the background; idempotent; after stop it raises."""
        if self._stopped:
            raise WorkerStoppedError("the worker was stopped")
        self.actor.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop admission, abort running attempts and wait for the batch in flight."""
        self._stopped = True
        with self._running_lock:
            running = list(self._running.values())
        for entry in running:
            entry.signal.fire("worker stopping")
        self.actor.stop(timeout)
        self._pool.shutdown(wait=True)

    def wait_for_run(self, run_id: str, timeout: float | None = None) -> RunStatus:
        """Block until the run is terminal (see :meth:`AdvancementActor.wait_for_run`)."""
        return self.actor.wait_for_run(run_id, timeout)

    def run_until_idle(self, max_batches: int = 100_000) -> int:
        """Process batches in this thread until a dequeue finds nothing; the count handled."""
        total = 0
        for _ in range(max_batches):
            handled = self.process_once()
            if handled == 0:
                break
            total += handled
        return total

    def _step(self) -> bool:
        return self.process_once() > 0

    def _read_status(self, run_id: str) -> RunStatus | None:
        status: RunStatus | None = self.store.get_run_status(run_id)
        return status

    # --- one batch -------------------------------------------------------------------

    def process_once(self) -> int:
        """Lease up to ``concurrency`` deliveries and handle them; the number leased."""
        batch: list[LeasedDelivery] = self.queue.dequeue(
            self.worker_id, limit=self.concurrency, lease_seconds=self.lease_seconds
        )
        if not batch:
            return 0
        if len(batch) == 1:
            self._handle(batch[0])
        else:
            for future in [self._pool.submit(self._handle, d) for d in batch]:
                future.result()
        return len(batch)

    def _report(self, delivery: LeasedDelivery, action: str, detail: str = "") -> None:
        self.reports.append(DeliveryReport(delivery.delivery_id, delivery.task_id, action, detail))

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
        # First run check: a cancelled, finished or unreadable run admits nothing.
        status = self._safe_status(delivery.run_id)
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
        self._execute(delivery, attempt=self._attempt_number(delivery.attempt_id))

    def _safe_status(self, run_id: str) -> RunStatus | None:
        try:
            return self._read_status(run_id)
        except Exception:  # unreadable closes the attempt rather than authorising it
            _LOG.exception("reading run %s failed", run_id)
            return None

    def _attempt_number(self, attempt_id: str) -> int:
        with self._numbers_lock:
            return self._attempt_numbers.get(attempt_id, 1)

    def _unclaimable(self, delivery: LeasedDelivery) -> None:
        task = self.store.get_task(delivery.task_id)
        if task is None or task.attempt_id != delivery.attempt_id or task.invalidated:
            self._ack(delivery, "stale")
            return
        if task.status == TaskStatus.CRASHED:
            # A failure whose retry was reserved by delaying this delivery: the
            # delay has passed, so the next attempt is created now (WK-06).
            new_attempt = retry_task(self.store, task.task_id, expected_attempt_id=task.attempt_id)
            if new_attempt is not None:
                with self._numbers_lock:
                    number = self._attempt_numbers.pop(task.attempt_id, 1) + 1
                    self._attempt_numbers[new_attempt] = number
            self._ack(delivery, "retry_released", str(new_attempt))
            return
        if task.status == TaskStatus.RUNNING:
            # Redelivered while RUNNING: the previous lease holder died or lost its
            # lease. This delivery now holds the lease, so it may run the attempt
            # again; completion is idempotent per attempt, so outputs publish once.
            if delivery.delivery_count >= self.max_deliveries:
                self._crash(delivery, f"abandoned after {delivery.delivery_count} deliveries")
                return
            self._execute(delivery, attempt=self._attempt_number(delivery.attempt_id))
            return
        self._ack(delivery, "not_claimable", task.status.value)

    def _crash(self, delivery: LeasedDelivery, reason: str) -> None:
        # Parked first: crashing the task may finalise the run, which drops the row.
        self.queue.nack(delivery.delivery_id, self.worker_id, poison=True, reason=reason)
        on_task_crashed(
            self.store,
            task_id=delivery.task_id,
            expected_attempt_id=delivery.attempt_id,
            error_message=reason,
            callbacks=self.callbacks,
        )
        self._report(delivery, "dead_lettered", reason)

    # --- one attempt -----------------------------------------------------------------

    def _execute(self, delivery: LeasedDelivery, *, attempt: int) -> None:
        task = self.store.get_task(delivery.task_id)
        nodes = self.store.get_run_nodes(delivery.run_id)
        if task is None or nodes is None:
            self._ack(delivery, "stale")
            return
        node = nodes[delivery.node_index]
        try:
            spec = self.plugins.get(node.plugin)
            inputs = resolve_task_inputs(self.store, run_id=delivery.run_id, plan=task.plan)
        except DagwerkError as exc:
            self._fail(delivery, exc, retryable=False)
            return
        timeout = spec.timeout_seconds or self.default_timeout
        bound = max(timeout or 0.0, self.lease_seconds) + self.lease_grace
        self.queue.extend_lease(delivery.delivery_id, self.worker_id, bound)
        entry = _Running(AttemptSignal())
        # The signal is registered before the final read, so a cancellation that
        # commits after the read still aborts the attempt (WK-15).
        with self._running_lock:
            self._running[delivery.delivery_id] = entry
        try:
            if self._stopped:
                entry.signal.fire("worker stopping")
            status = self._safe_status(delivery.run_id)
            if status is not RunStatus.RUNNING:
                self._ack(delivery, "cancelled", f"run is {status}")
                return
            secrets = (
                MappingProxyType(dict(self.secret_resolver(delivery.run_id, node.plugin)))
                if self.secret_resolver is not None
                else MappingProxyType({})
            )
            ctx = TaskContext(
                run_id=delivery.run_id,
                task_id=delivery.task_id,
                node_index=delivery.node_index,
                generation=delivery.generation,
                attempt_id=delivery.attempt_id,
                attempt=attempt,
                plugin=node.plugin,
                execution_root=self.execution_root,
                cancelled=entry.signal.abort,
                resumed_from_wait_id=task.resumed_from_wait_id,
                secrets=secrets,
                logger=logging.getLogger(f"dagwerk.task.{node.plugin}"),
                heartbeat_fn=entry.heartbeat.set,
            )
            watcher = threading.Thread(
                target=self._watch, args=(delivery, entry, bound), daemon=True
            )
            watcher.start()
            try:
                outcome = self.executor.execute(
                    spec.fn, inputs, ctx, timeout=timeout, signal=entry.signal, clock=self.clock
                )
            finally:
                entry.done.set()
                watcher.join()
            self._settle(delivery, outcome, attempt, spec.retry, entry.signal)
        finally:
            with self._running_lock:
                self._running.pop(delivery.delivery_id, None)

    def _watch(self, delivery: LeasedDelivery, entry: _Running, bound: float) -> None:
        """Observe durable run state at a bounded interval; extend the lease."""
        while not self.clock.wait(entry.done, self.cancel_check_interval):
            status = self._safe_status(delivery.run_id)
            if status is not RunStatus.RUNNING:
                entry.signal.fire(f"run is {status}")
                return
            entry.heartbeat.clear()
            self.queue.extend_lease(delivery.delivery_id, self.worker_id, bound)

    def _settle(
        self,
        delivery: LeasedDelivery,
        outcome: ExecutionOutcome,
        attempt: int,
        policy: Any,
        signal: AttemptSignal,
    ) -> None:
        if outcome.kind is OutcomeKind.OK:
            on_task_complete(
                self.store,
                task_id=delivery.task_id,
                expected_attempt_id=delivery.attempt_id,
                outputs=outcome.outputs,
                callbacks=self.callbacks,
            )
            task = self.store.get_task(delivery.task_id)
            won = (
                task is not None
                and task.attempt_id == delivery.attempt_id
                and task.status is TaskStatus.COMPLETED
            )
            self._ack(delivery, "completed" if won else "discarded")
            return
        if outcome.kind is OutcomeKind.WAIT:
            assert outcome.wait_id is not None
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
                # Nothing is settled: the delivery goes back so another worker runs it.
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
        retryable = outcome.retryable and policy.should_retry(error, attempt)
        if retryable:
            self._reserve_retry(delivery, error, attempt, policy)
        else:
            self._fail(delivery, error, retryable=False)

    def _fail(self, delivery: LeasedDelivery, error: BaseException, *, retryable: bool) -> None:
        on_task_failed(
            self.store,
            task_id=delivery.task_id,
            expected_attempt_id=delivery.attempt_id,
            error_message=_describe(error),
            callbacks=self.callbacks,
        )
        self._ack(delivery, "failed", _describe(error))

    def _reserve_retry(
        self, delivery: LeasedDelivery, error: BaseException, attempt: int, policy: Any
    ) -> None:
        # The store cannot yet record a failure and reserve the next attempt in
        # one commit, so the attempt is marked CRASHED (which no fail-fast
        # finaliser acts on by itself) and this delivery comes back after the
        # backoff; its redelivery creates the next attempt (``_unclaimable``).
        result = self.store.mark_task_crashed(
            delivery.task_id, _describe(error), expected_attempt_id=delivery.attempt_id
        )
        if result is None:
            self._ack(delivery, "stale", "failure not accepted")
            return
        with self._numbers_lock:
            self._attempt_numbers[delivery.attempt_id] = attempt
        delay = policy.next_delay(attempt, self._rng)
        self.queue.nack(delivery.delivery_id, self.worker_id, delay=delay)
        self._report(delivery, "retried", f"attempt {attempt} failed; retry in {delay:.3f}s")


def _describe(error: BaseException) -> str:
    if isinstance(error, NonRetryableError | TaskTimedOut):
        return str(error)
    return f"{type(error).__name__}: {error}"
