"""Request validation and result checking of the wrappers (FN-04, RT-03, TI-01, TI-02)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import InputRole, RunStatus, TaskStatus
from dagwerk.errors import MaterializationError
from dagwerk.execution import claim_task, recover_task
from dagwerk.models import PlannedEdgeInput, ResolvedOutput, TaskInputPlan
from dagwerk.retry import RetryRejectedError, retry_run
from dagwerk.store import (
    RunReopenResult,
    StoreContractError,
    TaskClaimResult,
    TaskRecoveryResult,
    TaskResumeResult,
    TaskWaitResult,
)
from dagwerk.task_input import resolve_task_inputs
from dagwerk.testing.helpers import (
    Fail,
    FakeWorker,
    StoreProxy,
    as_store,
    chain,
    new_run,
    only_task,
    root,
)
from dagwerk.waiting import resume_task, wait_task

BAD_REQUESTS: list[tuple[object, object, object]] = [
    ("", "a", 0),
    (None, "a", 0),
    ("t", "", 0),
    ("t", 3, 0),
    ("t", "a", -1),
    ("t", "a", True),
    ("t", "a", 1.0),
    ("t", "a", "0"),
]


@pytest.mark.parametrize(("task_id", "attempt_id", "generation"), BAD_REQUESTS)
def test_fn_04_wrappers_validate_requests_before_the_store(
    task_id: Any, attempt_id: Any, generation: Any
) -> None:
    proxy = StoreProxy(MemoryStore())
    store = as_store(proxy)
    kwargs = {"expected_attempt_id": attempt_id, "expected_generation": generation}
    with pytest.raises(ValueError):
        claim_task(store, task_id, **kwargs)
    with pytest.raises(ValueError):
        recover_task(store, task_id, **kwargs)
    with pytest.raises(ValueError):
        wait_task(store, task_id, "w", **kwargs)
    with pytest.raises(ValueError):
        resume_task(store, task_id, "w", **kwargs)
    assert sum(proxy.calls.values()) == 0


def test_fn_04_wait_wrappers_validate_the_wait_id_before_the_store() -> None:
    proxy = StoreProxy(MemoryStore())
    store = as_store(proxy)
    for bad in ("", "x\x00", "k" * 513):
        with pytest.raises(ValueError):
            wait_task(store, "t", bad, expected_attempt_id="a", expected_generation=0)
        with pytest.raises(ValueError):
            resume_task(store, "t", bad, expected_attempt_id="a", expected_generation=0)
    assert sum(proxy.calls.values()) == 0


def _lying(result: object) -> StoreProxy:
    answer = lambda inner, *args, **kwargs: result  # noqa: E731
    return StoreProxy(
        MemoryStore(),
        try_claim_task=answer,
        try_recover_task=answer,
        try_wait_task=answer,
        try_resume_task=answer,
    )


class _Request(TypedDict):
    expected_attempt_id: str
    expected_generation: int


REQUEST: _Request = {"expected_attempt_id": "a", "expected_generation": 0}


@pytest.mark.parametrize(
    "result",
    [
        TaskClaimResult("other", "a", "r", 0, 0),
        TaskClaimResult("t", "b", "r", 0, 0),
        TaskClaimResult("t", "a", "r", 0, 1),
    ],
)
def test_fn_04_claim_rejects_contradictory_store_results(result: TaskClaimResult) -> None:
    with pytest.raises(StoreContractError, match="mismatched fields"):
        claim_task(as_store(_lying(result)), "t", **REQUEST)


def test_fn_04_results_outside_the_protocol_are_contract_errors() -> None:
    store = as_store(_lying(object()))
    with pytest.raises(StoreContractError):
        claim_task(store, "t", **REQUEST)
    with pytest.raises(StoreContractError):
        recover_task(store, "t", **REQUEST)
    with pytest.raises(StoreContractError):
        wait_task(store, "t", "w", **REQUEST)
    with pytest.raises(StoreContractError):
        resume_task(store, "t", "w", **REQUEST)


def test_fn_04_recover_wait_and_resume_compare_their_fields() -> None:
    with pytest.raises(StoreContractError, match="mismatched fields"):
        recover_task(as_store(_lying(TaskRecoveryResult("t", "x", "y", "r", 0, 0))), "t", **REQUEST)
    with pytest.raises(StoreContractError, match="mismatched fields"):
        wait_task(
            as_store(_lying(TaskWaitResult("t", "a", "r", 0, 0, "other"))), "t", "w", **REQUEST
        )
    with pytest.raises(StoreContractError, match="mismatched fields"):
        resume_task(
            as_store(_lying(TaskResumeResult("t", "a", "b", "r", 0, 1, "w"))), "t", "w", **REQUEST
        )
    good = TaskResumeResult("t", "a", "b", "r", 0, 0, "w")
    assert resume_task(as_store(_lying(good)), "t", "w", **REQUEST) == good


# --- RT-03 ------------------------------------------------------------------


def _failed_run() -> MemoryStore:
    store = MemoryStore()
    log = new_run(store, chain(2))
    FakeWorker(store, log, handlers={"n1": lambda item: Fail("bad")}).drain()
    assert store.get_run_status("run-1") is RunStatus.FAILED
    return store


@pytest.mark.parametrize(
    ("boundary", "message"),
    [
        ([], "must not be empty"),
        ([1.0], "integers"),
        ([True], "integers"),
        (["1"], "integers"),
        ([-1], "invalid"),
    ],
)
def test_rt_03_boundary_is_validated(boundary: list[object], message: str) -> None:
    proxy = StoreProxy(_failed_run())
    with pytest.raises(ValueError, match=message):
        retry_run(as_store(proxy), "run-1", boundary)  # type: ignore[arg-type]
    assert proxy.calls["try_reopen_run"] == 0


def test_rt_03_boundary_is_sorted_and_deduplicated_before_the_store() -> None:
    seen: list[object] = []

    def reopen(inner: MemoryStore, run_id: str, boundary: object) -> object:
        seen.append(boundary)
        return inner.try_reopen_run(run_id, boundary)  # type: ignore[arg-type]

    store = as_store(StoreProxy(_failed_run(), try_reopen_run=reopen))
    result = retry_run(store, "run-1", iter([1, 1]))
    assert seen == [(1,)]
    assert result.affected_nodes == (1,)
    assert dict(result.generations) == {1: 1}
    assert result.retry_count == 1


def test_rt_03_rejections_and_malformed_results() -> None:
    store = _failed_run()
    with pytest.raises(RetryRejectedError):
        retry_run(store, "missing")
    liar = as_store(StoreProxy(store, try_reopen_run=lambda inner, *a: "reopened"))
    with pytest.raises(StoreContractError):
        retry_run(liar, "run-1")
    inexact = RunReopenResult((1,), 1, {1: 1})
    object.__setattr__(inexact, "generations", {1: 1, 2: 1})
    liar = as_store(StoreProxy(store, try_reopen_run=lambda inner, *a: inexact))
    with pytest.raises(StoreContractError, match="different generation set"):
        retry_run(liar, "run-1")
    # Nothing above reached the real store's reopen.
    assert store.get_run_status("run-1") is RunStatus.FAILED


# --- TI-01 / TI-02 -------------------------------------------------------------


class _Resolver:
    def __init__(self, answer: Any = None, error: Exception | None = None) -> None:
        self.answer = answer
        self.error = error
        self.requests: list[tuple[str, tuple[str, ...]]] = []

    def resolve_outputs(
        self, run_id: str, output_ids: tuple[str, ...]
    ) -> Mapping[str, ResolvedOutput]:
        self.requests.append((run_id, output_ids))
        if self.error is not None:
            raise self.error
        if self.answer is not None:
            return self.answer  # type: ignore[no-any-return]
        return {oid: ResolvedOutput(id=oid, fields={"k": oid}) for oid in output_ids}


def _plan(*edges: tuple[str, tuple[str, ...]]) -> TaskInputPlan:
    return TaskInputPlan(
        generation=0,
        edges=tuple(
            PlannedEdgeInput(edge=name, source_index=0, role=InputRole.MAIN, output_ids=ids)
            for name, ids in edges
        ),
        parameters={"p": 1},
    )


def test_ti_01_one_bulk_unique_request_and_plan_order() -> None:
    resolver = _Resolver()
    plan = _plan(("left", ("b", "a")), ("right", ("a", "c")))
    inputs = resolve_task_inputs(resolver, run_id="run-1", plan=plan)
    assert resolver.requests == [("run-1", ("b", "a", "c"))]
    assert [o.id for o in inputs.edges["left"]] == ["b", "a"]
    assert [o.id for o in inputs.edges["right"]] == ["a", "c"]
    assert inputs.parameters == {"p": 1}
    empty = _Resolver()
    assert dict(resolve_task_inputs(empty, run_id="r", plan=_plan()).edges) == {}
    assert empty.requests == [("r", ())]


@pytest.mark.parametrize(
    "answer",
    [
        {},  # missing
        {"a": ResolvedOutput(id="a"), "z": ResolvedOutput(id="z")},  # extra
        {"a": ResolvedOutput(id="b")},  # key/id mismatch
        {"a": {"id": "a"}},  # not a ResolvedOutput
        [("a", ResolvedOutput(id="a"))],  # not a mapping
    ],
)
def test_ti_02_resolver_must_return_exactly_the_requested_outputs(answer: object) -> None:
    with pytest.raises(MaterializationError):
        resolve_task_inputs(_Resolver(answer), run_id="r", plan=_plan(("e", ("a",))))


def test_ti_02_resolver_failure_is_wrapped() -> None:
    cause = OSError("disk gone")
    with pytest.raises(MaterializationError, match="materializer failed") as info:
        resolve_task_inputs(_Resolver(error=cause), run_id="r", plan=_plan(("e", ("a",))))
    assert info.value.__cause__ is cause


def test_claimed_memory_task_is_running() -> None:
    store = MemoryStore()
    new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)
    claimed = claim_task(
        store, record.task_id, expected_attempt_id=record.attempt_id, expected_generation=0
    )
    assert claimed is not None
    assert only_task(store, "run-1", 0).status is TaskStatus.RUNNING
