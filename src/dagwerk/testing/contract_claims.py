"""Contract tests: claims and the wrapper checks (FN-01..FN-04)."""

from __future__ import annotations

from typing import Any

import pytest

from dagwerk.constants import (
    RunStatus,
    TaskStatus,
)
from dagwerk.execution import claim_task, recover_task
from dagwerk.orchestrator import (
    abort_run,
    reconcile_run,
)
from dagwerk.retry import retry_run
from dagwerk.store import (
    StoreContractError,
    TaskClaimResult,
    TaskRecoveryResult,
)
from dagwerk.testing.helpers import (
    ContractStore,
    StoreProxy,
    as_store,
    claim,
    emit,
    fingerprint,
    new_run,
    only_task,
    root,
    task,
)
from dagwerk.waiting import resume_task, wait_task

# --- FN-01 / FN-02 / FN-03 -------------------------------------------------


def test_fn_01_claim_changes_only_the_status(store: ContractStore) -> None:
    new_run(store, [root("a")])
    before = only_task(store, "run-1", 0)
    rows_before = store.list_deliveries("run-1")
    result = claim_task(
        store,
        before.task_id,
        expected_attempt_id=before.attempt_id,
        expected_generation=before.generation,
    )
    assert isinstance(result, TaskClaimResult)
    assert (result.task_id, result.attempt_id, result.run_id) == (
        before.task_id,
        before.attempt_id,
        "run-1",
    )
    assert (result.node_index, result.generation) == (0, before.generation)
    assert result.resumed_from_wait_id is None
    after = task(store, before.task_id)
    assert after.status is TaskStatus.RUNNING
    assert (after.attempt_id, after.plan, after.generation, after.launch_id) == (
        before.attempt_id,
        before.plan,
        before.generation,
        before.launch_id,
    )
    # Claiming neither acknowledges nor creates deliveries (OB-03).
    assert store.list_deliveries("run-1") == rows_before


def test_fn_01_claim_rejects_wrong_attempt_generation_and_run_state(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)
    snapshot = fingerprint(store, "run-1")
    assert (
        store.try_claim_task(
            record.task_id, expected_attempt_id="other", expected_generation=record.generation
        )
        is None
    )
    assert (
        store.try_claim_task(
            record.task_id,
            expected_attempt_id=record.attempt_id,
            expected_generation=record.generation + 1,
        )
        is None
    )
    assert (
        store.try_claim_task("no-such-task", expected_attempt_id="a", expected_generation=0) is None
    )
    assert fingerprint(store, "run-1") == snapshot
    abort_run(store, run_id="run-1", reason="stop", callbacks=log.callbacks)
    assert (
        store.try_claim_task(
            record.task_id,
            expected_attempt_id=record.attempt_id,
            expected_generation=record.generation,
        )
        is None
    )


def test_fn_01_claim_rejects_work_of_an_invalidated_generation(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    old = only_task(store, "run-1", 0)
    abort_run(store, run_id="run-1", reason="stop", callbacks=log.callbacks)
    retry_run(store, "run-1")
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    assert (
        store.try_claim_task(
            old.task_id, expected_attempt_id=old.attempt_id, expected_generation=old.generation
        )
        is None
    )
    fresh = only_task(store, "run-1", 0)
    assert fresh.task_id != old.task_id
    assert fresh.generation == old.generation + 1
    claim(store, fresh)


def test_fn_02_only_one_delivery_claims_an_attempt(store: ContractStore) -> None:
    new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)
    first = store.try_claim_task(
        record.task_id, expected_attempt_id=record.attempt_id, expected_generation=0
    )
    second = store.try_claim_task(
        record.task_id, expected_attempt_id=record.attempt_id, expected_generation=0
    )
    assert first is not None
    assert second is None
    assert task(store, record.task_id).status is TaskStatus.RUNNING


@pytest.mark.parametrize("state", ["running", "waiting", "completed", "failed", "crashed"])
def test_fn_02_claim_rejects_every_nonqueued_state(store: ContractStore, state: str) -> None:
    new_run(store, [root("a"), root("b")])
    record = only_task(store, "run-1", 0)
    tid, aid = record.task_id, record.attempt_id
    claim(store, record)
    if state == "waiting":
        assert store.try_wait_task(tid, "w", expected_attempt_id=aid, expected_generation=0)
    elif state == "completed":
        assert store.try_complete_task(tid, emit("o"), expected_attempt_id=aid)
    elif state == "failed":
        assert store.mark_task_failed(tid, "e", expected_attempt_id=aid)
    elif state == "crashed":
        assert store.mark_task_crashed(tid, "e", expected_attempt_id=aid)
    snapshot = fingerprint(store, "run-1")
    assert store.try_claim_task(tid, expected_attempt_id=aid, expected_generation=0) is None
    assert fingerprint(store, "run-1") == snapshot


def test_fn_02_claim_rejects_a_cancelled_task(store: ContractStore) -> None:
    log = new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)
    abort_run(
        store, run_id="run-1", reason="x", callbacks=log.callbacks, status=RunStatus.CANCELLED
    )
    assert task(store, record.task_id).status is TaskStatus.CANCELLED
    assert (
        store.try_claim_task(
            record.task_id, expected_attempt_id=record.attempt_id, expected_generation=0
        )
        is None
    )


def test_fn_03_a_lost_claim_is_a_bare_none(store: ContractStore) -> None:
    # Owned elsewhere, finished, waiting and stale all look the same: None.
    new_run(store, [root("a"), root("b"), root("c")])
    owned, waiting, finished = (only_task(store, "run-1", i) for i in range(3))
    for record in (owned, waiting, finished):
        claim(store, record)
    store.try_wait_task(
        waiting.task_id, "w", expected_attempt_id=waiting.attempt_id, expected_generation=0
    )
    store.try_complete_task(finished.task_id, emit("f"), expected_attempt_id=finished.attempt_id)
    results = [
        claim_task(store, r.task_id, expected_attempt_id=r.attempt_id, expected_generation=0)
        for r in (owned, waiting, finished)
    ]
    results.append(
        claim_task(store, owned.task_id, expected_attempt_id="stale", expected_generation=0)
    )
    assert results == [None, None, None, None]


# --- FN-04 -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task_id", "attempt_id", "generation"),
    [("", "a", 0), ("t", "", 0), (1, "a", 0), ("t", None, 0), ("t", "a", -1), ("t", "a", True)],
)
def test_fn_04_wrappers_validate_requests(
    store: ContractStore, task_id: Any, attempt_id: Any, generation: Any
) -> None:
    proxy = StoreProxy(store)
    for call in (
        lambda: claim_task(
            as_store(proxy),
            task_id,
            expected_attempt_id=attempt_id,
            expected_generation=generation,
        ),
        lambda: recover_task(
            as_store(proxy),
            task_id,
            expected_attempt_id=attempt_id,
            expected_generation=generation,
        ),
        lambda: wait_task(
            as_store(proxy),
            task_id,
            "w",
            expected_attempt_id=attempt_id,
            expected_generation=generation,
        ),
        lambda: resume_task(
            as_store(proxy),
            task_id,
            "w",
            expected_attempt_id=attempt_id,
            expected_generation=generation,
        ),
    ):
        with pytest.raises(ValueError):
            call()
    # Validation happens before the store is asked anything.
    assert sum(proxy.calls.values()) == 0


def test_fn_04_wrappers_reject_contradictory_store_results(store: ContractStore) -> None:
    new_run(store, [root("a")])
    record = only_task(store, "run-1", 0)

    def lying_claim(inner: ContractStore, task_id: str, **kw: Any) -> TaskClaimResult:
        return TaskClaimResult(
            task_id=task_id,
            attempt_id="someone-else",
            run_id="run-1",
            node_index=0,
            generation=kw["expected_generation"],
            resumed_from_wait_id=None,
        )

    proxy = StoreProxy(store, try_claim_task=lying_claim)
    with pytest.raises(
        StoreContractError, match=r"^try_claim_task returned attempt_id 'someone-else'; expected '"
    ):
        claim_task(
            as_store(proxy),
            record.task_id,
            expected_attempt_id=record.attempt_id,
            expected_generation=0,
        )
    not_a_result = StoreProxy(store, try_claim_task=lambda inner, *a, **kw: object())
    with pytest.raises(
        StoreContractError,
        match=r"^try_claim_task returned object; expected TaskClaimResult or None$",
    ):
        claim_task(
            as_store(not_a_result),
            record.task_id,
            expected_attempt_id=record.attempt_id,
            expected_generation=0,
        )
    claim(store, record)

    def lying_recovery(inner: ContractStore, task_id: str, **kw: Any) -> TaskRecoveryResult:
        return TaskRecoveryResult(
            task_id=task_id,
            abandoned_attempt_id=kw["expected_attempt_id"],
            recovered_attempt_id="next",
            run_id="run-1",
            node_index=0,
            generation=kw["expected_generation"] + 1,
            resumed_from_wait_id=None,
        )

    proxy = StoreProxy(store, try_recover_task=lying_recovery)
    with pytest.raises(
        StoreContractError, match=r"^try_recover_task returned generation 1; expected 0$"
    ):
        recover_task(
            as_store(proxy),
            record.task_id,
            expected_attempt_id=record.attempt_id,
            expected_generation=0,
        )
