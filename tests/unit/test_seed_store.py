"""A store written to the seed's protocols alone (``DagStore``, ``DagWaitStore``,
``DagRetryStore``, ``OutputResolver``, method for method) is recognised as one
and runs the seed API end to end; the worker falls back to the seed's
behaviour for a store without dagwerk's extensions of them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import pytest

from dagwerk._protocols import implements
from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import NodeDisposition, RunStatus, TaskStatus
from dagwerk.execution import claim_task, recover_task
from dagwerk.models import (
    DagNode,
    EmittedOutput,
    LaunchCreateResult,
    NodeLaunch,
    PlanningSnapshot,
    ResolvedOutput,
    RetryPolicySpec,
    TaskInputPlan,
    TaskInputs,
)
from dagwerk.orchestrator import (
    OrchestratorCallbacks,
    on_task_complete,
    on_task_failed,
    reconcile_run,
    start_run,
)
from dagwerk.retry import retry_run, retry_task
from dagwerk.runtime.clock import FakeClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.worker import Worker
from dagwerk.store import (
    DagRetryStore,
    DagRunStore,
    DagStore,
    DagWaitStore,
    DelayedRetryStore,
    InvalidStoreValueError,
    NodeLaunchRef,
    NodeRerunStore,
    OutputResolver,
    RunReopenResult,
    TaskAttemptRef,
    TaskClaimResult,
    TaskCompletionResult,
    TaskFailureResult,
    TaskRecoveryResult,
    TaskResumeResult,
    TaskWaitResult,
    WaitResponseStore,
)
from dagwerk.task_input import resolve_task_inputs
from dagwerk.testing.helpers import CallbackLog, chain, emit, only_task
from dagwerk.waiting import resume_task, wait_task

SEED_METHODS = {
    DagStore: {
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
    },
    DagWaitStore: {"try_wait_task", "try_resume_task"},
    DagRetryStore: {"try_create_task_retry", "try_reopen_run"},
    OutputResolver: {"resolve_outputs"},
}
"""The seed's methods of each protocol (seed-api.md, methods 1-17); a
protocol that derives from ``DagStore`` has its methods too."""


class SeedStore:
    """The seed's four protocols and nothing else, each method delegating to
    the same method of a memory store (the application's own store would
    have its own database behind them)."""

    def __init__(self, inner: MemoryStore) -> None:
        self._inner = inner

    # DagStore

    def get_run_status(self, run_id: str) -> RunStatus | None:
        return self._inner.get_run_status(run_id)

    def get_run_nodes(self, run_id: str) -> list[DagNode] | None:
        return self._inner.get_run_nodes(run_id)

    def try_start_run(self, run_id: str) -> bool:
        return self._inner.try_start_run(run_id)

    def list_node_launches(self, run_id: str) -> Mapping[int, NodeLaunch]:
        return self._inner.list_node_launches(run_id)

    def get_planning_snapshot(
        self,
        run_id: str,
        node_index: int,
        source_indices: Mapping[str, int],
        *,
        max_outputs_per_edge: int,
        max_outputs_total: int,
        max_routing_bytes: int,
    ) -> PlanningSnapshot:
        return self._inner.get_planning_snapshot(
            run_id,
            node_index,
            source_indices,
            max_outputs_per_edge=max_outputs_per_edge,
            max_outputs_total=max_outputs_total,
            max_routing_bytes=max_routing_bytes,
        )

    def try_create_node_launch(  # noqa: PLR0917 (the seed's positional signature)
        self,
        run_id: str,
        node_index: int,
        plugin_name: str,
        snapshot_token: str,
        plans: tuple[TaskInputPlan, ...],
        zero_task_disposition: NodeDisposition | None,
        error: str = "",
    ) -> LaunchCreateResult:
        return self._inner.try_create_node_launch(
            run_id, node_index, plugin_name, snapshot_token, plans, zero_task_disposition, error
        )

    def try_claim_task(
        self, task_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskClaimResult | None:
        return self._inner.try_claim_task(
            task_id,
            expected_attempt_id=expected_attempt_id,
            expected_generation=expected_generation,
        )

    def try_recover_task(
        self, task_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskRecoveryResult | None:
        return self._inner.try_recover_task(
            task_id,
            expected_attempt_id=expected_attempt_id,
            expected_generation=expected_generation,
        )

    def try_complete_task(
        self, task_id: str, outputs: tuple[EmittedOutput, ...], *, expected_attempt_id: str
    ) -> TaskCompletionResult | None:
        return self._inner.try_complete_task(
            task_id, outputs, expected_attempt_id=expected_attempt_id
        )

    def mark_task_failed(
        self, task_id: str, error: str, *, expected_attempt_id: str
    ) -> TaskFailureResult | None:
        return self._inner.mark_task_failed(task_id, error, expected_attempt_id=expected_attempt_id)

    def mark_task_crashed(
        self, task_id: str, error: str, *, expected_attempt_id: str
    ) -> TaskFailureResult | None:
        return self._inner.mark_task_crashed(
            task_id, error, expected_attempt_id=expected_attempt_id
        )

    def try_finalize_run(
        self,
        run_id: str,
        status: RunStatus,
        *,
        cause: TaskAttemptRef | NodeLaunchRef | None = None,
        reason: str | None = None,
    ) -> bool:
        return self._inner.try_finalize_run(run_id, status, cause=cause, reason=reason)

    # DagWaitStore

    def try_wait_task(
        self, task_id: str, wait_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskWaitResult | None:
        return self._inner.try_wait_task(
            task_id,
            wait_id,
            expected_attempt_id=expected_attempt_id,
            expected_generation=expected_generation,
        )

    def try_resume_task(
        self, task_id: str, wait_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskResumeResult | None:
        return self._inner.try_resume_task(
            task_id,
            wait_id,
            expected_attempt_id=expected_attempt_id,
            expected_generation=expected_generation,
        )

    # DagRetryStore

    def try_create_task_retry(self, task_id: str, *, expected_attempt_id: str) -> str | None:
        return self._inner.try_create_task_retry(task_id, expected_attempt_id=expected_attempt_id)

    def try_reopen_run(
        self, run_id: str, boundary_indices: tuple[int, ...] | None
    ) -> RunReopenResult | None:
        return self._inner.try_reopen_run(run_id, boundary_indices)

    # OutputResolver

    def resolve_outputs(
        self, run_id: str, output_ids: tuple[str, ...]
    ) -> Mapping[str, ResolvedOutput]:
        return self._inner.resolve_outputs(run_id, output_ids)


def _protocol_members(protocol: type) -> set[str]:
    """The public members a protocol declares, its protocol bases' included."""
    return {
        name
        for base in protocol.__mro__
        if base is not Protocol and getattr(base, "_is_protocol", False)
        for name in vars(base)
        if not name.startswith("_")
    }


def test_the_seed_protocols_declare_exactly_the_seeds_methods() -> None:
    for protocol, methods in SEED_METHODS.items():
        inherited = SEED_METHODS[DagStore] if issubclass(protocol, DagStore) else set()
        assert _protocol_members(protocol) == methods | inherited, protocol.__name__


def test_the_seed_store_has_only_the_seeds_methods() -> None:
    public = {name for name in vars(SeedStore) if not name.startswith("_")}
    assert public == set().union(*SEED_METHODS.values())


@pytest.mark.parametrize(
    "protocol", [DagStore, DagWaitStore, DagRetryStore, OutputResolver], ids=lambda p: p.__name__
)
def test_a_seed_store_is_each_seed_protocol(protocol: type) -> None:
    store = SeedStore(MemoryStore())
    assert isinstance(store, protocol)
    assert implements(store, protocol)


@pytest.mark.parametrize(
    "protocol",
    [WaitResponseStore, DelayedRetryStore, NodeRerunStore, DagRunStore],
    ids=lambda p: p.__name__,
)
def test_a_seed_store_is_none_of_the_extensions(protocol: type) -> None:
    store = SeedStore(MemoryStore())
    assert not isinstance(store, protocol)
    assert not implements(store, protocol)


def _claim(store: SeedStore, task_id: str, attempt_id: str, generation: int) -> TaskClaimResult:
    claimed = claim_task(
        store, task_id, expected_attempt_id=attempt_id, expected_generation=generation
    )
    assert claimed is not None
    return claimed


def test_the_seed_api_runs_end_to_end_on_a_seed_store() -> None:
    inner = MemoryStore()
    store = SeedStore(inner)
    log = CallbackLog()
    # Creating the run is the application's own business (no seed method).
    assert inner.create_run("run-1", chain(2))
    assert start_run(store, "run-1", callbacks=log.callbacks) == [0]
    first = only_task(inner, "run-1", 0)
    won = _claim(store, first.task_id, first.attempt_id, 0)

    # Waiting and resumption.
    waited = wait_task(
        store, first.task_id, "approval", expected_attempt_id=won.attempt_id, expected_generation=0
    )
    assert waited is not None
    assert only_task(inner, "run-1", 0).status is TaskStatus.WAITING
    resumed = resume_task(
        store, first.task_id, "approval", expected_attempt_id=won.attempt_id, expected_generation=0
    )
    assert resumed is not None
    won = _claim(store, first.task_id, resumed.resumed_attempt_id, 0)
    assert won.resumed_from_wait_id == "approval"

    # Recovery and a task retry of a crashed attempt keep the wait correlation.
    recovered = recover_task(
        store, first.task_id, expected_attempt_id=won.attempt_id, expected_generation=0
    )
    assert recovered is not None
    won = _claim(store, first.task_id, recovered.recovered_attempt_id, 0)
    assert store.mark_task_crashed(first.task_id, "lost", expected_attempt_id=won.attempt_id)
    retried = retry_task(store, first.task_id, expected_attempt_id=won.attempt_id)
    assert retried is not None
    won = _claim(store, first.task_id, retried, 0)
    assert won.resumed_from_wait_id == "approval"
    on_task_complete(
        store,
        task_id=first.task_id,
        expected_attempt_id=retried,
        outputs=emit("o1", k="v"),
        callbacks=log.callbacks,
    )

    # The second node reads its input through the seed's resolver, then fails
    # the run; a run retry reopens it and its new generation completes it.
    second = only_task(inner, "run-1", 1)
    _claim(store, second.task_id, second.attempt_id, 0)
    inputs = resolve_task_inputs(store, run_id="run-1", plan=second.plan)
    assert [output.id for output in inputs.edges["n0"]] == ["o1"]
    on_task_failed(
        store,
        task_id=second.task_id,
        expected_attempt_id=second.attempt_id,
        error_message="bad",
        callbacks=log.callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.FAILED
    result = retry_run(store, "run-1")
    assert result.affected_nodes == (1,)
    assert dict(result.generations) == {1: 1}
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    again = only_task(inner, "run-1", 1)
    assert again.generation == 1
    _claim(store, again.task_id, again.attempt_id, 1)
    on_task_complete(
        store,
        task_id=again.task_id,
        expected_attempt_id=again.attempt_id,
        outputs=emit("o2"),
        callbacks=log.callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert log.kinds() == ["failed", "completed"]


def test_a_resume_response_needs_a_wait_response_store() -> None:
    inner = MemoryStore()
    store = SeedStore(inner)
    assert inner.create_run("run-1", chain(1))
    start_run(store, "run-1", callbacks=CallbackLog().callbacks)
    first = only_task(inner, "run-1", 0)
    _claim(store, first.task_id, first.attempt_id, 0)
    assert wait_task(
        store, first.task_id, "w", expected_attempt_id=first.attempt_id, expected_generation=0
    )
    with pytest.raises(InvalidStoreValueError, match="WaitResponseStore") as info:
        resume_task(
            store,
            first.task_id,
            "w",
            expected_attempt_id=first.attempt_id,
            expected_generation=0,
            response={"ok": True},
        )
    assert info.value.field == "response"
    # Nothing reached the store: the wait is still open for a plain resume.
    assert only_task(inner, "run-1", 0).status is TaskStatus.WAITING
    assert resume_task(
        store, first.task_id, "w", expected_attempt_id=first.attempt_id, expected_generation=0
    )


# --- the worker without the extensions ---------------------------------------


def _noop(run_id: str) -> None:
    return None


CALLBACKS = OrchestratorCallbacks(_noop, _noop, _noop, _noop)


class _StoreWithoutDelayedRetry(MemoryStore):
    """A queue-capable store without ``DelayedRetryStore``."""

    try_fail_task_with_retry = None  # type: ignore[assignment]


class _StoreWithoutWaitResponses(MemoryStore):
    """A queue-capable store without ``WaitResponseStore``."""

    get_wait_response = None  # type: ignore[assignment]


def test_without_delayed_retries_a_retryable_failure_is_final(tmp_path: Path) -> None:
    attempts: list[int] = []

    def flaky(inputs: TaskInputs, ctx: TaskContext) -> object:
        attempts.append(ctx.attempt)
        raise OSError("upstream down")

    clock = FakeClock()
    store = _StoreWithoutDelayedRetry(clock=clock.time)
    assert not isinstance(store, DelayedRetryStore)
    spec = RetryPolicySpec(max_attempts=3, backoff_base=1.0, jitter=False)
    assert store.create_run("run", [DagNode(slug="a", plugin="flaky", retry=spec)])
    start_run(store, "run", callbacks=CALLBACKS)
    worker = Worker(store, {"flaky": flaky}, clock=clock, execution_root=tmp_path)
    worker.run_until_idle()
    clock.advance(10.0)
    worker.run_until_idle()
    assert attempts == [1]
    assert store.get_run_status("run") is RunStatus.FAILED
    (task,) = store.list_tasks("run")
    assert task.status is TaskStatus.FAILED
    assert task.error == "OSError: upstream down"


def test_without_wait_responses_a_resumed_attempt_gets_none(tmp_path: Path) -> None:
    seen: list[object] = []

    def approve(inputs: TaskInputs, ctx: TaskContext) -> object:
        if ctx.resumed_from_wait_id is None:
            ctx.wait("approval")
        seen.append(ctx.wait_response)
        return None

    clock = FakeClock()
    store = _StoreWithoutWaitResponses(clock=clock.time)
    assert not isinstance(store, WaitResponseStore)
    assert store.create_run("run", [DagNode(slug="a", plugin="approve")])
    start_run(store, "run", callbacks=CALLBACKS)
    worker = Worker(store, {"approve": approve}, clock=clock, execution_root=tmp_path)
    worker.run_until_idle()
    (task,) = store.list_tasks("run")
    assert task.status is TaskStatus.WAITING
    assert resume_task(
        store, task.task_id, "approval", expected_attempt_id=task.attempt_id, expected_generation=0
    )
    worker.run_until_idle()
    assert seen == [None]
    assert store.get_run_status("run") is RunStatus.COMPLETED
