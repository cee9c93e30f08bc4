"""Result records and validation helpers of dagwerk.store, and the transition table."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from dagwerk.constants import (
    MAX_OUTPUTS_PER_TASK_COMPLETION,
    MAX_TASK_COMPLETION_ROUTING_BYTES,
    RunStatus,
    TaskStatus,
)
from dagwerk.errors import DagwerkError
from dagwerk.store import (
    NodeLaunchRef,
    OutputPublicationError,
    RunReopenResult,
    StoreContractError,
    TaskAttemptRef,
    TaskClaimResult,
    TaskCompletionResult,
    TaskFailureResult,
    TaskRecoveryResult,
    TaskResumeResult,
    TaskWaitResult,
    validate_output_batch_routing_size,
    validate_output_batch_size,
    validate_wait_id,
)
from dagwerk.transitions import (
    RUN_TRANSITIONS,
    TASK_TRANSITIONS,
    InvalidTransitionError,
    check_run_transition,
    check_task_transition,
)


def test_store_errors_subclass_the_root_and_the_seed_bases() -> None:
    assert issubclass(StoreContractError, DagwerkError)
    assert issubclass(StoreContractError, RuntimeError)
    assert issubclass(OutputPublicationError, DagwerkError)
    assert issubclass(OutputPublicationError, ValueError)


# --- WT-01 wait ids -------------------------------------------------------


def test_wt_01_wait_ids_are_validated() -> None:
    for bad in ("", "a\x00b", "x" * 513, 7, None, b"key"):
        with pytest.raises(ValueError):
            validate_wait_id(bad)
    validate_wait_id("x" * 512)
    validate_wait_id("  spaced  ")
    with pytest.raises(ValueError, match="maximum is 4"):
        validate_wait_id("abcde", limit=4)


# --- LM-17 / LM-18 batch limits ------------------------------------------


def test_lm_17_output_batch_size_limit_and_message() -> None:
    validate_output_batch_size(MAX_OUTPUTS_PER_TASK_COMPLETION)
    with pytest.raises(OutputPublicationError) as info:
        validate_output_batch_size(MAX_OUTPUTS_PER_TASK_COMPLETION + 1)
    assert (
        f"task completion contains {MAX_OUTPUTS_PER_TASK_COMPLETION + 1} outputs; "
        f"maximum is {MAX_OUTPUTS_PER_TASK_COMPLETION}"
    ) in str(info.value)
    assert info.value.limit == MAX_OUTPUTS_PER_TASK_COMPLETION
    with pytest.raises(OutputPublicationError, match="contains 3 outputs; maximum is 2"):
        validate_output_batch_size(3, limit=2)
    with pytest.raises(ValueError):
        validate_output_batch_size(-1)
    with pytest.raises(ValueError):
        validate_output_batch_size(True)


def test_lm_18_output_batch_routing_limit_and_message() -> None:
    validate_output_batch_routing_size(MAX_TASK_COMPLETION_ROUTING_BYTES)
    with pytest.raises(OutputPublicationError, match="routing data is 11 bytes; maximum is 10"):
        validate_output_batch_routing_size(11, limit=10)
    with pytest.raises(OutputPublicationError, match="task completion routing data is"):
        validate_output_batch_routing_size(MAX_TASK_COMPLETION_ROUTING_BYTES + 1)


# --- result dataclass invariants -----------------------------------------


def test_results_reject_empty_ids_and_non_strict_indices() -> None:
    with pytest.raises(ValueError):
        TaskAttemptRef("", "a")
    with pytest.raises(ValueError):
        NodeLaunchRef("l", True, 0)
    with pytest.raises(ValueError):
        TaskClaimResult("t", "a", "r", 0, -1)
    with pytest.raises(ValueError):
        TaskClaimResult("t", "a", "r", 0, 0, resumed_from_wait_id="")
    with pytest.raises(ValueError):
        TaskWaitResult("t", "a", "r", 0, 0, "bad\x00")
    claim = TaskClaimResult("t", "a", "r", 0, 0)
    assert claim.resumed_from_wait_id is None


def test_replacement_results_need_a_different_attempt() -> None:
    with pytest.raises(ValueError, match="differ"):
        TaskRecoveryResult("t", "a", "a", "r", 0, 0)
    with pytest.raises(ValueError, match="differ"):
        TaskResumeResult("t", "a", "a", "r", 0, 0, "w")
    assert TaskRecoveryResult("t", "a", "b", "r", 0, 0).recovered_attempt_id == "b"


def test_completion_and_failure_result_invariants() -> None:
    with pytest.raises(ValueError, match="bool"):
        TaskCompletionResult("t", "a", "r", 0, 0, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="FAILED or CRASHED"):
        TaskFailureResult("t", "a", "r", 0, 0, TaskStatus.COMPLETED)
    assert TaskFailureResult("t", "a", "r", 0, 0, TaskStatus.CRASHED).status is TaskStatus.CRASHED


def test_rt_12_run_reopen_result_copies_and_freezes_generations() -> None:
    source = {2: 1, 1: 3}
    result = RunReopenResult((1, 2), 1, source)
    source[2] = 99
    assert dict(result.generations) == {1: 3, 2: 1}
    assert isinstance(result.generations, MappingProxyType)
    with pytest.raises(TypeError):
        result.generations[1] = 5  # type: ignore[index]
    assert RunReopenResult((), 1, {}).affected_nodes == ()


@pytest.mark.parametrize(
    ("affected", "retry_count", "generations"),
    [
        ((2, 1), 1, {1: 1, 2: 1}),  # unsorted
        ((1, 1), 1, {1: 1}),  # duplicate
        ((-1,), 1, {-1: 1}),  # negative
        ((True,), 1, {1: 1}),  # bool index
        ((1,), 0, {1: 1}),  # retry count below 1
        ((1,), True, {1: 1}),  # bool retry count
        ((1,), 1, {1: 0}),  # generation below 1
        ((1,), 1, {1: 1.0}),  # non-int generation
        ((1,), 1, {2: 1}),  # keys differ from affected
        ([1], 1, {1: 1}),  # not a tuple
    ],
)
def test_rt_12_run_reopen_result_rejects_non_integer_state(
    affected: object, retry_count: object, generations: object
) -> None:
    with pytest.raises(ValueError):
        RunReopenResult(affected, retry_count, generations)  # type: ignore[arg-type]


# --- SM-02 / SM-04 transition table ---------------------------------------


def test_sm_02_run_transition_table() -> None:
    assert RUN_TRANSITIONS[RunStatus.COMPLETED] == {RunStatus.RUNNING}
    assert RUN_TRANSITIONS[RunStatus.PENDING] == {
        RunStatus.RUNNING,
        RunStatus.FAILED,
        RunStatus.CRASHED,
        RunStatus.CANCELLED,
    }
    for status in (RunStatus.FAILED, RunStatus.CRASHED, RunStatus.CANCELLED):
        assert RUN_TRANSITIONS[status] == {RunStatus.RUNNING}
    assert check_run_transition(RunStatus.FAILED, RunStatus.RUNNING) == "reopen"
    # Only a node re-run reopens a COMPLETED run; run retry never does.
    assert check_run_transition(RunStatus.COMPLETED, RunStatus.RUNNING) == "rerun"
    with pytest.raises(InvalidTransitionError, match="completed -> failed"):
        check_run_transition(RunStatus.COMPLETED, RunStatus.FAILED)
    with pytest.raises(InvalidTransitionError):
        check_run_transition(RunStatus.PENDING, RunStatus.COMPLETED)


def test_sm_04_task_transition_table() -> None:
    assert check_task_transition(TaskStatus.QUEUED, TaskStatus.RUNNING) == "claim"
    assert check_task_transition(TaskStatus.RUNNING, TaskStatus.WAITING) == "wait"
    assert check_task_transition(TaskStatus.WAITING, TaskStatus.QUEUED) == "resume"
    assert check_task_transition(TaskStatus.RUNNING, TaskStatus.QUEUED) == "recover"
    assert check_task_transition(TaskStatus.CRASHED, TaskStatus.QUEUED) == "retry"
    for terminal in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED):
        assert TASK_TRANSITIONS[terminal] == frozenset()
    # Claiming a waiting task or completing a queued one is never allowed.
    for old, new in [
        (TaskStatus.WAITING, TaskStatus.RUNNING),
        (TaskStatus.QUEUED, TaskStatus.COMPLETED),
        (TaskStatus.QUEUED, TaskStatus.FAILED),
        (TaskStatus.CRASHED, TaskStatus.CANCELLED),
    ]:
        with pytest.raises(InvalidTransitionError):
            check_task_transition(old, new)
