"""Contract tests: finalisation, callbacks and aborts (OR-09..OR-17)."""

from __future__ import annotations

from typing import Any

import pytest

from dagwerk.constants import (
    InputMode,
    NodeDisposition,
    RunStatus,
    TaskStatus,
)
from dagwerk.orchestrator import (
    abort_run,
    on_task_complete,
    on_task_crashed,
    on_task_failed,
    reconcile_run,
)
from dagwerk.retry import retry_task
from dagwerk.store import (
    NodeLaunchRef,
    StoreContractError,
    TaskAttemptRef,
    TaskCompletionResult,
    TaskFailureResult,
)
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    FakeWorker,
    StoreProxy,
    as_store,
    chain,
    child,
    claim,
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


def _complete_root_quietly(store: ContractStore, run_id: str, *ids: str) -> None:
    """Complete node 0's only task at the store level (no reconciliation)."""
    record = only_task(store, run_id, 0)
    claim(store, record)
    assert store.try_complete_task(
        record.task_id, emit(*ids), expected_attempt_id=record.attempt_id
    )


# --- OR-09 .. OR-13 ------------------------------------------------------------


def test_or_09_completion_requires_every_node_settled(store: ContractStore) -> None:
    log = new_run(store, chain(2))
    assert not store.try_finalize_run("run-1", RunStatus.COMPLETED)  # task QUEUED
    top = only_task(store, "run-1", 0)
    claim(store, top)
    assert not store.try_finalize_run("run-1", RunStatus.COMPLETED)  # task RUNNING
    store.try_complete_task(top.task_id, emit("x"), expected_attempt_id=top.attempt_id)
    # node 1 has no launch yet
    assert not store.try_finalize_run("run-1", RunStatus.COMPLETED)
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    last = only_task(store, "run-1", 1)
    claim(store, last)
    store.try_complete_task(last.task_id, emit("y"), expected_attempt_id=last.attempt_id)
    assert store.try_finalize_run("run-1", RunStatus.COMPLETED)
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert run_record(store, "run-1").settled_nodes == 2
    assert log.kinds() == []


def test_or_09_terminal_transaction_rechecks_task_state(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    top = only_task(store, "run-1", 0)
    claim(store, top)
    assert store.mark_task_crashed(top.task_id, "lost", expected_attempt_id=top.attempt_id)
    retry_task(store, top.task_id, expected_attempt_id=top.attempt_id)
    assert not store.try_finalize_run("run-1", RunStatus.COMPLETED)
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert log.kinds() == []


def test_or_09_failed_launch_blocks_completion(store: ContractStore) -> None:
    nodes = [root("r"), child("b", "r", mode=InputMode.ALL)]
    new_run(store, nodes)
    _complete_root_quietly(store, "run-1", "x")
    token = snapshot_for(store, "run-1", 1).token
    store.try_create_node_launch("run-1", 1, "b", token, (), NodeDisposition.FAILED, "bad")
    assert not store.try_finalize_run("run-1", RunStatus.COMPLETED)


def test_or_10_finalize_argument_rules(store: ContractStore) -> None:
    new_run(store, [root("a")])
    top = only_task(store, "run-1", 0)
    ref = TaskAttemptRef(task_id=top.task_id, attempt_id=top.attempt_id)
    with pytest.raises(ValueError):
        store.try_finalize_run("run-1", RunStatus.RUNNING)
    with pytest.raises(ValueError):
        store.try_finalize_run("run-1", RunStatus.PENDING, reason="x")
    with pytest.raises(ValueError):
        store.try_finalize_run("run-1", RunStatus.FAILED, cause=ref, reason="x")
    with pytest.raises(ValueError):
        store.try_finalize_run("run-1", RunStatus.COMPLETED, reason="x")
    with pytest.raises(ValueError):
        store.try_finalize_run("run-1", RunStatus.COMPLETED, cause=ref)
    assert store.try_finalize_run("missing", RunStatus.FAILED, reason="x") is False
    assert store.get_run_status("run-1") is RunStatus.RUNNING


def test_or_10_a_cause_must_be_current_and_match_the_status(store: ContractStore) -> None:
    nodes = [root("a"), root("b"), root("c")]
    new_run(store, nodes)
    running, failed, crashed = (only_task(store, "run-1", i) for i in range(3))
    for record in (running, failed, crashed):
        claim(store, record)
    store.mark_task_failed(failed.task_id, "f", expected_attempt_id=failed.attempt_id)
    store.mark_task_crashed(crashed.task_id, "c", expected_attempt_id=crashed.attempt_id)

    def ref(record: Any, attempt: str | None = None) -> TaskAttemptRef:
        return TaskAttemptRef(task_id=record.task_id, attempt_id=attempt or record.attempt_id)

    snapshot = fingerprint(store, "run-1")
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, cause=ref(running))
    assert not store.try_finalize_run("run-1", RunStatus.CRASHED, cause=ref(failed))
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, cause=ref(crashed))
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, cause=ref(failed, "other"))
    launch = launch_of(store, "run-1", 0)
    assert launch is not None
    launch_ref = NodeLaunchRef(launch_id=launch.id, node_index=0, generation=launch.generation)
    # A launch cause needs an active FAILED launch.
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, cause=launch_ref)
    assert fingerprint(store, "run-1") == snapshot
    assert store.try_finalize_run("run-1", RunStatus.CRASHED, cause=ref(crashed))
    finished = run_record(store, "run-1")
    assert (finished.status, finished.error) == (RunStatus.CRASHED, "c")
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, reason="again")


def test_or_10_launch_cause_must_match_id_and_generation(store: ContractStore) -> None:
    nodes = [root("r"), child("b", "r", mode=InputMode.ALL)]
    new_run(store, nodes)
    _complete_root_quietly(store, "run-1", "x")
    token = snapshot_for(store, "run-1", 1).token
    created = store.try_create_node_launch(
        "run-1", 1, "b", token, (), NodeDisposition.FAILED, "bad"
    )
    assert created.launch is not None
    failed = created.launch
    wrong_gen = NodeLaunchRef(launch_id=failed.id, node_index=1, generation=failed.generation + 1)
    wrong_id = NodeLaunchRef(launch_id="other", node_index=1, generation=failed.generation)
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, cause=wrong_gen)
    assert not store.try_finalize_run("run-1", RunStatus.FAILED, cause=wrong_id)
    good = NodeLaunchRef(launch_id=failed.id, node_index=1, generation=failed.generation)
    assert not store.try_finalize_run("run-1", RunStatus.CRASHED, cause=good)
    assert store.try_finalize_run("run-1", RunStatus.FAILED, cause=good)
    assert run_record(store, "run-1").error == "bad"


def test_or_11_run_error_is_the_persisted_attempt_error(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    top = only_task(store, "run-1", 0)
    claim(store, top)
    assert store.mark_task_failed(top.task_id, "first", expected_attempt_id=top.attempt_id)
    # The redelivered callback carries other text; the persisted error wins.
    on_task_failed(
        store,
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        error_message="second",
        callbacks=log.callbacks,
    )
    record = run_record(store, "run-1")
    assert (record.status, record.error) == (RunStatus.FAILED, "first")
    assert log.kinds() == ["failed"]


def test_or_12_failure_cancels_unfinished_work_and_invalidates_waits(
    store: ContractStore,
) -> None:
    nodes = [root("r"), child("c", "r")]
    log = new_run(store, nodes)
    top = only_task(store, "run-1", 0)
    claim(store, top)
    on_task_complete(
        store,
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        outputs=emit("x1", "x2", "x3", "x4"),
        callbacks=log.callbacks,
    )
    waiting, running, queued, failing = tasks_of(store, "run-1", 1)
    for record in (waiting, running, failing):
        claim(store, record)
    assert wait_task(
        store,
        waiting.task_id,
        "w",
        expected_attempt_id=waiting.attempt_id,
        expected_generation=waiting.generation,
    )
    on_task_failed(
        store,
        task_id=failing.task_id,
        expected_attempt_id=failing.attempt_id,
        error_message="boom",
        callbacks=log.callbacks,
    )
    run_state = run_record(store, "run-1")
    assert run_state.status is RunStatus.FAILED
    assert run_state.error == "boom"
    statuses = [task(store, r.task_id).status for r in (waiting, running, queued, failing)]
    assert statuses == [
        TaskStatus.CANCELLED,
        TaskStatus.CANCELLED,
        TaskStatus.CANCELLED,
        TaskStatus.FAILED,
    ]
    assert task(store, waiting.task_id).active_wait_id is None
    assert (
        resume_task(
            store,
            waiting.task_id,
            "w",
            expected_attempt_id=waiting.attempt_id,
            expected_generation=waiting.generation,
        )
        is None
    )
    # Only the root settled; tasks cancelled by the transition are no progress.
    assert run_state.settled_nodes == 1
    assert store.list_deliveries("run-1") == [] or all(
        store.try_claim_task(
            d.task_id, expected_attempt_id=d.attempt_id, expected_generation=d.generation
        )
        is None
        for d in store.list_deliveries("run-1")
    )
    assert log.kinds() == ["failed"]


def test_or_13_completion_callback_observes_committed_state(store: ContractStore) -> None:
    seen: list[tuple[RunStatus, int, int]] = []
    log = CallbackLog()

    def observe(run_id: str) -> None:
        record = run_record(store, run_id)
        seen.append((record.status, record.settled_nodes, record.node_count))

    log.hooks["completed"] = observe
    new_run(store, chain(3), log=log)
    FakeWorker(store, log).drain()
    assert seen == [(RunStatus.COMPLETED, 3, 3)]
    assert log.kinds() == ["completed"]


def test_or_13_raising_callback_cannot_strand_work(store: ContractStore) -> None:
    log = CallbackLog()

    def explode(run_id: str) -> None:
        raise RuntimeError("callback failed")

    log.hooks["failed"] = explode
    new_run(store, [root("a"), root("b")], log=log)
    failing, other = only_task(store, "run-1", 0), only_task(store, "run-1", 1)
    claim(store, failing)
    claim(store, other)
    with pytest.raises(RuntimeError, match="callback failed"):
        on_task_failed(
            store,
            task_id=failing.task_id,
            expected_attempt_id=failing.attempt_id,
            error_message="boom",
            callbacks=log.callbacks,
        )
    assert store.get_run_status("run-1") is RunStatus.FAILED
    assert task(store, other.task_id).status is TaskStatus.CANCELLED
    # A redelivery neither cancels again nor fires again.
    on_task_failed(
        store,
        task_id=failing.task_id,
        expected_attempt_id=failing.attempt_id,
        error_message="boom",
        callbacks=log.callbacks,
    )
    assert log.kinds() == ["failed"]


# --- OR-14 .. OR-17 ------------------------------------------------------------


def test_or_14_non_final_completions_do_not_read_the_graph(store: ContractStore) -> None:
    width = 20
    log = new_run(store, [root("r"), child("c", "r"), child("d", "c", mode=InputMode.ALL)])
    top = only_task(store, "run-1", 0)
    claim(store, top)
    ids = tuple(f"x{i}" for i in range(width))
    on_task_complete(
        store,
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        outputs=emit(*ids),
        callbacks=log.callbacks,
    )
    siblings = tasks_of(store, "run-1", 1)
    assert len(siblings) == width
    proxy = StoreProxy(store)
    for index, record in enumerate(siblings):
        claim(store, record)
        on_task_complete(
            as_store(proxy),
            task_id=record.task_id,
            expected_attempt_id=record.attempt_id,
            outputs=emit(f"y{index}"),
            callbacks=log.callbacks,
        )
        if index < width - 1:
            assert proxy.calls["get_run_nodes"] == 0
            assert proxy.calls["list_node_launches"] == 0
    assert proxy.calls["get_run_nodes"] == 1
    assert proxy.calls["list_node_launches"] == 1
    assert len(tasks_of(store, "run-1", 2)) == 1


def test_or_14_completion_results_are_checked(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    top = only_task(store, "run-1", 0)
    claim(store, top)
    # None: return silently.
    on_task_complete(
        store, task_id=top.task_id, expected_attempt_id="other", outputs=(), callbacks=log.callbacks
    )

    def foreign(inner: ContractStore, task_id: str, outputs: Any, **kw: Any) -> Any:
        return TaskCompletionResult(
            task_id="someone-else",
            attempt_id=kw["expected_attempt_id"],
            run_id="run-1",
            node_index=0,
            generation=0,
            launch_complete=False,
        )

    proxy = StoreProxy(store, try_complete_task=foreign)
    with pytest.raises(StoreContractError):
        on_task_complete(
            as_store(proxy),
            task_id=top.task_id,
            expected_attempt_id=top.attempt_id,
            outputs=(),
            callbacks=log.callbacks,
        )


def test_or_15_failure_and_crash_callbacks_finalise_the_run(store: ContractStore) -> None:
    log = new_run(store, [root("a")], "run-f")
    new_run(store, [root("a")], "run-c", log=log)
    for run_id, handler in (("run-f", on_task_failed), ("run-c", on_task_crashed)):
        record = only_task(store, run_id, 0)
        # None from the store: nothing happens.
        handler(
            store,
            task_id=record.task_id,
            expected_attempt_id=record.attempt_id,
            error_message="queued",
            callbacks=log.callbacks,
        )
        assert store.get_run_status(run_id) is RunStatus.RUNNING
        claim(store, record)
        handler(
            store,
            task_id=record.task_id,
            expected_attempt_id=record.attempt_id,
            error_message="err",
            callbacks=log.callbacks,
        )
    assert store.get_run_status("run-f") is RunStatus.FAILED
    assert store.get_run_status("run-c") is RunStatus.CRASHED
    assert task(store, only_task(store, "run-c", 0).task_id).status is TaskStatus.CRASHED
    assert log.events == [("failed", "run-f"), ("crashed", "run-c")]


def test_or_15_failure_results_are_checked(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    top = only_task(store, "run-1", 0)
    claim(store, top)

    def wrong_status(inner: ContractStore, task_id: str, error: str, **kw: Any) -> Any:
        return TaskFailureResult(
            task_id=task_id,
            attempt_id=kw["expected_attempt_id"],
            run_id="run-1",
            node_index=0,
            generation=0,
            status=TaskStatus.CRASHED,
        )

    proxy = StoreProxy(store, mark_task_failed=wrong_status)
    with pytest.raises(StoreContractError):
        on_task_failed(
            as_store(proxy),
            task_id=top.task_id,
            expected_attempt_id=top.attempt_id,
            error_message="e",
            callbacks=log.callbacks,
        )
    assert log.kinds() == []


def test_or_16_task_retry_winning_before_finalisation_keeps_the_run(
    store: ContractStore,
) -> None:
    log = new_run(store, [root("a")])
    top = only_task(store, "run-1", 0)
    claim(store, top)

    def retry_first(inner: ContractStore, run_id: str, status: RunStatus, **kw: Any) -> bool:
        # A concurrent task retry commits between the crash record and the
        # terminal transaction.
        assert retry_task(inner, top.task_id, expected_attempt_id=top.attempt_id) is not None
        result: bool = inner.try_finalize_run(run_id, status, **kw)
        return result

    proxy = StoreProxy(store, try_finalize_run=retry_first)
    on_task_crashed(
        as_store(proxy),
        task_id=top.task_id,
        expected_attempt_id=top.attempt_id,
        error_message="lost",
        callbacks=log.callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert task(store, top.task_id).status is TaskStatus.QUEUED
    assert log.kinds() == []


def test_or_17_abort_reports_whether_it_made_the_transition(store: ContractStore) -> None:
    log = new_run(store, [root("a")], "run-1")
    new_run(store, [root("a")], "run-2", log=log)
    new_run(store, [root("a")], "run-3", log=log)
    for bad in (RunStatus.COMPLETED, RunStatus.RUNNING, RunStatus.PENDING):
        with pytest.raises(ValueError):
            abort_run(store, run_id="run-1", reason="x", callbacks=log.callbacks, status=bad)
    assert abort_run(store, run_id="run-1", reason="stop", callbacks=log.callbacks)
    assert not abort_run(store, run_id="run-1", reason="stop", callbacks=log.callbacks)
    assert abort_run(
        store, run_id="run-2", reason="x", callbacks=log.callbacks, status=RunStatus.CRASHED
    )
    assert abort_run(
        store, run_id="run-3", reason="x", callbacks=log.callbacks, status=RunStatus.CANCELLED
    )
    assert not abort_run(store, run_id="missing", reason="x", callbacks=log.callbacks)
    assert run_record(store, "run-1").error == "stop"
    assert [store.get_run_status(r) for r in ("run-1", "run-2", "run-3")] == [
        RunStatus.FAILED,
        RunStatus.CRASHED,
        RunStatus.CANCELLED,
    ]
    assert log.events == [("failed", "run-1"), ("crashed", "run-2"), ("cancelled", "run-3")]
