"""Contract tests: the store's fast paths, on every backend.

``RunTopologyStore`` hands the orchestrator and the worker the run's
validated topology and single node definitions without copying every node
per call. The fast path must answer exactly what the slow path
(``get_run_nodes`` + ``RunTopology.build``) answers, and an orchestrator
using it must behave the same.
"""

from __future__ import annotations

import pytest

from dagwerk.capabilities import StoreCapabilities
from dagwerk.constants import FailurePolicy, InputMode, RunStatus
from dagwerk.errors import GraphValidationError
from dagwerk.limits import Limits
from dagwerk.orchestrator import reconcile_run, start_run
from dagwerk.store import RunTopologyStore
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    FakeWorker,
    StoreProxy,
    as_store,
    chain,
    child,
    new_run,
    root,
)
from dagwerk.topology import RunTopology

__all__ = [
    "test_fp_01_invalid_stored_definition_raises_and_start_leaves_run_pending",
    "test_fp_01_topology_equals_a_fresh_build_of_the_stored_nodes",
    "test_fp_02_run_node_is_a_private_copy_of_one_definition",
    "test_fp_03_orchestrator_uses_the_cached_topology_and_runs_to_completion",
    "test_fp_04_failure_policy_is_the_created_one_and_drives_the_orchestrator",
]


def _limits(store: ContractStore) -> Limits:
    found = StoreCapabilities.of(store).limits
    assert found is not None, "every shipped store validates with its limits"
    return found


def _topology_store(store: ContractStore) -> RunTopologyStore:
    assert isinstance(store, RunTopologyStore), "every shipped store offers the fast path"
    return store


def test_fp_01_topology_equals_a_fresh_build_of_the_stored_nodes(store: ContractStore) -> None:
    fast = _topology_store(store)
    nodes = [root("a"), child("b", "a"), child("c", "a"), child("d", "b", "c", mode=InputMode.ALL)]
    new_run(store, nodes, start=False)
    stored = store.get_run_nodes("run-1")
    assert stored is not None
    expected = RunTopology.build(stored, limits=_limits(store))
    found = fast.get_run_topology("run-1")
    assert isinstance(found, RunTopology)
    assert [n.slug for n in found.nodes] == [n.slug for n in expected.nodes] == ["a", "b", "c", "d"]
    assert found.dependencies == expected.dependencies == ((), (0,), (0,), (1, 2))
    assert found.children == expected.children
    assert dict(found.slug_to_index) == dict(expected.slug_to_index)
    # Asked again (now possibly from a cache) it is still the same graph.
    again = fast.get_run_topology("run-1")
    assert again is not None and again.dependencies == found.dependencies
    assert fast.get_run_topology("missing") is None


def test_fp_01_invalid_stored_definition_raises_and_start_leaves_run_pending(
    store: ContractStore,
) -> None:
    fast = _topology_store(store)
    new_run(store, [child("a", "b"), child("b", "a")], start=False)
    for _ in range(2):  # a failed build is not cached as a success
        with pytest.raises(GraphValidationError, match="cycle"):
            fast.get_run_topology("run-1")
    with pytest.raises(ValueError, match="cycle"):
        start_run(store, "run-1", callbacks=CallbackLog().callbacks)
    assert store.get_run_status("run-1") is RunStatus.PENDING
    assert store.list_tasks("run-1") == []


def test_fp_02_run_node_is_a_private_copy_of_one_definition(store: ContractStore) -> None:
    fast = _topology_store(store)
    new_run(store, chain(3), start=False)
    for index, slug in enumerate(["n0", "n1", "n2"]):
        node = fast.get_run_node("run-1", index)
        assert node is not None and node.slug == slug and node.plugin == slug
    assert fast.get_run_node("run-1", 3) is None
    assert fast.get_run_node("run-1", -1) is None
    assert fast.get_run_node("missing", 0) is None
    copy = fast.get_run_node("run-1", 1)
    assert copy is not None
    copy.plugin = "changed"
    again = fast.get_run_node("run-1", 1)
    assert again is not None and again.plugin == "n1"
    stored = store.get_run_nodes("run-1")
    assert stored is not None and stored[1].plugin == "n1"


def test_fp_03_orchestrator_uses_the_cached_topology_and_runs_to_completion(
    store: ContractStore,
) -> None:
    _topology_store(store)
    # A proxy that forwards the fast path: the orchestrator then reads no
    # node list at all, and the run still completes with every node's task.
    proxy = StoreProxy(store)
    proxy.get_run_topology = store.get_run_topology  # type: ignore[attr-defined]
    proxy.get_run_node = store.get_run_node  # type: ignore[attr-defined]
    proxy.get_run_failure_policy = store.get_run_failure_policy  # type: ignore[attr-defined]
    counted = as_store(proxy)
    assert isinstance(counted, RunTopologyStore)
    log = new_run(counted, chain(4), start=True)
    reconcile_run(counted, "run-1", callbacks=log.callbacks)
    assert proxy.calls["get_run_nodes"] == 0
    FakeWorker(counted, log).drain("run-1")
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert sorted({t.node_index for t in store.list_tasks("run-1")}) == [0, 1, 2, 3]


def test_fp_04_failure_policy_is_the_created_one_and_drives_the_orchestrator(
    store: ContractStore,
) -> None:
    fast = _topology_store(store)
    new_run(store, [root("a")], "run-ff", start=False)
    new_run(store, [root("a")], "run-co", failure_policy=FailurePolicy.CONTINUE_OTHERS, start=False)
    assert fast.get_run_failure_policy("run-ff") is FailurePolicy.FAIL_FAST
    for _ in range(2):  # asked again (possibly cached), still the created policy
        assert fast.get_run_failure_policy("run-co") is FailurePolicy.CONTINUE_OTHERS
    assert fast.get_run_failure_policy("missing") is None
    # Starting (and reconciling) a run takes the policy from the fast path:
    # no run record is read for it.
    proxy = StoreProxy(store)
    proxy.get_run_topology = store.get_run_topology  # type: ignore[attr-defined]
    proxy.get_run_node = store.get_run_node  # type: ignore[attr-defined]
    proxy.get_run_failure_policy = store.get_run_failure_policy  # type: ignore[attr-defined]
    counted = as_store(proxy)
    log = CallbackLog()
    start_run(counted, "run-co", callbacks=log.callbacks)
    assert proxy.calls["get_run"] == 0
