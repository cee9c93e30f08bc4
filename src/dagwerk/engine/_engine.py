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
import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dagwerk.budgets import AccountUsage, Budget
from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import (
    RUN_TERMINAL_STATUSES,
    FailurePolicy,
    NodeDisposition,
    RunStatus,
    TaskStatus,
)
from dagwerk.errors import DagwerkError
from dagwerk.graph import validate_graph
from dagwerk.identifiers import check_identifier
from dagwerk.json import canonical_json_bytes, thaw_json
from dagwerk.lineage import RunLink
from dagwerk.models import DagNode, NodeLaunch, ResolvedOutput
from dagwerk.orchestrator import (
    OrchestratorCallbacks,
    RunStartRejectedError,
    cancel_run,
    reconcile_run,
    start_run,
)
from dagwerk.pipelines.loader import Pipeline, load_pipeline
from dagwerk.plugins import PluginMeta
from dagwerk.retry import RetryRejectedError, RunRetryResult, rerun_nodes, retry_run
from dagwerk.runtime.backstop import (
    DEFAULT_BACKSTOP_INTERVAL,
    Backstop,
    check_backstop_interval,
    diagnose_stored_run,
)
from dagwerk.runtime.errors import UnknownPluginError
from dagwerk.runtime.plugins import CostEstimateFn, PluginFn
from dagwerk.runtime.retention import RetentionSummary, delete_runs
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.worker import Worker
from dagwerk.scheduling.definitions import DEFAULT_CATCHUP_LIMIT, CatchupPolicy, OverlapPolicy
from dagwerk.scheduling.scheduler import (
    DEFAULT_SCHEDULE_INTERVAL,
    SchedulerThread,
    check_schedule_interval,
    start_scheduler,
)
from dagwerk.schema import get_pipeline_input_schema, merge_run_input
from dagwerk.stall import RunDiagnosis
from dagwerk.store import (
    DeadLetter,
    InvalidStoreValueError,
    NodeTaskStats,
    RunCursor,
    RunPage,
    RunRecord,
    StallRecord,
    TaskJournal,
    TaskRecord,
    TaskResumeResult,
    TaskWait,
    WaitRecordStore,
    WorkerRecord,
    validate_wait_id,
)
from dagwerk.store_logs import TaskLogLine
from dagwerk.store_retention import DEFAULT_RETENTION_BATCH
from dagwerk.store_schedules import NewRun, ScheduleFire, ScheduleRecord
from dagwerk.tracing import now_ns, record_submit
from dagwerk.waiting import resume_task

from ._logs import read_logs
from ._plugins import EngineRegistry, import_plugin_modules, plugin_problems
from ._results import (
    MAX_TREE_RUNS,
    RunLineage,
    RunNotFoundError,
    RunProgress,
    RunResult,
    read_lineage,
    read_progress,
    read_result,
)
from ._schedules import (
    BackfillProgress,
    BackfillReport,
    EngineSchedules,
    PipelineRegistry,
    SyncReport,
)
from ._urls import DEFAULT_URL, open_store
from ._views import RunViews

if TYPE_CHECKING:
    from dagwerk.health import HealthState
    from dagwerk.metrics import Metrics

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


class EngineError(DagwerkError):
    """Root of the engine facade's own errors."""

    code = "engine_error"


class RunExistsError(EngineError, ValueError):
    """``submit`` was given a run ID that already exists."""

    code = "run_exists"


class UnknownNodeError(EngineError, ValueError):
    """A node slug does not name a node of the run."""

    code = "node_unknown"


class RunWaitTimeoutError(EngineError, TimeoutError):
    """The run did not reach a terminal state in time; it is left as it is."""

    code = "run_wait_timeout"


class ResumeRejectedError(EngineError, RuntimeError):
    """The task cannot be resumed under that wait ID (nothing changed)."""

    code = "resume_rejected"


class UnsupportedOperationError(EngineError, RuntimeError):
    """The engine's store does not implement the operation."""

    code = "store_operation_unsupported"


class IdempotencyConflictError(EngineError, ValueError):
    """An idempotency key already names a run of another pipeline or input."""

    code = "idempotency_conflict"

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message, field="idempotency_key")
        self.run_id = run_id


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


class Engine:
    """A store opened from ``url``, a plugin registry, and workers bound to both.

    ``url`` is ``sqlite:///path.db`` (``None``: ``sqlite:///dagwerk.db`` in the
    current directory), ``memory://`` or ``postgresql://...``; ``store_options``
    go to the store (``limits``, ``max_deliveries``, ...). ``execution_root``
    is where plugins run (default: the current directory, made absolute);
    ``poll_interval`` is how often ``wait`` reads the run and how long an idle
    in-process worker sleeps at most. ``backstop_interval`` is the seconds
    between the gated-dispatch backstop passes of the workers this engine
    builds, ``run`` included (default 30; ``None`` or 0 disables them).
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
    ) -> RunResult:
        """Block until the run is terminal and return its result.

        Needs workers running somewhere. ``on_progress`` receives a
        :class:`RunProgress` at every poll. Past ``timeout`` seconds it raises
        :class:`RunWaitTimeoutError`; the run itself is never touched.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = threading.Event()
        while True:
            if on_progress is not None:
                progress = self.progress(run_id)
                on_progress(progress)
                status = progress.status
            else:
                found = self._store.get_run_status(run_id)
                if found is None:
                    raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
                status = found
            if status in RUN_TERMINAL_STATUSES:
                return self.result(run_id)
            if deadline is not None and time.monotonic() >= deadline:
                raise RunWaitTimeoutError(
                    f"run {run_id!r} is still {status.value} after {timeout}s",
                    field="timeout",
                )
            pause.wait(self.poll_interval)

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
    ) -> RunResult:
        """Submit the run and work it in this process until it is terminal.

        A worker with ``workers`` slots serves the queue while the run lasts
        and stops afterwards: it leases this run's tasks first, then any other
        task of ``queues`` (``None``: every queue) whose plugin it has (other
        runs' tasks it picked up are released for other workers). A
        pipeline's ``plugins`` modules are imported first, and every node's
        plugin must resolve (:meth:`check_plugins`) before anything is
        stored. Raises :class:`RunWaitTimeoutError` after ``timeout``
        seconds, leaving the run as it is.
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
        worker.start()
        try:
            return self.wait(run_id, timeout, on_progress=on_progress)
        finally:
            worker.stop()
            self._workers.remove(worker)

    def cancel(self, run_id: str, reason: str | None = None) -> bool:
        """Cancel a PENDING or RUNNING run; whether this call cancelled it."""
        self._require_run(run_id)
        return cancel_run(self._store, run_id, callbacks=_CALLBACKS, reason=reason)

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

    def worker(self, concurrency: int = 4, executor: str = "thread", **options: Any) -> Worker:
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

    # --- inspection --------------------------------------------------------------

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run's record, or ``None``."""
        record: RunRecord | None = self._store.get_run(run_id)
        return record

    def result(self, run_id: str) -> RunResult:
        """The run's status, error and published outputs, whatever its state."""
        return read_result(self._store, run_id)

    def progress(self, run_id: str) -> RunProgress:
        """Node and task counts of the run's active generation."""
        return read_progress(self._store, run_id)

    def nodes(self, run_id: str) -> list[DagNode]:
        """The node definitions stored with the run."""
        nodes: list[DagNode] | None = self._store.get_run_nodes(run_id)
        if nodes is None:
            raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
        return nodes

    def node_launches(self, run_id: str) -> Mapping[int, NodeLaunch]:
        """The launches of the run's active generation, keyed by node index
        (a node that has not been planned yet has none)."""
        self._require_run(run_id)
        launches: Mapping[int, NodeLaunch] = self._store.list_node_launches(run_id)
        return launches

    def diagnose(self, run_id: str) -> RunDiagnosis:
        """Why each node of the run has or has not run, and whether the run is
        stalled, read from the store's durable state (``dagwerk show --why``).
        Read-only."""
        diagnosis = diagnose_stored_run(self._store, run_id)
        if diagnosis is None:
            raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
        return diagnosis

    def lineage(self, run_id: str, *, max_runs: int = MAX_TREE_RUNS) -> RunLineage:
        """The run's link to the task that started it (``None``: a root run)
        and the tree of child runs started under it, with at most
        ``max_runs`` runs in all.

        Raises :class:`UnsupportedOperationError` for a store that keeps no
        child runs (it does not implement :class:`~dagwerk.store.DagChildStore`).
        """
        self._require_run(run_id)
        children = self._capabilities.children
        if children is None:
            raise UnsupportedOperationError(
                "this store keeps no child runs (it does not implement DagChildStore)"
            )
        return read_lineage(self._store, children, run_id, max_runs=max_runs)

    def budget_usage(self, run_id: str) -> tuple[AccountUsage, ...]:
        """What every budget account the run draws on has used: its own
        account first, then its ancestors'. Empty for a run without budgets
        and on a store without budgets."""
        self._require_run(run_id)
        budgets = self._capabilities.budgets
        return () if budgets is None else tuple(budgets.get_run_budget(run_id))

    def list_runs(
        self,
        status: RunStatus | str | None = None,
        limit: int = 50,
        *,
        schedule: str | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first, optionally only those with ``status``; with
        ``schedule``, only that schedule's runs (scheduled and backfilled),
        newest tick first."""
        runs = self._capabilities.runs
        if runs is None:
            raise UnsupportedOperationError(
                "this store cannot list runs (it does not implement DagRunStore)"
            )
        wanted = RunStatus(status) if status is not None else None
        if schedule is not None:
            return self._schedule_runs(schedule, wanted, limit)
        return runs.list_runs(status=wanted, limit=limit)

    def _schedule_runs(self, name: str, status: RunStatus | None, limit: int) -> list[RunRecord]:
        schedules = self._require_schedules()
        record = schedules.get(name)
        found: list[RunRecord] = []
        until: int | None = None
        while len(found) < limit:
            page = schedules.store.list_schedule_fires(record.schedule_id, limit=500, until=until)
            for fire in page:
                run = None if fire.run_id is None else self.get_run(fire.run_id)
                if run is not None and (status is None or run.status is status):
                    found.append(run)
                    if len(found) == limit:
                        break
            if len(page) < 500:
                break
            until = page[-1].tick - 1
        return found

    def list_tasks(self, run_id: str, *, include_invalidated: bool = False) -> list[TaskRecord]:
        """The run's tasks in creation order (active generation unless asked)."""
        self._require_run(run_id)
        tasks: list[TaskRecord] = self._store.list_tasks(
            run_id, include_invalidated=include_invalidated
        )
        return tasks

    def list_attempts(self, task_id: str) -> list[Any]:
        """The task's attempts, oldest first (needs a ``DagRunStore``)."""
        runs = self._capabilities.runs
        if runs is None:
            raise UnsupportedOperationError(
                "this store cannot list attempts (it does not implement DagRunStore)"
            )
        return list(runs.list_attempts(task_id))

    def task_journals(self, run_id: str) -> Mapping[str, TaskJournal]:
        """What the run's tasks recorded (``ctx.step`` results, waits with
        their responses, child runs), keyed by task ID, for the tasks that
        recorded a step or a wait; empty on a store that keeps no such
        records (no :class:`~dagwerk.store.DurableTaskStore`)."""
        durable = self._capabilities.durable
        return {} if durable is None else durable.list_run_journals(run_id)

    def task_journal(self, task_id: str) -> TaskJournal | None:
        """What one task recorded (``ctx.step`` results, waits with their
        responses, child runs) in its current generation; ``None`` for an
        unknown task or a store that keeps no such records."""
        durable = self._capabilities.durable
        return None if durable is None else durable.get_task_journal(task_id)

    def list_stalls(self) -> list[StallRecord]:
        """The stalls a backstop recorded, oldest detection first (none on a
        store that records no stalls)."""
        backstop = self._capabilities.backstop
        return [] if backstop is None else backstop.list_stalls()

    def list_dead_letters(self, run_id: str | None = None) -> list[DeadLetter]:
        """Dead letters in the order they were parked (re-injected ones included)."""
        letters: list[DeadLetter] = self._store.list_dead_letters(run_id)
        return letters

    # --- retention ---------------------------------------------------------------

    def delete_runs(
        self,
        older_than: float | timedelta | str,
        *,
        statuses: Collection[RunStatus | str] | None = None,
        dry_run: bool = False,
        batch_size: int = DEFAULT_RETENTION_BATCH,
    ) -> RetentionSummary:
        """Delete every run that finished more than ``older_than`` ago (seconds,
        a timedelta or an age such as ``"30d"``) with one of ``statuses``
        (default: every terminal status), with everything stored for it.

        A parent takes its child runs with it; a child is deleted only with
        its parent, and a lineage only when all its runs are terminal. Deletes
        ``batch_size`` runs per transaction, so workers keep running; safe to
        call from several processes at once. ``dry_run`` deletes nothing and
        counts the runs it would delete."""
        retention = self._capabilities.retention
        if retention is None:
            raise UnsupportedOperationError("this store cannot delete runs")
        return delete_runs(
            retention,
            older_than=older_than,
            statuses=statuses,
            dry_run=dry_run,
            batch_size=batch_size,
        )

    def logs(
        self,
        run_id: str,
        *,
        task_id: str | None = None,
        node: str | None = None,
        attempt: int | None = None,
        after: int = 0,
        limit: int | None = None,
    ) -> list[TaskLogLine]:
        """The lines the run's plugins logged, in stored order: of one task,
        one node (its slug) and one attempt number where given, after the line
        whose ``line_id`` is ``after`` (to follow a running run), at most
        ``limit`` of them. Needs a store that keeps task logs (every built-in one)."""
        store = self._capabilities.task_logs
        if store is None:
            raise UnsupportedOperationError("this store keeps no task logs")
        self._require_run(run_id)
        node_index = None if node is None else self._indices(run_id, [node])[0]
        return read_logs(
            store,
            run_id,
            task_id=task_id,
            node_index=node_index,
            attempt=attempt,
            after=after,
            limit=limit,
        )

    def monitoring(self, backstop: Backstop | None = None) -> tuple[Metrics, HealthState]:
        """The Prometheus metrics (``/metrics``) and the health state
        (``/healthz``) of this engine's store, for a server to expose; give
        both to the workers it runs as observers. ``backstop`` is the pass
        whose age the health state checks."""
        from dagwerk.health import HealthState
        from dagwerk.metrics import Metrics

        return Metrics(store=self._store), HealthState(self._store, backstop=backstop)

    def reinject(self, dead_letter_id: str) -> str | None:
        """Give a dead letter's task a fresh attempt; the new attempt ID or ``None``."""
        attempt: str | None = self._store.reinject_dead_letter(dead_letter_id)
        return attempt

    # --- pipelines and schedules -------------------------------------------------

    def register_pipeline(
        self, pipeline: Pipeline | Sequence[DagNode], name: str | None = None
    ) -> Pipeline:
        """Register a pipeline under ``name`` (default: its own name), so
        schedules (and other callers of :meth:`resolve_pipeline`) can name it."""
        return self.pipelines.register(pipeline, name)

    def resolve_pipeline(self, reference: str) -> Pipeline:
        """The pipeline registered as ``reference``, else the pipeline file at
        that path. Raises :class:`~dagwerk.engine.UnknownPipelineError`."""
        return self.pipelines.resolve(reference)[1]

    def schedule(
        self,
        name: str,
        pipeline: str | Pipeline,
        *,
        cron: str | None = None,
        every: str | int | float | None = None,
        input: Mapping[str, object] | None = None,
        timezone: str = "UTC",
        start: object = None,
        end: object = None,
        catchup: CatchupPolicy | str = CatchupPolicy.SKIP,
        catchup_limit: int = DEFAULT_CATCHUP_LIMIT,
        overlap: OverlapPolicy | str = OverlapPolicy.ALLOW,
        replace: bool = False,
    ) -> ScheduleRecord:
        """Store a schedule that starts a run of ``pipeline`` (a registered
        name, a pipeline file path or a :class:`Pipeline`) at each tick of
        ``cron`` (5 fields or ``@hourly``-style) or ``every`` (``30s``, ``2h``).

        Each run's input is the pipeline's defaults under ``input``, with
        ``scheduled_for`` set to the tick (ISO 8601 with the zone's offset).
        ``timezone`` is an IANA zone for the cron expression; ``start`` and
        ``end`` bound the ticks (dates or times, wall time in that zone).
        ``catchup`` says which ticks missed while nothing was scheduling still
        fire (``skip``, ``latest``, ``all`` up to ``catchup_limit``);
        ``overlap`` what a tick does while an earlier run of the schedule is
        unfinished (``allow``, ``skip``, ``cancel_previous``). The pipeline is
        kept as it is now; add again with ``replace=True`` (or sync the file)
        to change it. An existing name raises
        :class:`~dagwerk.engine.ScheduleExistsError` unless ``replace``.
        """
        schedules = self._require_schedules()
        definition = schedules.definition(
            name,
            pipeline,
            cron=cron,
            every=every,
            input=input,
            timezone=timezone,
            start=start,
            end=end,
            catchup=catchup,
            catchup_limit=catchup_limit,
            overlap=overlap,
        )
        return schedules.put(definition, replace=replace)

    def get_schedule(self, name: str) -> ScheduleRecord:
        """The schedule ``name``; :class:`~dagwerk.engine.ScheduleNotFoundError` if none."""
        return self._require_schedules().get(name)

    def list_schedules(self) -> list[ScheduleRecord]:
        """Every schedule, by name."""
        return self._require_schedules().store.list_schedules()

    def pause_schedule(self, name: str) -> ScheduleRecord:
        """Stop the schedule's ticks (idempotent)."""
        return self._require_schedules().set_paused(name, True)

    def resume_schedule(self, name: str) -> ScheduleRecord:
        """Start the schedule's ticks again from now; ticks of the pause do not fire."""
        return self._require_schedules().set_paused(name, False)

    def delete_schedule(self, name: str) -> None:
        """Delete the schedule and its tick records; its runs stay."""
        self._require_schedules().delete(name)

    def next_ticks(self, name: str, count: int = 5, *, after: float | None = None) -> list[int]:
        """The schedule's next ``count`` ticks after ``after`` (default: now),
        as epoch seconds."""
        return self._require_schedules().next_ticks(name, count, after)

    def schedule_fires(self, name: str, limit: int = 20) -> list[ScheduleFire]:
        """The schedule's newest tick records (with their run IDs), newest first."""
        return self._require_schedules().fires(name, limit)

    def run_schedule(self, run_id: str) -> ScheduleFire | None:
        """The tick record of a scheduled or backfilled run, else ``None``."""
        schedules = self._capabilities.schedules
        return None if schedules is None else schedules.get_run_fire(run_id)

    def sync_schedules(self, pipeline: str | Pipeline) -> SyncReport:
        """Apply a pipeline file's ``schedules:``: add new ones, replace
        changed ones (keeping their tick records); others are left alone."""
        schedules = self._require_schedules()
        found = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)
        return schedules.sync(found)

    def backfill(
        self,
        name: str,
        start: object,
        end: object,
        *,
        max_active: int = 4,
        timeout: float | None = None,
        on_progress: Callable[[BackfillProgress], None] | None = None,
    ) -> BackfillReport:
        """Create one run per tick of the schedule in ``[start, end]`` that
        has none yet (a date alone as ``end`` covers that whole day), keeping
        at most ``max_active`` of them unfinished, and return when all are
        finished; workers elsewhere do the work. Running it again creates no
        tick's run twice."""
        return self._require_schedules().backfill(
            name,
            start,
            end,
            max_active=max_active,
            poll_interval=max(self.poll_interval, 0.05),
            timeout=timeout,
            on_progress=on_progress,
        )

    def start_scheduler(self, *, interval: float | None = None, **options: Any) -> SchedulerThread:
        """Take part in scheduling from this engine's process (``dagwerk
        serve`` does); workers built by :meth:`worker` already do. ``close``
        stops it. ``options`` go to :class:`~dagwerk.scheduling.Scheduler`."""
        self._require_schedules()
        thread = start_scheduler(
            self._store,
            interval=interval or self.schedule_interval or DEFAULT_SCHEDULE_INTERVAL,
            **options,
        )
        self._schedulers.append(thread)
        return thread

    def _require_schedules(self) -> EngineSchedules:
        if self._schedules is None:
            raise UnsupportedOperationError(
                "this store cannot keep schedules (it does not implement ScheduleStore)"
            )
        return self._schedules

    # --- views (the dashboard's reads; RunViewStore) -------------------------------

    def list_runs_page(
        self,
        *,
        status: RunStatus | str | None = None,
        pipeline: str | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        after: RunCursor | str | None = None,
        limit: int = 50,
    ) -> RunPage:
        """One page of runs, newest first, filtered by status, pipeline name
        and creation time (``created_after`` inclusive, ``created_before``
        exclusive, epoch seconds). ``after`` is an earlier page's ``next``
        (or its :meth:`~dagwerk.store.RunCursor.encode` token); keyset
        paging, so a page costs the same however deep it is. Bad filters raise
        :class:`~dagwerk.store.InvalidStoreValueError` naming the field."""
        return self._views.runs_page(
            status=status,
            pipeline=pipeline,
            created_after=created_after,
            created_before=created_before,
            after=after,
            limit=limit,
        )

    def run_status_counts_since(self, since: float) -> Mapping[RunStatus, int]:
        """How many runs created at or after ``since`` are in each status."""
        return self._views.run_status_counts_since(since)

    def run_task_counts(self, run_ids: Sequence[str]) -> Mapping[str, Mapping[TaskStatus, int]]:
        """Task counts by status of each run's active generation (unknown runs absent)."""
        return self._views.run_task_counts(run_ids)

    def node_stats(self, run_id: str) -> list[NodeTaskStats]:
        """Per launched node: its launch's disposition, task counts by
        status, attempts and time span."""
        return self._views.node_stats(run_id)

    def list_tasks_page(
        self,
        run_id: str,
        *,
        node: str | None = None,
        status: TaskStatus | str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> list[TaskRecord]:
        """Up to ``limit`` tasks of the run's active generation in creation
        order, of node ``node`` (a slug) and ``status`` when given, after the
        task ID ``after``."""
        index = None if node is None else self._indices(run_id, [node])[0]
        return self._views.tasks_page(
            run_id, node_index=index, status=status, after=after, limit=limit
        )

    def get_task(self, task_id: str) -> TaskRecord | None:
        """The task's record (invalidated tasks included), or ``None``."""
        task: TaskRecord | None = self._store.get_task(task_id)
        return task

    def task_waits(self, task_id: str) -> list[TaskWait]:
        """Every wait the task entered, oldest first, with its state and response."""
        return self._views.task_waits(task_id)

    def task_outputs(self, task_id: str) -> list[ResolvedOutput]:
        """The outputs the task published under the runtime's IDs (``TASK_ID/N``)."""
        return self._views.task_outputs(task_id)

    def node_outputs(
        self, run_id: str, node_index: int, *, limit: int = 20
    ) -> list[ResolvedOutput]:
        """The first ``limit`` outputs node ``node_index`` published (active generation)."""
        return self._views.node_outputs(run_id, node_index, limit)

    def run_input(self, run_id: str) -> object:
        """The run's stored input (laid over the pipeline's defaults)."""
        return self._views.run_input(run_id)

    def list_workers(self) -> list[WorkerRecord]:
        """Workers seen recently, newest heartbeat first (none on a store
        that records no workers)."""
        return self._views.workers()

    def run_link(self, run_id: str) -> RunLink | None:
        """The parent of a child run (``None`` for a top-level run)."""
        return self._views.run_link(run_id)

    def child_runs(self, run_id: str) -> list[str]:
        """IDs of the run's child runs, in creation order."""
        return self._views.child_runs(run_id)

    # --- helpers -----------------------------------------------------------------

    def _require_run(self, run_id: str) -> None:
        if self._store.get_run_status(run_id) is None:
            raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")

    def _indices(self, run_id: str, slugs: Sequence[str]) -> list[int]:
        if isinstance(slugs, str):
            slugs = [slugs]
        by_slug = {node.slug: index for index, node in enumerate(self.nodes(run_id))}
        unknown = [slug for slug in slugs if slug not in by_slug]
        if unknown:
            raise UnknownNodeError(
                f"run {run_id!r} has no node {unknown[0]!r} (nodes: {', '.join(by_slug)})",
                field="nodes",
            )
        return [by_slug[slug] for slug in slugs]
