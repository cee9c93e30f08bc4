"""Building blocks for the store contract suite.

Everything here goes through the public surface only: the seed protocols of
:mod:`dagwerk.store`, the extensions of :class:`dagwerk.store.DagRunStore`
and the orchestration functions. No helper reads a backend's internals, so
the same helpers drive the in-memory, SQLite and PostgreSQL stores and an
application's own store.

The pieces:

* pipeline builders (:func:`root`, :func:`child`, :func:`chain`);
* :class:`CallbackLog`, which records ``OrchestratorCallbacks`` events;
* :class:`FakeWorker`, a tiny single-threaded worker that drains
  ``store.list_deliveries()`` and settles each claimed attempt through
  ``claim_task`` / ``on_task_complete`` / ``on_task_failed`` /
  ``on_task_crashed`` / ``wait_task`` as a per-node handler decides;
* :class:`StoreProxy`, a forwarding wrapper that counts calls and lets a test
  replace one store method, to prove what the orchestration functions do with
  a misbehaving or racing store;
* small queries and assertions (:func:`fingerprint`,
  :func:`assert_queued_tasks_deliverable`, ...).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, cast

from dagwerk.constants import (
    CorrelationMode,
    FailurePolicy,
    InputMode,
    InputRole,
    TaskStatus,
)
from dagwerk.execution import claim_task
from dagwerk.models import (
    DagNode,
    EmittedOutput,
    InputEdge,
    NodeLaunch,
    PlanningSnapshot,
    TaskInputs,
)
from dagwerk.orchestrator import (
    OrchestratorCallbacks,
    on_task_complete,
    on_task_crashed,
    on_task_failed,
    start_run,
)
from dagwerk.store import (
    DagRetryStore,
    DagRunStore,
    DagWaitStore,
    DelayedRetryStore,
    Delivery,
    NodeRerunStore,
    OutputResolver,
    RunRecord,
    TaskClaimResult,
    TaskRecord,
    WaitResponseStore,
)
from dagwerk.task_input import resolve_task_inputs
from dagwerk.waiting import wait_task

__all__ = [
    "CallbackLog",
    "Complete",
    "ContractStore",
    "Crash",
    "Fail",
    "FakeWorker",
    "Hold",
    "Outcome",
    "StoreProxy",
    "Wait",
    "WorkItem",
    "active_tasks",
    "as_store",
    "assert_queued_tasks_deliverable",
    "chain",
    "child",
    "claim",
    "deliveries_for",
    "emit",
    "fingerprint",
    "launch_of",
    "new_run",
    "only_task",
    "root",
    "run_record",
    "snapshot_for",
    "task",
    "tasks_of",
]


class ContractStore(
    WaitResponseStore,
    DelayedRetryStore,
    NodeRerunStore,
    DagWaitStore,
    DagRetryStore,
    OutputResolver,
    DagRunStore,
    Protocol,
):
    """What the contract suite needs from a store: the seed's protocols with
    dagwerk's extensions of them, and the run store, at once."""


# --- pipelines ------------------------------------------------------------


def root(
    slug: str,
    *,
    plugin: str | None = None,
    correlation_mode: CorrelationMode = CorrelationMode.DEFAULT,
) -> DagNode:
    """A root node whose plugin name defaults to its slug."""
    return DagNode(slug=slug, plugin=plugin or slug, correlation_mode=correlation_mode)


def child(
    slug: str,
    *sources: str,
    mode: InputMode = InputMode.EACH,
    plugin: str | None = None,
    side: Sequence[str] = (),
    correlation_mode: CorrelationMode = CorrelationMode.DEFAULT,
) -> DagNode:
    """A node with one main edge per source (edge name = source slug)."""
    edges = [InputEdge(name=source, source=source) for source in sources]
    edges += [
        InputEdge(name=source, source=source, role=InputRole.SIDE, required=False)
        for source in side
    ]
    return DagNode(
        slug=slug,
        plugin=plugin or slug,
        input_mode=mode,
        edges=tuple(edges),
        correlation_mode=correlation_mode,
    )


def chain(length: int, *, mode: InputMode = InputMode.EACH, prefix: str = "n") -> list[DagNode]:
    """``n0 -> n1 -> ... -> n{length-1}``."""
    nodes = [root(f"{prefix}0")]
    for index in range(1, length):
        nodes.append(child(f"{prefix}{index}", f"{prefix}{index - 1}", mode=mode))
    return nodes


# --- callbacks ------------------------------------------------------------


@dataclass
class CallbackLog:
    """Records every run callback as ``(kind, run_id)``.

    ``hooks`` may hold extra functions per kind, run after the event is
    recorded (for example to observe the store from inside a callback, or to
    raise).
    """

    events: list[tuple[str, str]] = field(default_factory=list)
    hooks: dict[str, Callable[[str], None]] = field(default_factory=dict)

    def _record(self, kind: str) -> Callable[[str], None]:
        def callback(run_id: str) -> None:
            self.events.append((kind, run_id))
            hook = self.hooks.get(kind)
            if hook is not None:
                hook(run_id)

        return callback

    @property
    def callbacks(self) -> OrchestratorCallbacks:
        return OrchestratorCallbacks(
            on_run_completed=self._record("completed"),
            on_run_failed=self._record("failed"),
            on_run_crashed=self._record("crashed"),
            on_run_cancelled=self._record("cancelled"),
        )

    def kinds(self, run_id: str | None = None) -> list[str]:
        return [kind for kind, rid in self.events if run_id is None or rid == run_id]


# --- store queries --------------------------------------------------------


def run_record(store: ContractStore, run_id: str) -> RunRecord:
    record = store.get_run(run_id)
    assert record is not None, f"run {run_id!r} does not exist"
    return record


def task(store: ContractStore, task_id: str) -> TaskRecord:
    record = store.get_task(task_id)
    assert record is not None, f"task {task_id!r} does not exist"
    return record


def tasks_of(store: ContractStore, run_id: str, node_index: int) -> list[TaskRecord]:
    """Active tasks of one node, in creation order."""
    return [t for t in store.list_tasks(run_id) if t.node_index == node_index]


def active_tasks(store: ContractStore, run_id: str) -> list[TaskRecord]:
    return list(store.list_tasks(run_id))


def only_task(store: ContractStore, run_id: str, node_index: int) -> TaskRecord:
    found = tasks_of(store, run_id, node_index)
    assert len(found) == 1, f"node {node_index} has {len(found)} active tasks"
    return found[0]


def launch_of(store: ContractStore, run_id: str, node_index: int) -> NodeLaunch | None:
    return store.list_node_launches(run_id).get(node_index)


def deliveries_for(store: ContractStore, task_id: str) -> list[Delivery]:
    return [d for d in store.list_deliveries() if d.task_id == task_id]


def fingerprint(store: ContractStore, run_id: str) -> tuple[object, ...]:
    """Everything observable about a run, for "nothing changed" assertions."""
    record = store.get_run(run_id)
    nodes = store.get_run_nodes(run_id) or []
    return (
        record,
        tuple(store.list_tasks(run_id, include_invalidated=True)),
        tuple(store.list_deliveries(run_id)),
        tuple(sorted(store.list_node_launches(run_id).items())),
        tuple(store.get_output_ids(run_id, index) for index in range(len(nodes))),
    )


def snapshot_for(store: ContractStore, run_id: str, node_index: int) -> PlanningSnapshot:
    """A planning snapshot of a node with generous limits (edge name = source slug)."""
    nodes = store.get_run_nodes(run_id)
    assert nodes is not None
    slug_to_index = {node.slug: index for index, node in enumerate(nodes)}
    sources = {edge.name: slug_to_index[edge.source] for edge in nodes[node_index].edges}
    return store.get_planning_snapshot(
        run_id,
        node_index,
        sources,
        max_outputs_per_edge=10_000,
        max_outputs_total=50_000,
        max_routing_bytes=16 * 1024 * 1024,
    )


def assert_queued_tasks_deliverable(store: ContractStore, run_id: str | None = None) -> None:
    """OB-01: every QUEUED task has a deliverable outbox row for its current attempt."""
    rows = {(d.task_id, d.attempt_id, d.generation) for d in store.list_deliveries(run_id)}
    runs = [run_id] if run_id is not None else sorted({d.run_id for d in store.list_deliveries()})
    for rid in runs:
        for record in store.list_tasks(rid):
            if record.status is TaskStatus.QUEUED:
                key = (record.task_id, record.attempt_id, record.generation)
                assert key in rows, f"QUEUED task {record.task_id} has no deliverable row"


# --- runs -----------------------------------------------------------------


def new_run(
    store: ContractStore,
    nodes: Sequence[DagNode],
    run_id: str = "run-1",
    *,
    run_input: Mapping[str, object] | None = None,
    failure_policy: FailurePolicy = FailurePolicy.FAIL_FAST,
    log: CallbackLog | None = None,
    start: bool = True,
) -> CallbackLog:
    """Create (and by default start) a run; returns the callback log it uses."""
    log = log if log is not None else CallbackLog()
    created = store.create_run(
        run_id, list(nodes), run_input=run_input, failure_policy=failure_policy
    )
    assert created is True
    if start:
        start_run(store, run_id, callbacks=log.callbacks)
    return log


def emit(*ids: str, **fields: object) -> tuple[EmittedOutput, ...]:
    """Outputs with the given IDs, all carrying the same routing ``fields``."""
    return tuple(EmittedOutput(id=output_id, fields=dict(fields)) for output_id in ids)


def claim(store: ContractStore, record: TaskRecord) -> TaskClaimResult:
    """Claim the task's current attempt, asserting that the claim wins."""
    result = claim_task(
        store,
        record.task_id,
        expected_attempt_id=record.attempt_id,
        expected_generation=record.generation,
    )
    assert result is not None, f"claim of {record.task_id}/{record.attempt_id} lost"
    return result


# --- the fake worker ------------------------------------------------------


@dataclass(frozen=True)
class Complete:
    """Complete the attempt; ``outputs=None`` emits ``FakeWorker.default_outputs`` outputs."""

    outputs: tuple[EmittedOutput, ...] | None = None


@dataclass(frozen=True)
class Fail:
    error: str = "boom"


@dataclass(frozen=True)
class Crash:
    error: str = "lost"


@dataclass(frozen=True)
class Wait:
    wait_id: str


@dataclass(frozen=True)
class Hold:
    """Keep the attempt RUNNING (a busy or lost worker)."""


Outcome: TypeAlias = Complete | Fail | Crash | Wait | Hold


@dataclass(frozen=True)
class WorkItem:
    """What a handler sees: the winning claim, the node and the resolved inputs."""

    claim: TaskClaimResult
    slug: str
    plugin: str
    inputs: TaskInputs


Handler: TypeAlias = Callable[[WorkItem], Outcome]


class FakeWorker:
    """Drains deliveries single-threaded and settles each claimed attempt.

    ``handlers`` maps a node slug to a function deciding the outcome; other
    nodes complete with ``default_outputs`` outputs whose IDs derive from the
    task ID (unique within a run). A delivery is acknowledged after its
    attempt was settled, and a delivery whose claim loses is acknowledged only
    when its attempt is no longer the QUEUED attempt of its task (a QUEUED
    task keeps its row, OB-01).
    """

    def __init__(
        self,
        store: ContractStore,
        log: CallbackLog | None = None,
        *,
        handlers: Mapping[str, Handler] | None = None,
        default_outputs: int = 1,
    ) -> None:
        self.store = store
        self.log = log if log is not None else CallbackLog()
        self.handlers: dict[str, Handler] = dict(handlers or {})
        self.default_outputs = default_outputs
        self.items: list[WorkItem] = []
        self.held: list[WorkItem] = []
        # Deliveries of held attempts stay leased by this worker: never acked.
        self.leased: set[str] = set()

    def outputs_for(self, item: WorkItem) -> tuple[EmittedOutput, ...]:
        return tuple(
            EmittedOutput(
                id=f"{item.claim.task_id}/out-{n}",
                fields={"slug": item.slug, "n": n, "title": f"{item.slug}-{n}"},
                data={"path": f"/data/{item.claim.task_id}/{n}"},
            )
            for n in range(self.default_outputs)
        )

    def process(self, delivery: Delivery) -> bool:
        """Handle one delivery; True if its claim won."""
        store = self.store
        if delivery.delivery_id in self.leased:
            return False
        won = claim_task(
            store,
            delivery.task_id,
            expected_attempt_id=delivery.attempt_id,
            expected_generation=delivery.generation,
        )
        if won is None:
            current = store.get_task(delivery.task_id)
            if (
                current is None
                or current.status is not TaskStatus.QUEUED
                or current.attempt_id != delivery.attempt_id
            ):
                store.ack_delivery(delivery.delivery_id)
            return False
        record = task(store, won.task_id)
        nodes = store.get_run_nodes(won.run_id)
        assert nodes is not None
        node = nodes[won.node_index]
        inputs = resolve_task_inputs(store, run_id=won.run_id, plan=record.plan)
        item = WorkItem(claim=won, slug=node.slug, plugin=node.plugin, inputs=inputs)
        self.items.append(item)
        handler = self.handlers.get(node.slug)
        outcome: Outcome = handler(item) if handler is not None else Complete()
        self.settle(item, outcome)
        if isinstance(outcome, Hold):
            self.leased.add(delivery.delivery_id)
        else:
            store.ack_delivery(delivery.delivery_id)
        return True

    def settle(self, item: WorkItem, outcome: Outcome) -> None:
        store, callbacks = self.store, self.log.callbacks
        won = item.claim
        if isinstance(outcome, Complete):
            outputs = outcome.outputs if outcome.outputs is not None else self.outputs_for(item)
            on_task_complete(
                store,
                task_id=won.task_id,
                expected_attempt_id=won.attempt_id,
                outputs=outputs,
                callbacks=callbacks,
            )
        elif isinstance(outcome, Fail):
            on_task_failed(
                store,
                task_id=won.task_id,
                expected_attempt_id=won.attempt_id,
                error_message=outcome.error,
                callbacks=callbacks,
            )
        elif isinstance(outcome, Crash):
            on_task_crashed(
                store,
                task_id=won.task_id,
                expected_attempt_id=won.attempt_id,
                error_message=outcome.error,
                callbacks=callbacks,
            )
        elif isinstance(outcome, Wait):
            wait_task(
                store,
                won.task_id,
                outcome.wait_id,
                expected_attempt_id=won.attempt_id,
                expected_generation=won.generation,
            )
        else:
            self.held.append(item)

    def drain(self, run_id: str | None = None, *, max_rounds: int = 200) -> int:
        """Process deliveries until a round claims nothing; returns the claims won."""
        won = 0
        for _ in range(max_rounds):
            round_won = sum(self.process(d) for d in self.store.list_deliveries(run_id))
            if round_won == 0:
                return won
            won += round_won
        raise AssertionError("the fake worker did not become idle")


# --- a forwarding proxy ---------------------------------------------------

_FORWARDED = (
    "get_run_status",
    "get_run_nodes",
    "try_start_run",
    "list_node_launches",
    "get_planning_snapshot",
    "try_create_node_launch",
    "try_claim_task",
    "try_recover_task",
    "try_complete_task",
    "mark_task_failed",
    "mark_task_crashed",
    "try_finalize_run",
    "try_wait_task",
    "try_resume_task",
    "try_create_task_retry",
    "try_reopen_run",
    "resolve_outputs",
    "create_run",
    "get_run",
    "get_task",
    "list_tasks",
    "list_deliveries",
    "ack_delivery",
    "try_cancel_run",
    "get_output_ids",
    "try_fail_task_with_retry",
    "try_rerun_nodes",
    "get_wait_response",
    "list_attempts",
    "list_runs",
)


class StoreProxy:
    """Forwards every store method to ``inner``, counting calls.

    ``overrides`` replaces a method: the replacement receives the inner store
    first, then the call's arguments, so it can delegate, race or lie. The
    methods are real class attributes (not ``__getattr__``), so runtime
    protocol checks see them.
    """

    def __new__(cls, inner: ContractStore, **overrides: Callable[..., Any]) -> StoreProxy:
        # Optional protocols (such as RunActivityStore) are forwarded only when
        # the wrapped store implements them, so runtime checks stay truthful.
        chosen = cls
        if cls is StoreProxy and hasattr(inner, "get_run_activity"):
            chosen = _ActivityStoreProxy
        return super().__new__(chosen)

    def __init__(self, inner: ContractStore, **overrides: Callable[..., Any]) -> None:
        self.inner = inner
        self.overrides = overrides
        self.calls: Counter[str] = Counter()

    @property
    def limits(self) -> object:
        # Engine limits travel with the store (the orchestrator reads them).
        return getattr(self.inner, "limits", None)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.calls[name] += 1
        override = self.overrides.get(name)
        if override is not None:
            return override(self.inner, *args, **kwargs)
        return getattr(self.inner, name)(*args, **kwargs)


def _forwarder(name: str) -> Callable[..., Any]:
    def method(self: StoreProxy, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, *args, **kwargs)

    method.__name__ = name
    return method


class _ActivityStoreProxy(StoreProxy):
    """A proxy for a store that also offers ``get_run_activity``."""


for _name in _FORWARDED:
    setattr(StoreProxy, _name, _forwarder(_name))
_ActivityStoreProxy.get_run_activity = _forwarder("get_run_activity")  # type: ignore[attr-defined]
del _name


def as_store(proxy: StoreProxy) -> ContractStore:
    """The proxy typed as a store (its methods are attached dynamically)."""
    return cast(ContractStore, proxy)
