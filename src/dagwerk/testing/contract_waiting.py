"""Contract tests: waiting, resumption and recovery (WT-01..WT-16), and the
stored wait records of :class:`~dagwerk.store.WaitRecordStore`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dagwerk._protocols import implements
from dagwerk.constants import MAX_WAIT_ID_LENGTH, RunStatus, TaskStatus
from dagwerk.execution import recover_task
from dagwerk.orchestrator import abort_run, cancel_run, on_task_failed, reconcile_run
from dagwerk.retry import retry_run, retry_task
from dagwerk.store import (
    DagRetryStore,
    DagRunStore,
    DagStore,
    DagWaitStore,
    DelayedRetryStore,
    NodeRerunStore,
    OutputResolver,
    StoreContractError,
    TaskResumeResult,
    TaskWaitResult,
    WaitRecord,
    WaitRecordStore,
    WaitResponseStore,
)
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    StoreProxy,
    as_store,
    chain,
    claim,
    deliveries_for,
    emit,
    fingerprint,
    launch_of,
    new_run,
    only_task,
    root,
    task,
)
from dagwerk.waiting import resume_task, wait_task


def _running(store: ContractStore, nodes: Any = None) -> tuple[CallbackLog, str, str, int]:
    log = new_run(store, nodes if nodes is not None else [root("a"), root("b")])
    record = only_task(store, "run-1", 0)
    claim(store, record)
    return log, record.task_id, record.attempt_id, record.generation


def _wait(store: ContractStore, tid: str, wid: str, aid: str, gen: int) -> TaskWaitResult | None:
    return wait_task(store, tid, wid, expected_attempt_id=aid, expected_generation=gen)


def _resume(
    store: ContractStore, tid: str, wid: str, aid: str, gen: int
) -> TaskResumeResult | None:
    return resume_task(store, tid, wid, expected_attempt_id=aid, expected_generation=gen)


# --- WT-01 .. WT-04 ------------------------------------------------------------


@pytest.mark.parametrize("wait_id", ["", "x" * (MAX_WAIT_ID_LENGTH + 1), "a\x00b", 7, None])
def test_wt_01_wait_ids_are_validated_before_the_store(store: ContractStore, wait_id: Any) -> None:
    _, tid, aid, gen = _running(store)
    proxy = StoreProxy(store)
    with pytest.raises(ValueError):
        wait_task(as_store(proxy), tid, wait_id, expected_attempt_id=aid, expected_generation=gen)
    with pytest.raises(ValueError):
        resume_task(as_store(proxy), tid, wait_id, expected_attempt_id=aid, expected_generation=gen)
    assert proxy.calls["try_wait_task"] == proxy.calls["try_resume_task"] == 0
    assert task(store, tid).status is TaskStatus.RUNNING


@pytest.mark.parametrize("wait_id", ["  spaced key\t", "k" * MAX_WAIT_ID_LENGTH])
def test_wt_01_wait_ids_keep_whitespace_and_reach_the_limit(
    store: ContractStore, wait_id: str
) -> None:
    _, tid, aid, gen = _running(store)
    result = _wait(store, tid, wait_id, aid, gen)
    assert result is not None
    assert result.wait_id == wait_id
    assert task(store, tid).active_wait_id == wait_id
    resumed = _resume(store, tid, wait_id, aid, gen)
    assert resumed is not None
    assert resumed.wait_id == wait_id


def test_wt_02_running_attempt_enters_waiting_without_dispatch(store: ContractStore) -> None:
    _, tid, aid, gen = _running(store)
    before = task(store, tid)
    rows = store.list_deliveries("run-1")
    result = _wait(store, tid, "approval", aid, gen)
    assert isinstance(result, TaskWaitResult)
    assert (result.task_id, result.attempt_id, result.run_id) == (tid, aid, "run-1")
    assert (result.node_index, result.generation, result.wait_id) == (0, gen, "approval")
    after = task(store, tid)
    assert after.status is TaskStatus.WAITING
    assert (after.attempt_id, after.plan, after.generation) == (aid, before.plan, gen)
    assert after.active_wait_id == "approval"
    # No new attempt, no outbox row, and the entering delivery is not acked.
    assert store.list_deliveries("run-1") == rows
    launch = launch_of(store, "run-1", 0)
    assert launch is not None
    assert launch.complete is False
    assert store.get_run_status("run-1") is RunStatus.RUNNING


def test_wt_02_wait_rejects_wrong_attempt_generation_and_states(store: ContractStore) -> None:
    log, tid, aid, gen = _running(store)
    queued = only_task(store, "run-1", 1)
    snapshot = fingerprint(store, "run-1")
    assert store.try_wait_task(tid, "w", expected_attempt_id="x", expected_generation=gen) is None
    assert (
        store.try_wait_task(tid, "w", expected_attempt_id=aid, expected_generation=gen + 1) is None
    )
    assert (
        store.try_wait_task(
            queued.task_id, "w", expected_attempt_id=queued.attempt_id, expected_generation=0
        )
        is None
    )
    assert fingerprint(store, "run-1") == snapshot
    assert _wait(store, tid, "w", aid, gen) is not None
    # A different wait while waiting is refused.
    assert store.try_wait_task(tid, "w2", expected_attempt_id=aid, expected_generation=gen) is None
    assert task(store, tid).active_wait_id == "w"
    abort_run(store, run_id="run-1", reason="x", callbacks=log.callbacks)
    assert (
        store.try_wait_task(
            queued.task_id, "w3", expected_attempt_id=queued.attempt_id, expected_generation=0
        )
        is None
    )


def test_wt_03_repeated_wait_returns_the_same_result(store: ContractStore) -> None:
    log, tid, aid, gen = _running(store)
    first = _wait(store, tid, "w", aid, gen)
    assert first is not None
    snapshot = fingerprint(store, "run-1")
    assert _wait(store, tid, "w", aid, gen) == first
    assert fingerprint(store, "run-1") == snapshot
    # Same wait ID, another attempt or generation: not a repeat.
    assert store.try_wait_task(tid, "w", expected_attempt_id="x", expected_generation=gen) is None
    assert (
        store.try_wait_task(tid, "w", expected_attempt_id=aid, expected_generation=gen + 1) is None
    )
    # Still replayable after the wait was resolved ...
    assert _resume(store, tid, "w", aid, gen) is not None
    assert _wait(store, tid, "w", aid, gen) == first
    # ... and after the run was cancelled.
    cancel_run(store, "run-1", callbacks=log.callbacks)
    assert _wait(store, tid, "w", aid, gen) == first


def test_wt_03_repeated_wait_survives_invalidation(store: ContractStore) -> None:
    log, tid, aid, gen = _running(store)
    first = _wait(store, tid, "w", aid, gen)
    abort_run(store, run_id="run-1", reason="x", callbacks=log.callbacks)
    retry_run(store, "run-1")
    assert _wait(store, tid, "w", aid, gen) == first


def test_wt_04_wait_ids_are_never_reused_by_a_task(store: ContractStore) -> None:
    _, tid, aid, gen = _running(store)
    assert _wait(store, tid, "first", aid, gen)
    resumed = _resume(store, tid, "first", aid, gen)
    assert resumed is not None
    second_attempt = resumed.resumed_attempt_id
    claim(store, task(store, tid))
    assert _wait(store, tid, "first", second_attempt, gen) is None
    assert task(store, tid).status is TaskStatus.RUNNING
    assert _wait(store, tid, "second", second_attempt, gen) is not None
    again = _resume(store, tid, "second", second_attempt, gen)
    assert again is not None
    assert len({aid, second_attempt, again.resumed_attempt_id}) == 3


# --- WT-05 .. WT-10 ------------------------------------------------------------


def test_wt_05_resume_creates_exactly_one_new_attempt(store: ContractStore) -> None:
    _, tid, aid, gen = _running(store)
    before = task(store, tid)
    _wait(store, tid, "w", aid, gen)
    rows = len(store.list_deliveries("run-1"))
    result = _resume(store, tid, "w", aid, gen)
    assert isinstance(result, TaskResumeResult)
    assert (result.task_id, result.waiting_attempt_id, result.wait_id) == (tid, aid, "w")
    assert result.resumed_attempt_id != aid
    after = task(store, tid)
    assert after.status is TaskStatus.QUEUED
    assert after.attempt_id == result.resumed_attempt_id
    assert (after.plan, after.generation) == (before.plan, gen)
    assert after.resumed_from_wait_id == "w"
    assert after.active_wait_id is None
    new_rows = [d for d in deliveries_for(store, tid) if d.attempt_id == after.attempt_id]
    assert len(new_rows) == 1
    assert len(store.list_deliveries("run-1")) == rows + 1


def test_wt_05_resume_rejects_wrong_wait_attempt_or_generation(store: ContractStore) -> None:
    _, tid, aid, gen = _running(store)
    _wait(store, tid, "w", aid, gen)
    snapshot = fingerprint(store, "run-1")
    assert _resume(store, tid, "unknown", aid, gen) is None
    assert _resume(store, tid, "w", "other", gen) is None
    assert _resume(store, tid, "w", aid, gen + 1) is None
    assert fingerprint(store, "run-1") == snapshot
    assert task(store, tid).status is TaskStatus.WAITING


def test_wt_06_repeated_resume_returns_the_first_result(store: ContractStore) -> None:
    log, tid, aid, gen = _running(store)
    _wait(store, tid, "w", aid, gen)
    first = _resume(store, tid, "w", aid, gen)
    assert first is not None
    snapshot = fingerprint(store, "run-1")
    assert _resume(store, tid, "w", aid, gen) == first
    assert fingerprint(store, "run-1") == snapshot
    # ... after the task completed,
    current = task(store, tid)
    claim(store, current)
    assert store.try_complete_task(tid, emit("o"), expected_attempt_id=current.attempt_id)
    assert _resume(store, tid, "w", aid, gen) == first
    # ... after the run was cancelled and then reopened with a new generation.
    cancel_run(store, "run-1", callbacks=log.callbacks)
    assert _resume(store, tid, "w", aid, gen) == first
    retry_run(store, "run-1")
    rows = store.list_deliveries("run-1")
    assert _resume(store, tid, "w", aid, gen) == first
    # A replay creates no attempt and no outbox row.
    assert store.list_deliveries("run-1") == rows
    assert task(store, tid).attempt_id == first.resumed_attempt_id


@pytest.mark.parametrize("how", ["cancelled", "failed_elsewhere", "run_retry"])
def test_wt_07_wait_invalidated_before_resumption_cannot_resume(
    store: ContractStore, how: str
) -> None:
    log, tid, aid, gen = _running(store)
    _wait(store, tid, "w", aid, gen)
    if how == "cancelled":
        assert cancel_run(store, "run-1", callbacks=log.callbacks)
    else:
        other = only_task(store, "run-1", 1)
        claim(store, other)
        on_task_failed(
            store,
            task_id=other.task_id,
            expected_attempt_id=other.attempt_id,
            error_message="boom",
            callbacks=log.callbacks,
        )
        assert store.get_run_status("run-1") is RunStatus.FAILED
        if how == "run_retry":
            retry_run(store, "run-1")
            reconcile_run(store, "run-1", callbacks=log.callbacks)
    assert task(store, tid).status is TaskStatus.CANCELLED
    assert task(store, tid).active_wait_id is None
    rows = store.list_deliveries()
    assert _resume(store, tid, "w", aid, gen) is None
    assert store.list_deliveries() == rows


def test_wt_08_resume_is_not_permission_to_run(store: ContractStore) -> None:
    _, tid, aid, gen = _running(store)
    _wait(store, tid, "w", aid, gen)
    resumed = _resume(store, tid, "w", aid, gen)
    assert resumed is not None
    new_attempt = resumed.resumed_attempt_id
    assert store.try_complete_task(tid, emit("o"), expected_attempt_id=new_attempt) is None
    assert task(store, tid).status is TaskStatus.QUEUED
    won = claim(store, task(store, tid))
    assert won.attempt_id == new_attempt
    assert won.resumed_from_wait_id == "w"


def test_wt_09_waiting_task_blocks_descendants_and_completion(store: ContractStore) -> None:
    log = new_run(store, chain(2))
    top = only_task(store, "run-1", 0)
    claim(store, top)
    _wait(store, top.task_id, "w", top.attempt_id, top.generation)
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    assert launch_of(store, "run-1", 1) is None
    assert not store.try_finalize_run("run-1", RunStatus.COMPLETED)
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert log.kinds() == []


def test_wt_09_parallel_waits_are_independent(store: ContractStore) -> None:
    log = new_run(store, [root("a"), root("b"), root("c")])
    first, second, other = (only_task(store, "run-1", i) for i in range(3))
    for record in (first, second, other):
        claim(store, record)
    _wait(store, first.task_id, "w-a", first.attempt_id, 0)
    _wait(store, second.task_id, "w-b", second.attempt_id, 0)
    # Other branches continue.
    assert store.try_complete_task(other.task_id, emit("c"), expected_attempt_id=other.attempt_id)
    assert _resume(store, first.task_id, "w-a", first.attempt_id, 0) is not None
    assert task(store, first.task_id).status is TaskStatus.QUEUED
    assert task(store, second.task_id).status is TaskStatus.WAITING
    assert task(store, second.task_id).active_wait_id == "w-b"
    assert log.kinds() == []


def test_wt_10_callbacks_from_the_waiting_attempt_are_rejected(store: ContractStore) -> None:
    _, tid, aid, gen = _running(store)
    _wait(store, tid, "w", aid, gen)
    snapshot = fingerprint(store, "run-1")
    assert store.try_complete_task(tid, emit("d", "d"), expected_attempt_id=aid) is None
    assert store.try_complete_task(tid, emit("o"), expected_attempt_id=aid) is None
    assert store.mark_task_failed(tid, "e", expected_attempt_id=aid) is None
    assert store.mark_task_crashed(tid, "e", expected_attempt_id=aid) is None
    assert fingerprint(store, "run-1") == snapshot
    record = task(store, tid)
    assert (record.status, record.error, record.active_wait_id) == (TaskStatus.WAITING, None, "w")


# --- WT-11 .. WT-16 ------------------------------------------------------------


def test_wt_11_wait_and_recovery_first_commit_wins(store: ContractStore) -> None:
    _, tid, aid, gen = _running(store, [root("a"), root("b"), root("c")])
    assert recover_task(store, tid, expected_attempt_id=aid, expected_generation=gen)
    assert store.try_wait_task(tid, "w", expected_attempt_id=aid, expected_generation=gen) is None
    other = only_task(store, "run-1", 1)
    claim(store, other)
    assert _wait(store, other.task_id, "w", other.attempt_id, 0)
    assert (
        store.try_recover_task(
            other.task_id, expected_attempt_id=other.attempt_id, expected_generation=0
        )
        is None
    )
    assert task(store, other.task_id).status is TaskStatus.WAITING


def test_wt_11_wait_and_terminal_result_first_commit_wins(store: ContractStore) -> None:
    _, tid, aid, gen = _running(store, [root("a"), root("b")])
    assert store.mark_task_failed(tid, "e", expected_attempt_id=aid)
    assert store.try_wait_task(tid, "w", expected_attempt_id=aid, expected_generation=gen) is None
    assert task(store, tid).status is TaskStatus.FAILED
    other = only_task(store, "run-1", 1)
    claim(store, other)
    assert _wait(store, other.task_id, "w", other.attempt_id, 0)
    assert store.mark_task_crashed(other.task_id, "e", expected_attempt_id=other.attempt_id) is None
    assert task(store, other.task_id).status is TaskStatus.WAITING


def test_wt_12_recovery_replaces_the_running_attempt(store: ContractStore) -> None:
    _, tid, aid, gen = _running(store)
    before = task(store, tid)
    result = recover_task(store, tid, expected_attempt_id=aid, expected_generation=gen)
    assert result is not None
    assert (result.task_id, result.abandoned_attempt_id, result.generation) == (tid, aid, gen)
    assert result.recovered_attempt_id != aid
    assert result.resumed_from_wait_id is None
    after = task(store, tid)
    assert after.status is TaskStatus.QUEUED
    assert after.attempt_id == result.recovered_attempt_id
    assert after.plan == before.plan
    assert [d.attempt_id for d in deliveries_for(store, tid)].count(after.attempt_id) == 1
    # The abandoned attempt is stale now.
    assert store.try_complete_task(tid, emit("late"), expected_attempt_id=aid) is None
    assert store.mark_task_failed(tid, "late", expected_attempt_id=aid) is None
    assert task(store, tid).status is TaskStatus.QUEUED


def test_wt_12_recovery_requires_the_current_running_attempt(store: ContractStore) -> None:
    log, tid, aid, gen = _running(store, [root("a"), root("b"), root("c")])
    queued = only_task(store, "run-1", 1)
    waiting = only_task(store, "run-1", 2)
    claim(store, waiting)
    _wait(store, waiting.task_id, "w", waiting.attempt_id, 0)
    snapshot = fingerprint(store, "run-1")
    for task_id, attempt, generation in (
        (tid, aid, gen + 1),
        (tid, "other", gen),
        (queued.task_id, queued.attempt_id, 0),
        (waiting.task_id, waiting.attempt_id, 0),
    ):
        assert (
            store.try_recover_task(
                task_id, expected_attempt_id=attempt, expected_generation=generation
            )
            is None
        )
    assert fingerprint(store, "run-1") == snapshot
    # A terminal transition that committed first wins over recovery.
    abort_run(store, run_id="run-1", reason="x", callbacks=log.callbacks)
    assert store.try_recover_task(tid, expected_attempt_id=aid, expected_generation=gen) is None
    assert task(store, tid).status is TaskStatus.CANCELLED


def test_wt_13_recovery_repeats_return_the_original_record(store: ContractStore) -> None:
    log, tid, a1, gen = _running(store)
    first = recover_task(store, tid, expected_attempt_id=a1, expected_generation=gen)
    assert first is not None
    rows = store.list_deliveries("run-1")
    assert recover_task(store, tid, expected_attempt_id=a1, expected_generation=gen) == first
    assert store.list_deliveries("run-1") == rows
    a2 = first.recovered_attempt_id
    claim(store, task(store, tid))
    second = recover_task(store, tid, expected_attempt_id=a2, expected_generation=gen)
    assert second is not None
    a3 = second.recovered_attempt_id
    assert len({a1, a2, a3}) == 3
    # Replaying A -> B after B -> C still returns A -> B.
    assert recover_task(store, tid, expected_attempt_id=a1, expected_generation=gen) == first
    claim(store, task(store, tid))
    assert store.try_complete_task(tid, emit("o"), expected_attempt_id=a3)
    assert recover_task(store, tid, expected_attempt_id=a2, expected_generation=gen) == second
    abort_run(store, run_id="run-1", reason="x", callbacks=log.callbacks)
    retry_run(store, "run-1")
    assert recover_task(store, tid, expected_attempt_id=a1, expected_generation=gen) == first
    assert task(store, tid).attempt_id == a3


def test_wt_14_cancellation_and_recovery_first_commit_wins(store: ContractStore) -> None:
    log, tid, aid, gen = _running(store)
    result = recover_task(store, tid, expected_attempt_id=aid, expected_generation=gen)
    assert result is not None
    assert cancel_run(store, "run-1", callbacks=log.callbacks)
    assert task(store, tid).status is TaskStatus.CANCELLED
    assert recover_task(store, tid, expected_attempt_id=aid, expected_generation=gen) == result
    assert deliveries_for(store, tid) == [] or all(
        store.try_claim_task(
            d.task_id, expected_attempt_id=d.attempt_id, expected_generation=d.generation
        )
        is None
        for d in deliveries_for(store, tid)
    )
    # Cancellation first: recovery loses.
    log2 = new_run(store, [root("a")], "run-2")
    other = only_task(store, "run-2", 0)
    claim(store, other)
    assert cancel_run(store, "run-2", callbacks=log2.callbacks)
    assert (
        recover_task(
            store, other.task_id, expected_attempt_id=other.attempt_id, expected_generation=0
        )
        is None
    )


def test_wt_15_resumed_wait_id_survives_recovery_and_task_retry(store: ContractStore) -> None:
    _, tid, aid, gen = _running(store)
    _wait(store, tid, "answer", aid, gen)
    resumed = _resume(store, tid, "answer", aid, gen)
    assert resumed is not None
    won = claim(store, task(store, tid))
    assert won.resumed_from_wait_id == "answer"
    recovered = recover_task(
        store, tid, expected_attempt_id=won.attempt_id, expected_generation=gen
    )
    assert recovered is not None
    assert recovered.resumed_from_wait_id == "answer"
    won = claim(store, task(store, tid))
    assert won.resumed_from_wait_id == "answer"
    assert store.mark_task_crashed(tid, "lost", expected_attempt_id=won.attempt_id)
    assert retry_task(store, tid, expected_attempt_id=won.attempt_id) is not None
    assert task(store, tid).resumed_from_wait_id == "answer"
    assert claim(store, task(store, tid)).resumed_from_wait_id == "answer"


def test_wt_16_wait_resume_and_recovery_records_outlive_the_task_row(
    store: ContractStore,
) -> None:
    assert isinstance(store, DagStore)
    assert isinstance(store, DagWaitStore)
    assert isinstance(store, DagRetryStore)
    assert isinstance(store, OutputResolver)
    log, tid, aid, gen = _running(store)
    waited = _wait(store, tid, "w", aid, gen)
    resumed = _resume(store, tid, "w", aid, gen)
    assert waited is not None
    assert resumed is not None
    won = claim(store, task(store, tid))
    recovered = recover_task(
        store, tid, expected_attempt_id=won.attempt_id, expected_generation=gen
    )
    assert recovered is not None
    abort_run(store, run_id="run-1", reason="x", callbacks=log.callbacks)
    retry_run(store, "run-1")
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    # The task row has moved on twice; every record still replays.
    assert _wait(store, tid, "w", aid, gen) == waited
    assert _resume(store, tid, "w", aid, gen) == resumed
    assert (
        recover_task(store, tid, expected_attempt_id=won.attempt_id, expected_generation=gen)
        == recovered
    )


def test_wt_16_get_wait_reads_the_wait_records(store: ContractStore) -> None:
    # WaitRecordStore (a dagwerk extension): the attempt that entered a wait
    # stays readable after the task row has moved on to later attempts.
    assert isinstance(store, WaitRecordStore)
    log, tid, aid, gen = _running(store)
    assert store.get_wait(tid, "first") is None
    _wait(store, tid, "first", aid, gen)
    entered = WaitRecord(
        task_id=tid,
        wait_id="first",
        attempt_id=aid,
        generation=gen,
        resumed_attempt_id=None,
        invalidated=False,
    )
    assert store.get_wait(tid, "first") == entered
    resumed = _resume(store, tid, "first", aid, gen)
    assert resumed is not None
    done = replace(entered, resumed_attempt_id=resumed.resumed_attempt_id)
    assert store.get_wait(tid, "first") == done
    second = claim(store, task(store, tid))
    _wait(store, tid, "second", second.attempt_id, gen)
    assert cancel_run(store, "run-1", callbacks=log.callbacks)
    assert store.get_wait(tid, "second") == replace(
        entered, wait_id="second", attempt_id=second.attempt_id, invalidated=True
    )
    retry_run(store, "run-1")
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    # Resolved and invalidated waits are kept; a new generation reads them too.
    assert store.get_wait(tid, "first") == done
    assert store.get_wait(tid, "second") is not None
    assert store.get_wait(tid, "never") is None
    assert store.get_wait("no-such-task", "first") is None


@pytest.mark.parametrize(
    "protocol",
    [
        DagStore,
        DagWaitStore,
        DagRetryStore,
        OutputResolver,
        WaitResponseStore,
        DelayedRetryStore,
        NodeRerunStore,
        DagRunStore,
    ],
    ids=lambda protocol: protocol.__name__,
)
def test_the_store_implements_the_seed_protocols_and_their_extensions(
    store: ContractStore, protocol: type
) -> None:
    assert isinstance(store, protocol)
    assert implements(store, protocol)


def test_wt_16_wrappers_reject_contradictory_wait_results(store: ContractStore) -> None:
    _, tid, aid, gen = _running(store)

    def other_wait(inner: ContractStore, task_id: str, wait_id: str, **kw: Any) -> Any:
        return TaskWaitResult(
            task_id=task_id,
            attempt_id=kw["expected_attempt_id"],
            run_id="run-1",
            node_index=0,
            generation=kw["expected_generation"],
            wait_id="different",
        )

    proxy = StoreProxy(store, try_wait_task=other_wait)
    with pytest.raises(
        StoreContractError, match=r"^try_wait_task returned wait_id 'different'; expected 'w'$"
    ):
        _wait(as_store(proxy), tid, "w", aid, gen)
    junk = StoreProxy(store, try_resume_task=lambda inner, *a, **kw: "not a result")
    with pytest.raises(
        StoreContractError,
        match=r"^try_resume_task returned str; expected TaskResumeResult or None$",
    ):
        _resume(as_store(junk), tid, "w", aid, gen)
