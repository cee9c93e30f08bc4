"""Contract tests: completion, failure and crash fencing (FN-05..FN-12)."""

from __future__ import annotations

from typing import Any

import pytest

from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import (
    MAX_OUTPUTS_PER_TASK_COMPLETION,
    InputMode,
    RunStatus,
    TaskStatus,
)
from dagwerk.execution import recover_task
from dagwerk.json import FrozenDict
from dagwerk.models import EmittedOutput
from dagwerk.orchestrator import (
    on_task_complete,
    on_task_crashed,
    on_task_failed,
    reconcile_run,
)
from dagwerk.retry import retry_run, retry_task
from dagwerk.store import (
    OutputPublicationError,
    TaskAttemptRef,
)
from dagwerk.testing.helpers import (
    CallbackLog,
    Complete,
    ContractStore,
    FakeWorker,
    Hold,
    WorkItem,
    chain,
    child,
    claim,
    deliveries_for,
    emit,
    fingerprint,
    launch_of,
    new_run,
    only_task,
    root,
    run_record,
    snapshot_for,
    task,
    tasks_of,
)
from dagwerk.waiting import resume_task, wait_task


def _running_root(store: ContractStore, nodes: Any = None) -> tuple[CallbackLog, str, str, int]:
    """Start a run and claim its (only) root task; returns (log, task, attempt, generation)."""
    log = new_run(store, nodes if nodes is not None else [root("a")])
    record = only_task(store, "run-1", 0)
    claim(store, record)
    return log, record.task_id, record.attempt_id, record.generation


# --- FN-05 .. FN-09 ----------------------------------------------------------


def _oversized_batch(store: ContractStore) -> tuple[EmittedOutput, ...]:
    """One output more than the store accepts in a completion.

    The same output is repeated: the count check comes first (FN-07), and
    building the tuple costs nothing. A store configured with other limits
    exposes them as ``store.limits``.
    """
    limits = StoreCapabilities.of(store).limits
    if limits is None:
        limit = MAX_OUTPUTS_PER_TASK_COMPLETION
    else:
        limit = limits.max_outputs_per_task_completion
    return (EmittedOutput(id="big", fields=FrozenDict()),) * (limit + 1)


def test_fn_05_ownership_checked_before_outputs(store: ContractStore) -> None:
    new_run(store, [root("a"), root("b")])
    queued = only_task(store, "run-1", 0)
    waiting = only_task(store, "run-1", 1)
    claim(store, waiting)
    store.try_wait_task(
        waiting.task_id, "w", expected_attempt_id=waiting.attempt_id, expected_generation=0
    )
    snapshot = fingerprint(store, "run-1")
    for record in (queued, waiting):
        for batch in (_oversized_batch(store), emit("dup", "dup")):
            assert (
                store.try_complete_task(
                    record.task_id, batch, expected_attempt_id=record.attempt_id
                )
                is None
            )
    assert (
        store.try_complete_task(queued.task_id, emit("dup", "dup"), expected_attempt_id="x") is None
    )
    assert fingerprint(store, "run-1") == snapshot


def test_fn_05_stale_attempt_cannot_fail_the_task_with_bad_outputs(store: ContractStore) -> None:
    _, tid, aid, gen = _running_root(store)
    recovered = recover_task(store, tid, expected_attempt_id=aid, expected_generation=gen)
    assert recovered is not None
    snapshot = fingerprint(store, "run-1")
    assert store.try_complete_task(tid, _oversized_batch(store), expected_attempt_id=aid) is None
    assert fingerprint(store, "run-1") == snapshot


def test_fn_06_repeat_completion_returns_the_first_result_and_repairs_reconcile(
    store: ContractStore,
) -> None:
    log, tid, aid, _ = _running_root(store, chain(2))
    # A crash between the commit and reconciliation: the store committed but
    # nobody looked for newly ready nodes.
    first = store.try_complete_task(tid, emit("first"), expected_attempt_id=aid)
    assert first is not None
    assert first.launch_complete is True
    assert launch_of(store, "run-1", 1) is None
    again = store.try_complete_task(tid, emit("second"), expected_attempt_id=aid)
    assert again == first
    # The redelivered callback reconciles, without republishing.
    on_task_complete(
        store, task_id=tid, expected_attempt_id=aid, outputs=emit("third"), callbacks=log.callbacks
    )
    assert store.get_output_ids("run-1", 0) == ("first",)
    assert launch_of(store, "run-1", 1) is not None
    assert len(tasks_of(store, "run-1", 1)) == 1


def test_fn_06_oversized_redelivery_still_returns_the_first_result(store: ContractStore) -> None:
    log, tid, aid, _ = _running_root(store, chain(2))
    first = store.try_complete_task(tid, emit("first"), expected_attempt_id=aid)
    assert store.try_complete_task(tid, _oversized_batch(store), expected_attempt_id=aid) == first
    on_task_complete(
        store,
        task_id=tid,
        expected_attempt_id=aid,
        outputs=_oversized_batch(store),
        callbacks=log.callbacks,
    )
    assert task(store, tid).status is TaskStatus.COMPLETED
    assert launch_of(store, "run-1", 1) is not None


def test_fn_07_output_count_limit_is_checked_before_any_write(store: ContractStore) -> None:
    _, tid, aid, _ = _running_root(store)
    snapshot = fingerprint(store, "run-1")
    with pytest.raises(OutputPublicationError, match="task completion contains"):
        store.try_complete_task(tid, _oversized_batch(store), expected_attempt_id=aid)
    assert fingerprint(store, "run-1") == snapshot
    assert task(store, tid).status is TaskStatus.RUNNING


def test_fn_07_duplicate_ids_in_a_batch_are_rejected_atomically(store: ContractStore) -> None:
    _, tid, aid, _ = _running_root(store)
    snapshot = fingerprint(store, "run-1")
    with pytest.raises(OutputPublicationError, match="duplicate output IDs"):
        store.try_complete_task(tid, emit("x", "y", "x"), expected_attempt_id=aid)
    assert fingerprint(store, "run-1") == snapshot
    assert store.get_output_ids("run-1", 0) == ()


def test_fn_07_ids_already_published_in_the_run_are_rejected(store: ContractStore) -> None:
    new_run(store, [root("a"), root("b")])
    first, second = only_task(store, "run-1", 0), only_task(store, "run-1", 1)
    claim(store, first)
    claim(store, second)
    assert store.try_complete_task(
        first.task_id, emit("shared"), expected_attempt_id=first.attempt_id
    )
    snapshot = fingerprint(store, "run-1")
    with pytest.raises(OutputPublicationError, match="already exist"):
        store.try_complete_task(
            second.task_id, emit("own", "shared"), expected_attempt_id=second.attempt_id
        )
    assert fingerprint(store, "run-1") == snapshot
    assert task(store, second.task_id).status is TaskStatus.RUNNING


def test_fn_07_ids_of_invalidated_generations_stay_reserved(store: ContractStore) -> None:
    log = new_run(store, [root("a"), child("b", "a")])
    top = only_task(store, "run-1", 0)
    claim(store, top)
    on_task_complete(
        store,
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        outputs=emit("r1", "r2"),
        callbacks=log.callbacks,
    )
    good, bad = tasks_of(store, "run-1", 1)
    claim(store, good)
    claim(store, bad)
    assert store.try_complete_task(good.task_id, emit("sib"), expected_attempt_id=good.attempt_id)
    on_task_failed(
        store,
        task_id=bad.task_id,
        expected_attempt_id=bad.attempt_id,
        error_message="boom",
        callbacks=log.callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.FAILED
    assert retry_run(store, "run-1").affected_nodes == (1,)
    assert store.get_output_ids("run-1", 1) == ()
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    replacement = tasks_of(store, "run-1", 1)[0]
    claim(store, replacement)
    with pytest.raises(OutputPublicationError, match="already exist"):
        store.try_complete_task(
            replacement.task_id, emit("sib"), expected_attempt_id=replacement.attempt_id
        )
    assert task(store, replacement.task_id).status is TaskStatus.RUNNING


def test_fn_08_invalid_first_batch_fails_the_task_and_the_run(store: ContractStore) -> None:
    log, tid, aid, _ = _running_root(store)
    on_task_complete(
        store,
        task_id=tid,
        expected_attempt_id=aid,
        outputs=emit("x", "x"),
        callbacks=log.callbacks,
    )
    assert task(store, tid).status is TaskStatus.FAILED
    record = run_record(store, "run-1")
    assert record.status is RunStatus.FAILED
    assert record.error is not None
    assert "duplicate output IDs" in record.error
    assert log.kinds() == ["failed"]


def test_fn_08_output_ids_are_unique_across_tasks_of_a_run(store: ContractStore) -> None:
    log = new_run(store, [root("a"), root("b")])
    FakeWorker(
        store,
        log,
        handlers={"a": lambda i: Complete(emit("shared")), "b": lambda i: Complete(emit("shared"))},
    ).drain()
    assert store.get_run_status("run-1") is RunStatus.FAILED
    statuses = sorted(t.status.value for t in store.list_tasks("run-1"))
    assert statuses == ["completed", "failed"]
    assert log.kinds() == ["failed"]


def test_fn_09_completion_commits_outputs_launch_state_and_correlation(
    store: ContractStore,
) -> None:
    log = new_run(store, [root("a"), child("b", "a")])
    first = only_task(store, "run-1", 0)
    claim(store, first)
    outputs = (
        EmittedOutput(id="o1", fields={"k": 1}, data={"path": "/tmp/o1"}),
        EmittedOutput(id="o2", fields={"k": 2}, data={"path": "/tmp/o2"}),
    )
    result = store.try_complete_task(first.task_id, outputs, expected_attempt_id=first.attempt_id)
    assert result is not None
    assert (result.task_id, result.attempt_id, result.run_id) == (
        first.task_id,
        first.attempt_id,
        "run-1",
    )
    assert result.launch_complete is True
    assert task(store, first.task_id).status is TaskStatus.COMPLETED
    launch = launch_of(store, "run-1", 0)
    assert launch is not None
    assert launch.complete is True
    assert store.get_output_ids("run-1", 0) == ("o1", "o2")
    assert run_record(store, "run-1").settled_nodes == 1
    # Routing fields and materialised data stay separate.
    resolved = store.resolve_outputs("run-1", ("o1", "o2"))
    assert dict(resolved["o1"].fields) == {"k": 1}
    assert dict(resolved["o1"].data) == {"path": "/tmp/o1"}
    # CR-02: the store derived correlation; a root output starts its own group.
    snapshot = snapshot_for(store, "run-1", 1)
    refs = snapshot.outputs_by_edge["a"]
    assert [(r.id, r.correlation_id) for r in refs] == [("o1", "o1"), ("o2", "o2")]
    assert "data" not in dict(refs[0].fields)
    assert log.kinds() == []


def test_fn_09_launch_is_complete_only_when_every_task_completed(store: ContractStore) -> None:
    nodes = [
        root("a"),
        child("b", "a"),
        child("c", "b", mode=InputMode.ALL),
        child("d", "c", mode=InputMode.ALL),
    ]
    log = new_run(store, nodes)
    top = only_task(store, "run-1", 0)
    claim(store, top)
    on_task_complete(
        store,
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        outputs=emit("r1", "r2"),
        callbacks=log.callbacks,
    )
    first, second = tasks_of(store, "run-1", 1)
    claim(store, first)
    claim(store, second)
    r1 = store.try_complete_task(first.task_id, emit("s1"), expected_attempt_id=first.attempt_id)
    assert r1 is not None
    assert r1.launch_complete is False
    launch = launch_of(store, "run-1", 1)
    assert launch is not None
    assert launch.complete is False
    r2 = store.try_complete_task(second.task_id, emit("s2"), expected_attempt_id=second.attempt_id)
    assert r2 is not None
    assert r2.launch_complete is True
    # CR-02: EACH outputs inherit the group of the output they were planned from.
    refs = snapshot_for(store, "run-1", 2).outputs_by_edge["b"]
    assert {r.id: r.correlation_id for r in refs} == {"s1": "r1", "s2": "r2"}
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    fan_in = only_task(store, "run-1", 2)
    claim(store, fan_in)
    assert store.try_complete_task(fan_in.task_id, emit("t"), expected_attempt_id=fan_in.attempt_id)
    # ... and ALL outputs carry no correlation.
    (ref,) = snapshot_for(store, "run-1", 3).outputs_by_edge["c"]
    assert (ref.id, ref.correlation_id) == ("t", None)


# --- FN-10 .. FN-12 ----------------------------------------------------------


def test_fn_10_failure_needs_the_current_running_attempt_and_replays(
    store: ContractStore,
) -> None:
    new_run(store, [root("a"), root("b")])
    record = only_task(store, "run-1", 0)
    # QUEUED: not yet owned by anyone
    assert (
        store.mark_task_failed(record.task_id, "e", expected_attempt_id=record.attempt_id) is None
    )
    assert (
        store.mark_task_crashed(record.task_id, "e", expected_attempt_id=record.attempt_id) is None
    )
    claim(store, record)
    assert store.mark_task_failed(record.task_id, "e", expected_attempt_id="other") is None
    first = store.mark_task_failed(record.task_id, "first", expected_attempt_id=record.attempt_id)
    assert first is not None
    assert first.status is TaskStatus.FAILED
    assert (first.task_id, first.attempt_id) == (record.task_id, record.attempt_id)
    assert task(store, record.task_id).error == "first"
    again = store.mark_task_failed(record.task_id, "second", expected_attempt_id=record.attempt_id)
    assert again == first
    assert task(store, record.task_id).error == "first"
    # A crash report cannot turn the failed attempt into a crashed one.
    assert (
        store.mark_task_crashed(record.task_id, "x", expected_attempt_id=record.attempt_id) is None
    )
    assert task(store, record.task_id).status is TaskStatus.FAILED


def test_fn_10_crash_replays_and_old_attempts_are_rejected_after_retry(
    store: ContractStore,
) -> None:
    _, tid, aid, _ = _running_root(store)
    crashed = store.mark_task_crashed(tid, "lost", expected_attempt_id=aid)
    assert crashed is not None
    assert crashed.status is TaskStatus.CRASHED
    assert store.mark_task_crashed(tid, "lost again", expected_attempt_id=aid) == crashed
    new_attempt = retry_task(store, tid, expected_attempt_id=aid)
    assert new_attempt is not None
    assert store.mark_task_crashed(tid, "late", expected_attempt_id=aid) is None
    assert store.mark_task_failed(tid, "late", expected_attempt_id=aid) is None
    assert task(store, tid).status is TaskStatus.QUEUED
    assert task(store, tid).attempt_id == new_attempt


def test_fn_11_detached_tasks_cannot_complete_fail_retry_or_finalise(
    store: ContractStore,
) -> None:
    log = new_run(store, [root("a")])
    old = only_task(store, "run-1", 0)
    claim(store, old)
    assert store.mark_task_crashed(old.task_id, "lost", expected_attempt_id=old.attempt_id)
    assert store.try_finalize_run(
        "run-1",
        RunStatus.CRASHED,
        cause=TaskAttemptRef(task_id=old.task_id, attempt_id=old.attempt_id),
    )
    retry_run(store, "run-1")
    # The old task is detached from the active launch now.
    detached = task(store, old.task_id)
    assert detached.invalidated is True
    assert store.try_create_task_retry(old.task_id, expected_attempt_id=old.attempt_id) is None
    assert (
        store.try_complete_task(old.task_id, emit("z"), expected_attempt_id=old.attempt_id) is None
    )
    assert store.mark_task_failed(old.task_id, "e", expected_attempt_id=old.attempt_id) is None
    assert not store.try_finalize_run(
        "run-1",
        RunStatus.CRASHED,
        cause=TaskAttemptRef(task_id=old.task_id, attempt_id=old.attempt_id),
    )
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert log.kinds() == []


@pytest.mark.parametrize("how", ["recovered", "waiting", "resumed", "retried"])
def test_fn_12_late_callbacks_are_harmless(store: ContractStore, how: str) -> None:
    log, tid, aid, gen = _running_root(store, [root("a"), root("b")])
    if how == "recovered":
        assert recover_task(store, tid, expected_attempt_id=aid, expected_generation=gen)
    elif how in ("waiting", "resumed"):
        assert wait_task(store, tid, "w", expected_attempt_id=aid, expected_generation=gen)
        if how == "resumed":
            assert resume_task(store, tid, "w", expected_attempt_id=aid, expected_generation=gen)
    else:
        assert store.mark_task_crashed(tid, "lost", expected_attempt_id=aid)
        assert retry_task(store, tid, expected_attempt_id=aid)
    snapshot = fingerprint(store, "run-1")
    on_task_complete(
        store, task_id=tid, expected_attempt_id=aid, outputs=emit("late"), callbacks=log.callbacks
    )
    on_task_failed(
        store, task_id=tid, expected_attempt_id=aid, error_message="late", callbacks=log.callbacks
    )
    on_task_crashed(
        store, task_id=tid, expected_attempt_id=aid, error_message="late", callbacks=log.callbacks
    )
    assert store.try_complete_task(tid, emit("late"), expected_attempt_id=aid) is None
    assert store.mark_task_failed(tid, "late", expected_attempt_id=aid) is None
    assert store.mark_task_crashed(tid, "late", expected_attempt_id=aid) is None
    assert fingerprint(store, "run-1") == snapshot
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert store.get_output_ids("run-1", 0) == ()
    assert log.kinds() == []


def test_fn_12_hold_outcome_keeps_the_attempt_running(store: ContractStore) -> None:
    # The fake worker's Hold outcome models a lost worker: its attempt stays
    # RUNNING and its delivery is not acknowledged.
    log = new_run(store, [root("a")])
    worker = FakeWorker(store, log, handlers={"a": lambda item: Hold()})
    worker.drain()
    held: WorkItem = worker.held[0]
    assert task(store, held.claim.task_id).status is TaskStatus.RUNNING
    assert len(deliveries_for(store, held.claim.task_id)) == 1
