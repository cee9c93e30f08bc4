"""Child runs in the worker: starting, waiting, and the lineage guard.

A plugin starts a child with ``ctx.start_child(nodes_or_pipeline, input=...)``
(which only records the request and returns the child's run ID) and waits
with ``ctx.wait_for_child(child_run_id)``; ``ctx.run_child(...)`` does both.
The first wait parks the attempt: the worker commits, in one store transaction, the
child run (RUNNING, with its lineage and budget) and the parent's WAITING
state under ``child_wait_id(child_run_id)``, then reconciles the child
(launches its roots). A worker that dies between the two leaves a RUNNING
child without launches, which the next backstop pass reconciles: a child
can never be stranded PENDING under a waiting parent. The
child's terminal transition resumes the parent in the same commit; the
resumed attempt runs the plugin from the top, where ``start_child`` returns
the same child (``runtime/durable.py``) and ``wait_for_child`` its result,
raising ``ChildRunFailed`` for a failed child (catch it to handle the
failure); ``ctx.child_result(child_run_id)`` reads the result too.

Before executing any task, :meth:`ChildRuns.guard_lineage` decodes the run's persisted
lineage (never an in-process default), so every worker enforces the depth
limit, the recursion rule and ancestor cancellation on runs it did not
create (CL-01..CL-06).

Child requests live in the attempt's context object. Under the process
executor the context is a copy in the plugin's process: the requests travel
back to the worker with the attempt's outcome, and the worker commits them
exactly as for the thread and async executors. Wait IDs starting with
``child:`` are reserved: a wait under one that names no child requested by
the attempt fails the task (``child_run_invalid``) instead of waiting for
a child that does not exist.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from dagwerk.budgets import Budget
from dagwerk.constants import FailurePolicy, RunStatus
from dagwerk.errors import DagwerkError
from dagwerk.graph import validate_graph
from dagwerk.json import JsonValue, thaw_json
from dagwerk.limits import Limits
from dagwerk.lineage import (
    CHILD_WAIT_PREFIX,
    LineageInvalidError,
    RunLineage,
    RunLink,
    cancellation_anchors,
    check_lineage,
    child_lineage,
    child_wait_id,
    decode_lineage,
    encode_lineage,
    pipeline_identity,
)
from dagwerk.models import DagNode
from dagwerk.orchestrator import OrchestratorCallbacks, cancel_run, reconcile_run
from dagwerk.store import DagChildStore, DagRunStore, DagStore
from dagwerk.topology import RunTopology

if TYPE_CHECKING:
    from dagwerk.runtime.roles import DeliverySettler
    from dagwerk.store import LeasedDelivery

__all__ = [
    "ChildPipeline",
    "ChildRequests",
    "ChildResult",
    "ChildRunError",
    "ChildRuns",
]

_LOG = logging.getLogger("dagwerk.runtime.children")


class ChildRunError(DagwerkError, RuntimeError):
    """A child request cannot be honoured (unknown child, no store support)."""

    code = "child_run_invalid"


@dataclass(frozen=True, slots=True)
class ChildPipeline:
    """A child pipeline with its identity and recursion declaration.

    ``pipeline_id`` defaults to the hash of the node definitions. A pipeline
    that may appear in its own ancestry declares ``allow_recursion=True`` and
    ``max_recursion`` (how often it may appear above itself). ``budget``
    gives the child its own budget, which must fit inside its ancestors'.
    """

    nodes: tuple[DagNode, ...]
    pipeline_id: str | None = None
    allow_recursion: bool = False
    max_recursion: int | None = None
    failure_policy: FailurePolicy = FailurePolicy.FAIL_FAST
    budget: Budget | None = None

    @property
    def identity(self) -> str:
        return self.pipeline_id or pipeline_identity(self.nodes)


@dataclass(frozen=True, slots=True)
class ChildRequest:
    child_run_id: str
    pipeline: ChildPipeline
    run_input: Mapping[str, object]


@dataclass(slots=True)
class ChildRequests:
    """The children an attempt asked for (filled by ``ctx.start_child``)."""

    pending: dict[str, ChildRequest] = field(default_factory=dict)

    def add(
        self,
        nodes_or_pipeline: object,
        run_input: Mapping[str, object] | None,
        *,
        child_run_id: str | None = None,
        budget: Budget | None = None,
    ) -> str:
        pipeline = _as_pipeline(nodes_or_pipeline, budget)
        # An invalid child graph fails the plugin now, before anything is stored.
        validate_graph(list(pipeline.nodes))
        run_id = child_run_id or f"child-{uuid.uuid4().hex}"
        self.pending[run_id] = ChildRequest(run_id, pipeline, dict(run_input or {}))
        return run_id


def _as_pipeline(value: object, budget: Budget | None) -> ChildPipeline:
    if isinstance(value, ChildPipeline):
        if budget is not None:
            return ChildPipeline(
                value.nodes,
                value.pipeline_id,
                value.allow_recursion,
                value.max_recursion,
                value.failure_policy,
                budget,
            )
        return value
    nodes = getattr(value, "nodes", None)
    if nodes is not None and not isinstance(value, Sequence):
        # A loaded pipeline file (dagwerk.pipelines.loader.Pipeline).
        policy = getattr(value, "failure_policy", FailurePolicy.FAIL_FAST)
        return ChildPipeline(tuple(nodes), failure_policy=policy, budget=budget)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return ChildPipeline(tuple(value), budget=budget)
    raise ChildRunError(
        "start_child takes a list of DagNode, a ChildPipeline or a Pipeline", field="nodes"
    )


@dataclass(frozen=True, slots=True)
class ChildResult:
    """What a finished child handed its parent: status, error and the outputs
    of its sink nodes by slug (each output a dict with id, fields, data)."""

    run_id: str
    status: RunStatus
    error: str | None
    outputs: Mapping[str, tuple[Mapping[str, Any], ...]]

    @property
    def ok(self) -> bool:
        return self.status is RunStatus.COMPLETED

    @classmethod
    def from_response(cls, response: JsonValue | None) -> ChildResult | None:
        plain: Any = thaw_json(response)
        if not isinstance(plain, dict):
            return None
        outputs: dict[str, list[Mapping[str, Any]]] = plain.get("outputs") or {}
        error = plain.get("error")
        return cls(
            run_id=str(plain.get("run_id")),
            status=RunStatus(str(plain.get("status"))),
            error=None if error is None else str(error),
            outputs={slug: tuple(items) for slug, items in outputs.items()},
        )


# --- worker side ---------------------------------------------------------------------


class ChildAsker(Protocol):
    """What a child wait reads of the attempt's context (``TaskContext``)."""

    @property
    def children(self) -> ChildRequests: ...


class _ChildStore(DagStore, DagRunStore, Protocol):
    """The store reads and writes of a child wait and the lineage guard."""


class ChildRuns:
    """The worker's side of child runs: the lineage guard before a task runs
    and the commit of a wait for a child. ``child_store`` is ``None`` for a
    store without child runs; a refusal is settled through the ``settler``
    each call is handed."""

    def __init__(
        self,
        store: _ChildStore,
        child_store: DagChildStore | None,
        *,
        callbacks: OrchestratorCallbacks,
        max_child_depth: int,
        limits: Limits | None,
    ) -> None:
        self.store = store
        self.child_store = child_store
        self.callbacks = callbacks
        self.max_child_depth = max_child_depth
        self.limits = Limits() if limits is None else limits

    def run_lineage(
        self, run_id: str, link_of: Callable[[str], RunLink | None] | None = None
    ) -> RunLineage | None:
        """The run's persisted lineage; ``None`` for a root run. Corrupt text raises
        :class:`LineageInvalidError`. ``link_of`` reads the link instead of the
        store (a batch reads each run's link once)."""
        store = self.child_store
        if store is None:
            return None
        link = (link_of or store.get_run_link)(run_id)
        if link is None:
            return None
        lineage = decode_lineage(link.lineage)
        if lineage.depth >= 1 and (
            lineage.parent_run_id != link.parent_run_id or lineage.root_run_id != link.root_run_id
        ):
            raise LineageInvalidError(
                "lineage_invalid: persisted lineage contradicts the run's parent link",
                field="lineage",
            )
        return lineage

    def guard_lineage(
        self,
        settler: DeliverySettler,
        delivery: LeasedDelivery,
        *,
        link_of: Callable[[str], RunLink | None] | None = None,
    ) -> bool:
        """Decode and enforce the run's persisted lineage before executing a task.

        True: execute. False: the guard settled the delivery, either failing
        the task (corrupt lineage, ``lineage_invalid``; depth or recursion
        refused) or cancelling the run because its root or parent is committed
        cancelled (the task is cancelled in the same commit).
        """
        try:
            lineage = self.run_lineage(delivery.run_id, link_of)
            if lineage is None:
                return True
            check_lineage(lineage, max_child_depth=self.max_child_depth)
        except DagwerkError as exc:
            # CL-06: only this task fails; the worker goes on with the next one.
            settler.fail(delivery, exc)
            return False
        for anchor in cancellation_anchors(lineage):
            # CL-05: a missing ancestor (status None) is not a cancellation signal.
            if self.store.get_run_status(anchor) is RunStatus.CANCELLED:
                reason = f"ancestor run {anchor!r} is cancelled"
                cancel_run(self.store, delivery.run_id, callbacks=self.callbacks, reason=reason)
                settler.ack(delivery, "cancelled", reason)
                return False
        return True

    def settle_wait(
        self, settler: DeliverySettler, delivery: LeasedDelivery, ctx: ChildAsker, wait_id: str
    ) -> bool:
        """Commit a wait for a child run; False when ``wait_id`` is not a child wait."""
        if not wait_id.startswith(CHILD_WAIT_PREFIX):
            return False
        request = next(
            (r for r in ctx.children.pending.values() if child_wait_id(r.child_run_id) == wait_id),
            None,
        )
        store = self.child_store
        try:
            if request is None:
                raise ChildRunError(
                    f"child_run_invalid: wait {wait_id!r} names no child run this attempt "
                    "started (wait IDs starting with 'child:' are reserved for child runs)",
                    field="wait_id",
                )
            if store is None:
                raise ChildRunError("this store does not support child runs", field="store")
            link = self._link_for(delivery, request)
            # The child is committed RUNNING with the wait, so its graph must be
            # startable under the store's limits before anything is written.
            RunTopology.build(list(request.pipeline.nodes), limits=self.limits)
        except (DagwerkError, ValueError) as exc:
            settler.fail(delivery, exc)
            return True
        try:
            waited = store.try_wait_for_child(
                delivery.task_id,
                expected_attempt_id=delivery.attempt_id,
                expected_generation=delivery.generation,
                nodes=list(request.pipeline.nodes),
                link=link,
                run_input=request.run_input,
                failure_policy=request.pipeline.failure_policy,
                budget=request.pipeline.budget,
            )
        except DagwerkError as exc:
            settler.fail(delivery, exc)
            return True
        if waited is None:
            settler.ack(delivery, "stale", wait_id)
            return True
        try:
            reconcile_run(self.store, request.child_run_id, callbacks=self.callbacks)
        except Exception:
            # The child is RUNNING: the backstop's next pass reconciles it.
            _LOG.exception("starting child run %s failed", request.child_run_id)
        settler.ack(delivery, "waited", wait_id)
        return True

    def _link_for(self, delivery: LeasedDelivery, request: ChildRequest) -> RunLink:
        parent = self.run_lineage(delivery.run_id)
        if parent is not None:
            parent_pipeline = parent.pipeline_id
        else:
            nodes = self.store.get_run_nodes(delivery.run_id) or []
            parent_pipeline = pipeline_identity(nodes)
        pipeline = request.pipeline
        lineage = child_lineage(
            parent,
            parent_run_id=delivery.run_id,
            parent_task_id=delivery.task_id,
            parent_pipeline_id=parent_pipeline,
            pipeline_id=pipeline.identity,
            allow_recursion=pipeline.allow_recursion,
            max_recursion=pipeline.max_recursion,
        )
        # Refused here already, so a child that could never run is never stored.
        check_lineage(lineage, max_child_depth=self.max_child_depth)
        return RunLink(
            run_id=request.child_run_id,
            parent_run_id=delivery.run_id,
            parent_task_id=delivery.task_id,
            root_run_id=lineage.root_run_id,
            lineage=encode_lineage(lineage),
            wait_id=child_wait_id(request.child_run_id),
        )
