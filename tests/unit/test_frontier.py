"""The targeted reconcile after a completion (dagwerk.frontier):
when it takes the short path, when it hands over to ``reconcile_run``, and
that both end in the same state on random DAGs (memory and SQLite)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagwerk.backends.memory import MemoryStore
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import FailurePolicy, InputMode, NodeDisposition, RunStatus
from dagwerk.execution import claim_task
from dagwerk.frontier import reconcile_after_completion
from dagwerk.models import EmittedOutput
from dagwerk.orchestrator import reconcile_run
from dagwerk.store import LaunchProgress, RunFrontier, StoreContractError
from dagwerk.testing.contract_frontier import drive, random_dag
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    StoreProxy,
    as_store,
    chain,
    child,
    new_run,
    only_task,
    root,
)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ContractStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    opened = SqliteStore(f"sqlite:///{tmp_path / 'frontier.db'}")
    yield opened
    opened.close()


def _count_full_reads(store: ContractStore) -> Counter[str]:
    """Counts ``list_node_launches`` calls (the full reconcile's read)."""
    calls: Counter[str] = Counter()
    inner = store.list_node_launches

    def counted(run_id: str) -> Mapping[int, Any]:
        calls["list_node_launches"] += 1
        return inner(run_id)

    store.list_node_launches = counted  # type: ignore[method-assign]
    return calls


def _finish(store: ContractStore, run_id: str, node_index: int, outputs: int = 1) -> None:
    """Claim and complete the node's only task (its launch completes)."""
    record = only_task(store, run_id, node_index)
    won = claim_task(
        store,
        record.task_id,
        expected_attempt_id=record.attempt_id,
        expected_generation=record.generation,
    )
    assert won is not None
    emitted = tuple(EmittedOutput(id=f"{node_index}-{n}", fields={"n": n}) for n in range(outputs))
    result = store.try_complete_task(record.task_id, emitted, expected_attempt_id=won.attempt_id)
    assert result is not None and result.launch_complete


def test_a_chain_hop_launches_the_child_without_the_full_launch_list(
    store: ContractStore,
) -> None:
    log = new_run(store, chain(4))
    calls = _count_full_reads(store)
    _finish(store, "run-1", 0)
    reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
    assert calls["list_node_launches"] == 0
    launch = store.list_node_launches("run-1")[1]
    assert launch.disposition is NodeDisposition.LAUNCHED and not launch.complete
    assert 2 not in store.list_node_launches("run-1")


def test_a_child_waits_for_its_other_parent(store: ContractStore) -> None:
    log = new_run(store, [root("a"), root("b"), child("c", "a", "b", mode=InputMode.ALL)])
    _finish(store, "run-1", 0)
    reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
    assert 2 not in store.list_node_launches("run-1")
    _finish(store, "run-1", 1)
    reconcile_after_completion(store, "run-1", [1], callbacks=log.callbacks)
    assert store.list_node_launches("run-1")[2].disposition is NodeDisposition.LAUNCHED


def test_the_last_node_hands_over_and_the_run_completes(store: ContractStore) -> None:
    log = new_run(store, chain(2))
    _finish(store, "run-1", 0)
    reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
    calls = _count_full_reads(store)
    _finish(store, "run-1", 1)
    reconcile_after_completion(store, "run-1", [1], callbacks=log.callbacks)
    assert calls["list_node_launches"] == 1
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert log.kinds("run-1") == ["completed"]


def test_a_zero_task_child_hands_over_and_its_children_are_launched(
    store: ContractStore,
) -> None:
    # n0 emits nothing: n1 (EACH) gets a zero-task launch, n2 follows it.
    log = new_run(store, chain(3))
    calls = _count_full_reads(store)
    _finish(store, "run-1", 0, outputs=0)
    reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
    assert calls["list_node_launches"] >= 1
    launches = store.list_node_launches("run-1")
    assert launches[1].complete and not launches[1].task_ids
    assert 2 in launches
    assert store.get_run_status("run-1") is RunStatus.COMPLETED


@pytest.mark.parametrize(
    "policy", [FailurePolicy.CONTINUE_OTHERS, FailurePolicy.STOP_ON_FIRST_FAILURE]
)
def test_other_policies_use_the_full_reconcile(store: ContractStore, policy: FailurePolicy) -> None:
    log = new_run(store, chain(3), failure_policy=policy)
    calls = _count_full_reads(store)
    _finish(store, "run-1", 0)
    reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
    assert calls["list_node_launches"] == 1
    assert 1 in store.list_node_launches("run-1")


def test_no_completed_nodes_means_a_full_reconcile(store: ContractStore) -> None:
    log = new_run(store, chain(2))
    calls = _count_full_reads(store)
    reconcile_after_completion(store, "run-1", [], callbacks=log.callbacks)
    assert calls["list_node_launches"] == 1


def test_a_store_without_the_frontier_uses_the_full_reconcile(store: ContractStore) -> None:
    log = new_run(store, chain(3))
    _finish(store, "run-1", 0)
    proxy = StoreProxy(store)
    reconcile_after_completion(as_store(proxy), "run-1", [0], callbacks=log.callbacks)
    assert proxy.calls["list_node_launches"] == 1
    assert 1 in store.list_node_launches("run-1")


def test_a_run_that_is_not_running_is_left_alone(store: ContractStore) -> None:
    log = new_run(store, chain(3))
    _finish(store, "run-1", 0)
    assert store.try_cancel_run("run-1", "stop")
    before = store.list_node_launches("run-1")
    reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
    assert store.list_node_launches("run-1") == before
    reconcile_after_completion(store, "no-such-run", [0], callbacks=log.callbacks)
    assert log.kinds() == []


def test_an_index_outside_the_run_hands_over(store: ContractStore) -> None:
    log = new_run(store, chain(2))
    calls = _count_full_reads(store)
    _finish(store, "run-1", 0)
    reconcile_after_completion(store, "run-1", [0, 9], callbacks=log.callbacks)
    assert calls["list_node_launches"] == 1
    assert 1 in store.list_node_launches("run-1")


def test_a_lying_frontier_is_a_contract_error() -> None:
    store = MemoryStore()
    log = new_run(store, chain(3))
    _finish(store, "run-1", 0)
    stray = LaunchProgress("x", 2, 0, NodeDisposition.LAUNCHED, False)

    def lying(
        run_id: str, node_indices: Sequence[int], *, count_complete: bool = False
    ) -> RunFrontier:
        return RunFrontier(RunStatus.RUNNING, 3, 1, False, {2: stray})

    store.get_run_frontier = lying  # type: ignore[method-assign]
    with pytest.raises(StoreContractError) as info:
        reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
    assert str(info.value) == (
        "get_run_frontier of run 'run-1' returned a launch of node 2; "
        "expected only the requested nodes [0, 1]"
    )

    def wrong_size(
        run_id: str, node_indices: Sequence[int], *, count_complete: bool = False
    ) -> RunFrontier:
        return RunFrontier(RunStatus.RUNNING, 7, 1, False, {})

    store.get_run_frontier = wrong_size  # type: ignore[method-assign]
    with pytest.raises(StoreContractError) as info:
        reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
    assert str(info.value) == "get_run_frontier of run 'run-1' returned node_count 7; expected 3"
    assert info.value.field == "node_count"


# --- equivalence on random DAGs (property) ----------------------------------


def _fresh(kind: str, tmp_path: Path, n: int) -> ContractStore:
    if kind == "memory":
        return MemoryStore()
    return SqliteStore(f"sqlite:///{tmp_path / f'prop-{n}.db'}")


_counter = iter(range(1_000_000))


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 10), failing=st.booleans())
def test_targeted_and_full_reconcile_pass_through_the_same_states(
    kind: str, tmp_path: Path, seed: int, size: int, failing: bool
) -> None:
    rng = random.Random(seed)
    nodes = random_dag(rng, size)
    outputs = {i: rng.choice([0, 1, 1, 2, 3]) for i in range(size)}
    fail_node = rng.randrange(size) if failing else None
    store = _fresh(kind, tmp_path, next(_counter))
    try:
        full = drive(store, "full", nodes, outputs, _full, fail_node=fail_node)
        targeted = drive(store, "tgt", nodes, outputs, _targeted, fail_node=fail_node)
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
    assert targeted == full


def _full(store: ContractStore, run_id: str, node_index: int, log: CallbackLog) -> None:
    reconcile_run(store, run_id, callbacks=log.callbacks)


def _targeted(store: ContractStore, run_id: str, node_index: int, log: CallbackLog) -> None:
    reconcile_after_completion(store, run_id, [node_index], callbacks=log.callbacks)
