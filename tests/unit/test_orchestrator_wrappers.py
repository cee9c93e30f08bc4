"""Request validation and result checking of the wrappers (FN-04, RT-03, TI-01, TI-02)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypedDict

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.completions import complete_attempts
from dagwerk.constants import InputRole, RunStatus, TaskStatus
from dagwerk.errors import MaterializationError
from dagwerk.execution import claim_task, recover_task
from dagwerk.models import NodeLaunch, PlannedEdgeInput, ResolvedOutput, TaskInputPlan
from dagwerk.orchestrator import (
    on_task_complete,
    on_task_crashed,
    on_task_failed,
    reconcile_run,
    start_run,
)
from dagwerk.retry import RetryRejectedError, rerun_nodes, retry_run
from dagwerk.store import (
    CompletionRequest,
    RunReopenResult,
    StoreContractError,
    TaskClaimResult,
    TaskCompletionResult,
    TaskFailureResult,
    TaskRecord,
    TaskRecoveryResult,
    TaskResumeResult,
    TaskWaitResult,
)
from dagwerk.task_input import resolve_task_inputs
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
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
    ("result", "message"),
    [
        (
            TaskClaimResult("other", "a", "r", 0, 0),
            "try_claim_task returned task_id 'other'; expected 't'",
        ),
        (
            TaskClaimResult("t", "b", "r", 0, 0),
            "try_claim_task returned attempt_id 'b'; expected 'a'",
        ),
        (
            TaskClaimResult("t", "a", "r", 0, 1),
            "try_claim_task returned generation 1; expected 0",
        ),
    ],
)
def test_fn_04_claim_rejects_contradictory_store_results(
    result: TaskClaimResult, message: str
) -> None:
    with pytest.raises(StoreContractError) as info:
        claim_task(as_store(_lying(result)), "t", **REQUEST)
    assert str(info.value) == message
    assert info.value.field == message.split()[2]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda store: claim_task(store, "t", **REQUEST),
            "try_claim_task returned dict; expected TaskClaimResult or None",
        ),
        (
            lambda store: recover_task(store, "t", **REQUEST),
            "try_recover_task returned dict; expected TaskRecoveryResult or None",
        ),
        (
            lambda store: wait_task(store, "t", "w", **REQUEST),
            "try_wait_task returned dict; expected TaskWaitResult or None",
        ),
        (
            lambda store: resume_task(store, "t", "w", **REQUEST),
            "try_resume_task returned dict; expected TaskResumeResult or None",
        ),
    ],
    ids=["claim", "recover", "wait", "resume"],
)
def test_fn_04_results_outside_the_protocol_name_what_came_back(
    call: Callable[[ContractStore], object], message: str
) -> None:
    with pytest.raises(StoreContractError) as info:
        call(as_store(_lying({"task_id": "t"})))
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda store: recover_task(store, "t", **REQUEST),
            "try_recover_task returned abandoned_attempt_id 'x'; expected 'a'",
        ),
        (
            lambda store: wait_task(store, "t", "w", **REQUEST),
            "try_wait_task returned wait_id 'other'; expected 'w'",
        ),
        (
            lambda store: resume_task(store, "t", "w", **REQUEST),
            "try_resume_task returned generation 1; expected 0",
        ),
    ],
    ids=["recover", "wait", "resume"],
)
def test_fn_04_recover_wait_and_resume_compare_their_fields(
    call: Callable[[ContractStore], object], message: str
) -> None:
    proxy = StoreProxy(
        MemoryStore(),
        try_recover_task=lambda inner, *a, **k: TaskRecoveryResult("t", "x", "y", "r", 0, 0),
        try_wait_task=lambda inner, *a, **k: TaskWaitResult("t", "a", "r", 0, 0, "other"),
        try_resume_task=lambda inner, *a, **k: TaskResumeResult("t", "a", "b", "r", 0, 1, "w"),
    )
    with pytest.raises(StoreContractError) as info:
        call(as_store(proxy))
    assert str(info.value) == message


def test_fn_04_a_matching_resume_result_is_returned() -> None:
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
    with pytest.raises(StoreContractError) as info:
        retry_run(liar, "run-1")
    assert str(info.value) == "try_reopen_run returned str; expected RunReopenResult or None"
    inexact = RunReopenResult((1,), 1, {1: 1})
    object.__setattr__(inexact, "generations", {1: 1, 2: 1})
    liar = as_store(StoreProxy(store, try_reopen_run=lambda inner, *a: inexact))
    with pytest.raises(StoreContractError) as info:
        retry_run(liar, "run-1")
    assert str(info.value) == (
        "try_reopen_run returned generations for nodes [1, 2]; expected the affected nodes [1]"
    )
    assert info.value.field == "generations"
    # Nothing above reached the real store's reopen.
    assert store.get_run_status("run-1") is RunStatus.FAILED


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("reopened", "try_rerun_nodes returned str; expected RunReopenResult or None"),
        (
            RunReopenResult((0, 1, 2), 1, {0: 1, 1: 1, 2: 1}),
            None,
        ),
        (
            RunReopenResult((1,), 1, {1: 1}),
            "try_rerun_nodes returned affected nodes [1]; "
            "expected them to include the requested nodes [0, 1]",
        ),
    ],
)
def test_rt_03_rerun_results_are_checked(answer: object, message: str | None) -> None:
    store = as_store(StoreProxy(MemoryStore(), try_rerun_nodes=lambda inner, *a: answer))
    if message is None:
        assert rerun_nodes(store, "run-1", [1, 0]).affected_nodes == (0, 1, 2)
        return
    with pytest.raises(StoreContractError) as info:
        rerun_nodes(store, "run-1", [1, 0])
    assert str(info.value) == message


def test_rt_03_rerun_generations_must_be_the_affected_nodes() -> None:
    inexact = RunReopenResult((1,), 1, {1: 1})
    object.__setattr__(inexact, "generations", {1: 1, 2: 1})
    store = as_store(StoreProxy(MemoryStore(), try_rerun_nodes=lambda inner, *a: inexact))
    with pytest.raises(StoreContractError) as info:
        rerun_nodes(store, "run-1", [1])
    assert str(info.value) == (
        "try_rerun_nodes returned generations for nodes [1, 2]; expected the affected nodes [1]"
    )


# --- the orchestrator's checks of what a store answers ---------------------------


def _running_task(store: MemoryStore) -> TaskRecord:
    """A RUNNING task of node 0 of ``run-1`` (``n0 -> n1``)."""
    new_run(store, chain(2))
    record = only_task(store, "run-1", 0)
    assert claim_task(
        store, record.task_id, expected_attempt_id=record.attempt_id, expected_generation=0
    )
    return record


def _settle(kind: str, store: ContractStore, record: TaskRecord) -> None:
    callbacks = CallbackLog().callbacks
    options: dict[str, Any] = {
        "task_id": record.task_id,
        "expected_attempt_id": record.attempt_id,
        "callbacks": callbacks,
    }
    if kind == "complete":
        on_task_complete(store, **options)
    elif kind == "fail":
        on_task_failed(store, error_message="bad", **options)
    else:
        on_task_crashed(store, error_message="lost", **options)


@pytest.mark.parametrize(
    ("kind", "operation", "answer", "message"),
    [
        (
            "complete",
            "try_complete_task",
            lambda record: {"done": True},
            "try_complete_task returned dict; expected TaskCompletionResult or None",
        ),
        (
            "complete",
            "try_complete_task",
            lambda record: TaskCompletionResult(record.task_id, "other", "run-1", 0, 0, True),
            "try_complete_task returned attempt_id 'other'; expected {attempt}",
        ),
        (
            "fail",
            "mark_task_failed",
            lambda record: "failed",
            "mark_task_failed returned str; expected TaskFailureResult or None",
        ),
        (
            "crash",
            "mark_task_crashed",
            lambda record: TaskFailureResult(
                record.task_id, record.attempt_id, "run-1", 0, 0, TaskStatus.FAILED
            ),
            "mark_task_crashed returned status 'failed'; expected 'crashed'",
        ),
    ],
)
def test_settlement_results_name_what_came_back(
    kind: str, operation: str, answer: Callable[[TaskRecord], object], message: str
) -> None:
    inner = MemoryStore()
    record = _running_task(inner)
    store = as_store(StoreProxy(inner, **{operation: lambda inner, *a, **k: answer(record)}))
    with pytest.raises(StoreContractError) as info:
        _settle(kind, store, record)
    assert str(info.value) == message.format(attempt=repr(record.attempt_id))


def _launch_0(inner: MemoryStore) -> NodeLaunch:
    return inner.list_node_launches("run-1")[0]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            lambda inner: [_launch_0(inner)],
            "list_node_launches returned list; expected a Mapping of node index to NodeLaunch",
        ),
        (
            lambda inner: {0: "launch"},
            "list_node_launches returned str for node 0; expected NodeLaunch",
        ),
        (
            lambda inner: {1: _launch_0(inner)},
            "list_node_launches returned the launch of node 0 under key 1; "
            "expected its node index, one of 0..1",
        ),
        (
            lambda inner: {0: _launch_0(inner).model_copy(update={"run_id": "other"})},
            "list_node_launches for node 0 returned run_id 'other'; expected 'run-1'",
        ),
    ],
)
def test_launch_reads_name_what_came_back(
    answer: Callable[[MemoryStore], object], message: str
) -> None:
    inner = MemoryStore()
    new_run(inner, chain(2))
    store = as_store(StoreProxy(inner, list_node_launches=lambda inner, *a: answer(inner)))
    with pytest.raises(StoreContractError) as info:
        reconcile_run(store, "run-1", callbacks=CallbackLog().callbacks)
    assert str(info.value) == message


def test_a_snapshot_outside_the_protocol_names_what_came_back() -> None:
    inner = MemoryStore()
    inner.create_run("run-1", chain(2))
    store = as_store(StoreProxy(inner, get_planning_snapshot=lambda inner, *a, **k: None))
    with pytest.raises(StoreContractError) as info:
        start_run(store, "run-1", callbacks=CallbackLog().callbacks)
    assert str(info.value) == "get_planning_snapshot returned NoneType; expected PlanningSnapshot"


def test_a_cached_topology_outside_the_protocol_names_what_came_back() -> None:
    store = MemoryStore()
    store.create_run("run-1", chain(2))

    def lying(run_id: str) -> Any:
        return "topology"

    store.get_run_topology = lying  # type: ignore[method-assign]
    with pytest.raises(StoreContractError) as info:
        start_run(store, "run-1", callbacks=CallbackLog().callbacks)
    assert str(info.value) == "get_run_topology returned str; expected RunTopology or None"


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            lambda record: "ok",
            "complete_and_ack returned str; expected a list of one outcome per request",
        ),
        (lambda record: [], "complete_and_ack returned 0 outcomes; expected 1 (one per request)"),
        (
            lambda record: [TaskCompletionResult("other", record.attempt_id, "run-1", 0, 0, True)],
            "complete_and_ack returned task_id 'other'; expected {task}",
        ),
    ],
)
def test_batched_completions_name_what_came_back(
    answer: Callable[[TaskRecord], object], message: str
) -> None:
    store = MemoryStore()
    record = _running_task(store)

    def lying(worker_id: str, requests: object) -> Any:
        return answer(record)

    store.complete_and_ack = lying  # type: ignore[method-assign]
    request = CompletionRequest(record.task_id, record.attempt_id, (), "delivery-1")
    with pytest.raises(StoreContractError) as info:
        complete_attempts(store, "w", [request], callbacks=CallbackLog().callbacks)
    assert str(info.value) == message.format(task=repr(record.task_id))


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
