"""The :class:`Engine` facade: one store, its plugins and its workers.

An engine is an explicit object (no global runtime): it opens a store from a
URL, keeps a plugin registry and builds workers bound to both. Everything it
does goes through the public orchestration functions (``start_run``,
``cancel_run``, ``retry_run``, ``resume_task``), so a run submitted here can
be worked, inspected and changed by any other process that opens the same
database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dagwerk.backends.errors import StoreUnavailableError
from dagwerk.budgets import Budget
from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import (
    DEFAULT_CONCURRENCY,
    RUN_TERMINAL_STATUSES,
    FailurePolicy,
    NodeDisposition,
    RunStatus,
    TaskStatus,
)
from dagwerk.graph import validate_graph
from dagwerk.identifiers import check_identifier
from dagwerk.json import canonical_json_bytes, thaw_json
from dagwerk.models import DagNode, NodeLaunch
from dagwerk.orchestrator import (
    OrchestratorCallbacks,
    RunStartRejectedError,
    cancel_run,
    reconcile_run,
    start_run,
)
from dagwerk.pipelines.loader import Pipeline
from dagwerk.plugins import PluginMeta
from dagwerk.retry import RetryRejectedError, RunRetryResult, rerun_nodes, retry_run
from dagwerk.runtime.backstop import (
    DEFAULT_BACKSTOP_INTERVAL,
    check_backstop_interval,
)
from dagwerk.runtime.errors import UnknownPluginError
from dagwerk.runtime.faults import FaultGate, FaultKind, classify
from dagwerk.runtime.plugins import CostEstimateFn, PluginFn
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.worker import Worker
from dagwerk.scheduling.scheduler import (
    DEFAULT_SCHEDULE_INTERVAL,
    SchedulerThread,
    check_schedule_interval,
)
from dagwerk.schema import get_pipeline_input_schema, merge_run_input
from dagwerk.store import (
    InvalidStoreValueError,
    RunRecord,
    TaskRecord,
    TaskResumeResult,
    WaitRecordStore,
    validate_wait_id,
)
from dagwerk.store_schedules import NewRun
from dagwerk.tracing import now_ns, record_run_end, record_submit
from dagwerk.waiting import resume_task

from ._errors import (
    EngineError,
    IdempotencyConflictError,
    ResumeRejectedError,
    RunExistsError,
    RunWaitTimeoutError,
    UnknownNodeError,
    UnsupportedOperationError,
)
from ._plugins import EngineRegistry, import_plugin_modules, plugin_problems
from ._results import (
    RunNotFoundError,
    RunProgress,
    RunResult,
)
from ._schedule_methods import ScheduleMethods
from ._schedules import (
    EngineSchedules,
    PipelineRegistry,
)
from ._urls import DEFAULT_URL, open_store
from ._view_methods import ViewMethods
from ._views import RunViews

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_IDEMPOTENCY_RETENTION",
    "Engine",
    "EngineError",
    "IdempotencyConflictError",
    "ResumeRejectedError",
    "RunExistsError",
    "RunWaitTimeoutError",
    "SubmitOutcome",
    "UnknownNodeError",
    "UnsupportedOperationError",
]

ProgressCallback = Callable[[RunProgress], None]


def _no_plugin_metadata(name: str) -> PluginMeta | None:
    # Plugins registered with the engine declare no input metadata; required
    # inputs come from the pipeline's runtime bindings.
    return None


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    """What :meth:`Engine.submit_once` did: the key's run, and whether this call created it."""

    run_id: str
    created: bool


DEFAULT_IDEMPOTENCY_RETENTION = 86_400.0
"""Seconds an idempotency key keeps naming its run (24 h)."""


def _ignore(run_id: str) -> None:
    return None


# Terminal transitions are observed by reading the store, so the engine needs
# no callbacks; they would only fire in the process that committed them.
_CALLBACKS = OrchestratorCallbacks(_ignore, _ignore, _ignore, _ignore)


def submit_fingerprint(run: NewRun, budgets: Budget | None) -> str:
    """What an idempotency key is checked against: a hash of the run's nodes,
    input, failure policy, pipeline name and budget (not its run ID)."""
    document = {
        "nodes": [node.model_dump(mode="json") for node in run.nodes],
        "input": thaw_json(run.run_input),
        "failure_policy": FailurePolicy(run.failure_policy).value,
        "pipeline": run.pipeline,
        "budget": None if budgets is None else budgets.model_dump(mode="json"),
    }
    return hashlib.sha256(canonical_json_bytes(document)).hexdigest()


def new_run_id() -> str:
    """A fresh run ID: ``run-`` and 16 hex digits."""
    return f"run-{uuid.uuid4().hex[:16]}"


MIN_READ_GAP = 0.005
"""The least seconds between two reads of a waiting ``Engine.wait`` woken
by the store's changes: a run with a commit every millisecond is not read
at that rate."""


class Engine(ScheduleMethods, ViewMethods):
    """A store opened from ``url``, a plugin registry, and workers bound to both.

    ``url`` is ``sqlite:///path.db`` (``None``: ``sqlite:///dagwerk.db`` in the
    current directory), ``memory://`` or ``postgresql://...``; ``store_options``
    go to the store (``limits``, ``max_deliveries``, ...). ``execution_root``
    is where plugins run (default: the current directory, made absolute);
    ``poll_interval`` is how often ``wait`` reads the run (on a SQLite file
    it reads again as soon as a commit may have changed it, on PostgreSQL as
    soon as a run of its schema ends, at most every ``MIN_READ_GAP``) and
    how long an idle in-process worker sleeps at most.
    ``backstop_interval`` is the seconds between the gated-dispatch backstop
    passes of the workers this engine builds, ``run`` included (default 30;
    ``None`` or 0 disables them).
    ``schedule_interval`` is the seconds between the scheduler passes of those
    workers (default 1; ``None`` or 0: they do not schedule).
    ``idempotency_retention`` is how long an idempotency key of ``submit``
    keeps naming its run (default 24 h).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        execution_root: str | Path | None = None,
        poll_interval: float = 0.05,
        backstop_interval: float | None = DEFAULT_BACKSTOP_INTERVAL,
        schedule_interval: float | None = DEFAULT_SCHEDULE_INTERVAL,
        idempotency_retention: float = DEFAULT_IDEMPOTENCY_RETENTION,
        **store_options: Any,
    ) -> None:
        self.url = url if url is not None else DEFAULT_URL
        self.execution_root = Path(execution_root or Path.cwd()).resolve()
        self.poll_interval = poll_interval
        self.backstop_interval = check_backstop_interval(backstop_interval)
        self.schedule_interval = check_schedule_interval(schedule_interval)
        if (
            isinstance(idempotency_retention, bool)
            or not isinstance(idempotency_retention, int | float)
            or not 0 < idempotency_retention < float("inf")
        ):
            raise EngineError(
                f"idempotency_retention must be a number of seconds > 0, "
                f"got {idempotency_retention!r}",
                code="idempotency_retention_invalid",
                field="idempotency_retention",
            )
        self.idempotency_retention = float(idempotency_retention)
        self.plugins = EngineRegistry()
        self.pipelines = PipelineRegistry()
        """Pipelines registered by name (:meth:`register_pipeline`)."""
        # The store implements several protocols at once (DagStore, DagWaitStore,
        # DagRetryStore, DagRunStore, OutputResolver, DagQueueStore); Python has
        # no intersection type, hence Any.
        self._store: Any = open_store(self.url, **store_options)
        self._capabilities = StoreCapabilities.of(self._store)
        self._wait_records: WaitRecordStore | None = self._capabilities.wait_records
        self._views = RunViews(self._store, self._capabilities)
        self._workers: list[Worker] = []
        self._schedulers: list[SchedulerThread] = []
        self._schedules: EngineSchedules | None = None
        if self._capabilities.schedules is not None:
            self._schedules = EngineSchedules(self._store, self.pipelines)
        self._closed = False

    # --- resources ---------------------------------------------------------------

    @property
    def store(self) -> Any:
        """The backend store; the low-level API (``claim_task(engine.store, ...)``) works on it."""
        return self._store

    @property
    def capabilities(self) -> StoreCapabilities:
        """The optional store protocols the backend store implements."""
        return self._capabilities

    def close(self) -> None:
        """Stop the workers this engine built and close the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            worker.stop()
        self._workers.clear()
        for scheduler in self._schedulers:
            scheduler.stop()
        self._schedulers.clear()
        closable = self._capabilities.closable
        if closable is not None:
            closable.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Engine({self.url!r})"

    # --- plugins -----------------------------------------------------------------

    def plugin(
        self,
        name: str,
        *,
        retry: RetryPolicy | None = None,
        timeout_seconds: float | None = None,
        cost: CostEstimateFn | float | int | None = None,
    ) -> Callable[[PluginFn], PluginFn]:
        """Decorator: register the function as plugin ``name`` on this engine.

        ``cost`` is the plugin's estimate for cost-limited runs (a number or
        a function of the task inputs); a node's ``cost_estimate`` wins."""
        return self.plugins.plugin(name, retry=retry, timeout_seconds=timeout_seconds, cost=cost)

    def load_plugins(self, modules: Iterable[str], *, base_dir: str | Path | None = None) -> None:
        """Import plugin modules (dotted names or ``.py`` files); see
        :func:`~dagwerk.engine.import_plugin_modules`."""
        import_plugin_modules(modules, base_dir=base_dir)

    def check_plugins(self, nodes: Sequence[DagNode] | Pipeline) -> None:
        """Raise :class:`~dagwerk.runtime.errors.UnknownPluginError` naming
        every node whose plugin this engine cannot resolve (registered here,
        with ``@dagwerk.plugin``, or an importable ``module:function``), with
        a "did you mean" for a close name. A pipeline's ``plugins`` modules
        are imported first. Resolving an import path also registers it, so
        this engine's workers serve it (a worker leases only tasks whose
        plugin it has)."""
        if isinstance(nodes, Pipeline):
            self.load_plugins(nodes.plugins, base_dir=Path(nodes.source).parent)
        problems = plugin_problems(
            nodes.nodes if isinstance(nodes, Pipeline) else nodes, self.plugins
        )
        if problems:
            raise UnknownPluginError(
                "; ".join(f"node {problem.slug!r}: {problem.reason}" for problem in problems),
                field="plugin",
            )

    # --- runs --------------------------------------------------------------------

    def submit(
        self,
        nodes: Sequence[DagNode] | Pipeline,
        input: Mapping[str, object] | None = None,
        run_id: str | None = None,
        failure_policy: FailurePolicy | str | None = None,
        budgets: Budget | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> str:
        """Store and start a run; returns its ID. Workers (here or elsewhere) do the work.

        With ``idempotency_key``, a repeat of the submit within the engine's
        ``idempotency_retention`` (from any process) creates nothing and
        returns the first run's ID; the same key with another pipeline,
        input, failure policy or budget raises
        :class:`IdempotencyConflictError` (its ``run_id`` is the first run).

        ``budgets`` (a :class:`~dagwerk.budgets.Budget`) limits the run's
        input and output bytes and cost; child runs draw on it too.

        For a :class:`~dagwerk.pipelines.loader.Pipeline`, ``input`` is laid
        over the pipeline's ``defaults``, ``failure_policy`` defaults to the
        pipeline's (otherwise to ``fail_fast``) and the run records the
        pipeline's name (``RunRecord.pipeline``). A ``run_id`` outside the safe
        alphabet (:mod:`dagwerk.identifiers`) raises ``InvalidIdentifierError``;
        an existing one raises :class:`RunExistsError`; invalid nodes or input raise ``ValueError``
        before anything is written.
        """
        if idempotency_key is not None:
            return self.submit_once(
                nodes,
                input,
                idempotency_key=idempotency_key,
                run_id=run_id,
                failure_policy=failure_policy,
                budgets=budgets,
            ).run_id
        node_list, run_input, policy, pipeline_name = self._prepare(nodes, input, failure_policy)
        run_id = check_identifier(run_id, field="run_id") if run_id is not None else new_run_id()
        submitted_ns = now_ns()
        if not self._store.create_run(
            run_id, node_list, run_input=run_input, failure_policy=policy, pipeline=pipeline_name
        ):
            raise RunExistsError(f"run {run_id!r} already exists", field="run_id")
        record_submit(self._capabilities.run_traces, run_id, submitted_ns)
        # The budget is set while the run is PENDING, so no task runs outside it.
        budget_store = self._capabilities.budgets
        if (
            budgets is not None
            and not budgets.is_empty()
            and (budget_store is None or not budget_store.try_set_run_budget(run_id, budgets))
        ):
            raise EngineError("the store cannot hold this run's budget", code="run_budget_refused")
        start_run(self._store, run_id, callbacks=_CALLBACKS)
        return run_id

    def _prepare(
        self,
        nodes: Sequence[DagNode] | Pipeline,
        input: Mapping[str, object] | None,
        failure_policy: FailurePolicy | str | None,
    ) -> tuple[list[DagNode], dict[str, object], FailurePolicy, str | None]:
        """A submit's nodes, merged input, policy and pipeline name, checked."""
        defaults: dict[str, object] = {}
        pipeline_name: str | None = None
        if isinstance(nodes, Pipeline):
            pipeline_name = nodes.name or None
            thawed = thaw_json(nodes.defaults)
            assert isinstance(thawed, dict)
            defaults = dict(thawed)
            policy = failure_policy if failure_policy is not None else nodes.failure_policy
            node_list = list(nodes.nodes)
        else:
            policy = failure_policy if failure_policy is not None else FailurePolicy.FAIL_FAST
            node_list = list(nodes)
        if input is not None and not isinstance(input, Mapping):
            raise EngineError("run input must be a JSON object", code="run_input_invalid")
        # Refuse a bad pipeline or a missing required input before anything is
        # stored: a run that can only fail at planning is a worse answer.
        validate_graph(node_list)
        schema_fields = get_pipeline_input_schema(node_list, _no_plugin_metadata)
        merged = thaw_json(merge_run_input(schema_fields, defaults, dict(input or {})))
        assert isinstance(merged, dict)
        run_input: dict[str, object] = dict(merged)
        return node_list, run_input, FailurePolicy(policy), pipeline_name

    def submit_once(
        self,
        nodes: Sequence[DagNode] | Pipeline,
        input: Mapping[str, object] | None = None,
        *,
        idempotency_key: str,
        run_id: str | None = None,
        failure_policy: FailurePolicy | str | None = None,
        budgets: Budget | None = None,
    ) -> SubmitOutcome:
        """:meth:`submit` with an idempotency key, saying whether this call
        created the run (``created``) or found the key's first run (a repeat,
        from any process, within ``idempotency_retention``). The same key with
        another pipeline, input, failure policy or budget raises
        :class:`IdempotencyConflictError`."""
        node_list, run_input, policy, pipeline_name = self._prepare(nodes, input, failure_policy)
        run_id = check_identifier(run_id, field="run_id") if run_id is not None else new_run_id()
        new = NewRun(run_id, tuple(node_list), run_input, policy, pipeline_name)
        return self._submit_once(idempotency_key, new, budgets)

    def _submit_once(self, key: str, run: NewRun, budgets: Budget | None) -> SubmitOutcome:
        store = self._capabilities.idempotent_submits
        if store is None:
            raise UnsupportedOperationError(
                "this store cannot keep idempotency keys (it does not implement "
                "IdempotentSubmitStore)"
            )
        if not isinstance(key, str) or not key:
            raise EngineError(
                "idempotency_key must be a non-empty string",
                code="idempotency_key_invalid",
                field="idempotency_key",
            )
        fingerprint = submit_fingerprint(run, budgets)
        try:
            found = store.create_run_once(
                key, fingerprint, run, retention=self.idempotency_retention
            )
        except InvalidStoreValueError as error:
            if error.field == "run_id" and self._store.get_run_status(run.run_id) is not None:
                raise RunExistsError(f"run {run.run_id!r} already exists", field="run_id") from None
            raise
        if not found.created and found.fingerprint != fingerprint:
            raise IdempotencyConflictError(
                f"idempotency key {key!r} already names run {found.run_id}, submitted with "
                "another pipeline or input; use a new key for a different run",
                run_id=found.run_id,
            )
        # A repeat finds the run PENDING when its first submit stopped before
        # starting it: the repeat finishes the job (same budget, by fingerprint).
        if self._store.get_run_status(found.run_id) is RunStatus.PENDING:
            if budgets is not None and not budgets.is_empty():
                budget_store = self._capabilities.budgets
                if budget_store is None or not (
                    budget_store.try_set_run_budget(found.run_id, budgets)
                    or budget_store.get_run_budget(found.run_id)
                ):
                    raise EngineError(
                        "the store cannot hold this run's budget", code="run_budget_refused"
                    )
            with contextlib.suppress(RunStartRejectedError):  # cancelled meanwhile
                start_run(self._store, found.run_id, callbacks=_CALLBACKS)
        return SubmitOutcome(found.run_id, found.created)

    def wait(
        self,
        run_id: str,
        timeout: float | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        faults: FaultGate | None = None,
        fail_on_fault: float | None = None,
    ) -> RunResult:
        """Block until the run is terminal and return its result.

        Needs workers running somewhere. ``on_progress`` receives a
        :class:`RunProgress` at every poll. Past ``timeout`` seconds it raises
        :class:`RunWaitTimeoutError`; the run itself is never touched.

        With the ``faults`` of the worker that serves the run, the progress
        carries the store fault it waits out, a transient fault of a read
        here is waited out too, a fatal fault of the worker is raised, and
        a fault that lasted ``fail_on_fault`` seconds raises
        :class:`~dagwerk.runtime.faults.FaultLastedError`.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = threading.Event()
        while True:
            status: RunStatus | None = None
            read_at = time.monotonic()
            try:
                status = self._poll(run_id, on_progress, faults)
            except StoreUnavailableError as error:
                if faults is None or classify(error) is not FaultKind.TRANSIENT:
                    raise
                faults.note(error, f"reading run {run_id}")
            if faults is not None:
                _check_faults(faults, fail_on_fault)
            if status in RUN_TERMINAL_STATUSES:
                return self.result(run_id)
            if deadline is not None and time.monotonic() >= deadline:
                still = "unreadable" if status is None else status.value
                raise RunWaitTimeoutError(
                    f"run {run_id!r} is still {still} after {timeout}s",
                    field="timeout",
                )
            self._pause(pause, read_at)

    def _pause(self, pause: threading.Event, read_at: float) -> None:
        """Between two reads of :meth:`wait`: the poll interval, or less once
        the store says it may have changed (``ChangeWaitStore``), but
        at least ``MIN_READ_GAP`` after the last read began."""
        changes = self._capabilities.changes
        if changes is None:
            pause.wait(self.poll_interval)
            return
        changes.wait_for_change(self.poll_interval)
        rest = read_at + MIN_READ_GAP - time.monotonic()
        if rest > 0:
            pause.wait(rest)

    def _poll(
        self, run_id: str, on_progress: ProgressCallback | None, faults: FaultGate | None
    ) -> RunStatus:
        if on_progress is None:
            found: RunStatus | None = self._store.get_run_status(run_id)
            if found is None:
                raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
            return found
        progress = self.progress(run_id)
        fault = None if faults is None else faults.current
        if faults is not None and fault is not None:
            progress = dataclasses.replace(
                progress, fault=fault.line, fault_seconds=fault.lasted(faults.now())
            )
        on_progress(progress)
        return progress.status

    def run(
        self,
        nodes: Sequence[DagNode] | Pipeline,
        input: Mapping[str, object] | None = None,
        *,
        workers: int = 2,
        timeout: float | None = None,
        run_id: str | None = None,
        failure_policy: FailurePolicy | str | None = None,
        executor: str = "thread",
        on_progress: ProgressCallback | None = None,
        budgets: Budget | None = None,
        queues: Sequence[str] | None = None,
        fail_on_fault: float | None = None,
    ) -> RunResult:
        """Submit the run and work it in this process until it is terminal.

        A worker with ``workers`` slots serves the queue while the run lasts
        and stops afterwards: it leases this run's tasks first, then any other
        task of ``queues`` (``None``: every queue) whose plugin it has (other
        runs' tasks it picked up are released for other workers). A
        pipeline's ``plugins`` modules are imported first, and every node's
        plugin must resolve (:meth:`check_plugins`) before anything is
        stored. Raises :class:`RunWaitTimeoutError` after ``timeout``
        seconds, leaving the run as it is. The worker waits out a transient
        store fault (the progress names it); a fatal one is raised, and one
        that lasted ``fail_on_fault`` seconds raises
        :class:`~dagwerk.runtime.faults.FaultLastedError` (see :meth:`wait`).
        """
        self.check_plugins(nodes)
        run_id = self.submit(
            nodes, input, run_id=run_id, failure_policy=failure_policy, budgets=budgets
        )
        worker = self.worker(
            concurrency=workers,
            executor=executor,
            prefer_run=run_id,
            queues=None if queues is None else list(queues),
        )
        # The fatal fault is raised to the caller, who says it.
        worker.faults.report_fatal = False
        worker.start()
        try:
            return self.wait(
                run_id,
                timeout,
                on_progress=on_progress,
                faults=worker.faults,
                fail_on_fault=fail_on_fault,
            )
        finally:
            worker.stop()
            self._workers.remove(worker)

    def cancel(self, run_id: str, reason: str | None = None) -> bool:
        """Cancel a PENDING or RUNNING run; whether this call cancelled it."""
        self._require_run(run_id)
        # The child runs still open end with it: each gets its span too.
        open_children = self._open_descendants(run_id)
        cancelled = cancel_run(self._store, run_id, callbacks=_CALLBACKS, reason=reason)
        if cancelled:
            traces = self._capabilities.run_traces
            record_run_end(traces, self._store, run_id, "cancelled")
            for child in open_children:
                record = self._store.get_run(child)
                if record is not None and record.status is RunStatus.CANCELLED:
                    record_run_end(traces, self._store, child, "cancelled")
        return cancelled

    def _open_descendants(self, run_id: str) -> list[str]:
        """The child runs of ``run_id`` (and theirs) not yet terminal."""
        children = self._capabilities.children
        if children is None:
            return []
        found: list[str] = []
        pending = list(children.list_child_runs(run_id))
        while pending:
            child = pending.pop()
            record = self._store.get_run(child)
            if record is None or record.status in RUN_TERMINAL_STATUSES:
                continue
            found.append(child)
            pending.extend(children.list_child_runs(child))
        return found

    def retry(self, run_id: str, boundary: Sequence[str] | None = None) -> RunRetryResult:
        """Reopen a FAILED, CRASHED or CANCELLED run and queue the affected work.

        ``boundary`` (node slugs) asserts which failed nodes to retry from;
        the store derives the affected nodes and their descendants. Raises
        :class:`~dagwerk.retry.RetryRejectedError` when the run cannot retry.
        """
        indices = None if boundary is None else self._indices(run_id, boundary)
        try:
            result = retry_run(self._store, run_id, indices)
        except RetryRejectedError as error:
            refusal = self._retry_refusal(run_id, indices)
            raise RetryRejectedError(refusal, field="run_id") from error
        reconcile_run(self._store, run_id, callbacks=_CALLBACKS)
        return result

    def _retry_refusal(self, run_id: str, indices: Sequence[int] | None) -> str:
        # Read after the refusal, so the message describes the state that refused.
        record: RunRecord | None = self._store.get_run(run_id)
        if record is None:
            return f"run {run_id!r} does not exist"
        prefix = f"run {run_id!r} cannot be retried"
        status = record.status
        if status is RunStatus.COMPLETED:
            return (
                f"{prefix}: it completed; to run nodes of a completed run again use "
                f"rerun (dagwerk rerun {run_id} --node SLUG)"
            )
        if status not in RUN_TERMINAL_STATUSES:
            return (
                f"{prefix}: it is still {status.value}; only a failed, crashed or cancelled "
                f"run can be retried (dagwerk cancel {run_id} stops it)"
            )
        if indices is None:
            return f"{prefix}: the store refused it (the run changed meanwhile; look again)"
        if status is RunStatus.CANCELLED:
            return (
                f"{prefix} from chosen nodes: it was cancelled, and retrying from nodes "
                "applies to failed or crashed runs; retry it without naming nodes"
            )
        nodes = self.nodes(run_id)
        failed = self._failed_nodes(run_id)
        named = ", ".join(nodes[index].slug for index in sorted(failed)) or "none"
        for index in indices:
            if index not in failed:
                return (
                    f"{prefix} from node {nodes[index].slug!r}: it did not fail "
                    f"(failed nodes: {named})"
                )
        return f"{prefix}: the store refused it (the run changed meanwhile; look again)"

    def _failed_nodes(self, run_id: str) -> set[int]:
        """Indices of active nodes that failed: at planning or in a failed or crashed task."""
        launches: Mapping[int, NodeLaunch] = self._store.list_node_launches(run_id)
        failed = {
            index
            for index, launch in launches.items()
            if launch.disposition is NodeDisposition.FAILED
        }
        failed.update(
            task.node_index
            for task in self.list_tasks(run_id)
            if task.status in (TaskStatus.FAILED, TaskStatus.CRASHED)
        )
        return failed

    def rerun(self, run_id: str, nodes: Sequence[str]) -> RunRetryResult:
        """Run the named nodes and all their descendants again as a new
        generation, also for a COMPLETED run; returns what the re-run committed.

        Raises :class:`UnsupportedOperationError` for a store that does not
        implement :class:`~dagwerk.store.NodeRerunStore`.
        """
        indices = self._indices(run_id, nodes)
        store = self._capabilities.rerun
        if store is None:
            raise UnsupportedOperationError(
                "this store cannot re-run nodes (it does not implement NodeRerunStore)"
            )
        result = rerun_nodes(store, run_id, indices)
        reconcile_run(self._store, run_id, callbacks=_CALLBACKS)
        return result

    def resume(self, task_id: str, wait_id: str, response: object = None) -> TaskResumeResult:
        """Resolve the task's wait ``wait_id``; a new attempt is queued for any worker.

        ``response`` (JSON) is stored with the wait for the resumed attempt to
        read. The resume is fenced by the attempt that entered the wait, read
        from the store's record of the wait, so an exact repeat (same task and
        wait ID) returns the first result and queues nothing, also after the
        resumed attempt has run or the run has changed since; the first
        response stays and a repeat's ``response`` is ignored.

        Raises :class:`ResumeRejectedError` (nothing changed) for an unknown
        task, a wait ID the task never waited on, a wait invalidated before it
        was resumed (its run was cancelled or failed, or its node re-run), or
        a wait the store refuses to resume for another reason (the message
        gives the task's status). ``ValueError`` for a malformed wait ID.

        A store without :class:`~dagwerk.store.WaitRecordStore` is asked with
        the task's current attempt: there only the first resume succeeds.
        """
        validate_wait_id(wait_id)
        task = self._store.get_task(task_id)
        if task is None:
            raise ResumeRejectedError(f"task {task_id!r} does not exist", field="task_id")
        attempt_id, generation = task.attempt_id, task.generation
        if self._wait_records is not None:
            wait = self._wait_records.get_wait(task_id, wait_id)
            if wait is None:
                raise ResumeRejectedError(self._resume_refusal(task_id, wait_id), field="wait_id")
            attempt_id, generation = wait.attempt_id, wait.generation
        result = resume_task(
            self._store,
            task_id,
            wait_id,
            expected_attempt_id=attempt_id,
            expected_generation=generation,
            response=response,
        )
        if result is None:
            raise ResumeRejectedError(self._resume_refusal(task_id, wait_id), field="wait_id")
        return result

    def _resume_refusal(self, task_id: str, wait_id: str) -> str:
        # Read after the refusal, so the message describes the state that refused.
        task: TaskRecord | None = self._store.get_task(task_id)
        wait = None if self._wait_records is None else self._wait_records.get_wait(task_id, wait_id)
        prefix = f"task {task_id!r} cannot be resumed under {wait_id!r}"
        if wait is not None and wait.invalidated:
            return (
                f"{prefix}: the wait was invalidated before it was resumed "
                "(its run was cancelled or failed, or its node re-run)"
            )
        if task is None:
            return f"task {task_id!r} does not exist"
        waiting = f" (waiting on {task.active_wait_id!r})" if task.active_wait_id else ""
        if self._wait_records is not None and wait is None:
            return f"{prefix}: the task never waited on it{waiting}"
        return f"{prefix}: it is {task.status.value}{waiting}"

    # --- workers -----------------------------------------------------------------

    def worker(
        self, concurrency: int = DEFAULT_CONCURRENCY, executor: str = "thread", **options: Any
    ) -> Worker:
        """A :class:`~dagwerk.runtime.worker.Worker` on this engine's store and
        plugins (not started). ``options`` go to ``Worker`` (``lease_seconds``,
        ``default_timeout``, ``worker_id``, ...). ``close`` stops it."""
        options.setdefault("execution_root", self.execution_root)
        options.setdefault("poll_interval", max(self.poll_interval, 0.05))
        options.setdefault("backstop_interval", self.backstop_interval)
        options.setdefault("schedule_interval", self.schedule_interval)
        worker = Worker(
            self._store, self.plugins, concurrency=concurrency, executor=executor, **options
        )
        self._workers.append(worker)
        return worker


def _check_faults(faults: FaultGate, fail_on_fault: float | None) -> None:
    """Raise the worker's fatal fault, or a fault that lasted ``fail_on_fault`` s."""
    if faults.fatal is not None:
        raise faults.fatal
    faults.check_lasted(fail_on_fault)
