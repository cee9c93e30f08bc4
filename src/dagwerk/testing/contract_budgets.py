"""Contract tests: run budgets (BG-01..BG-06), on every backend.

Bytes are canonical JSON bytes; cost is reserved before execution and
settled by the commit that ends the attempt.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dagwerk.backends.sql import SqlStore
from dagwerk.budgets import (
    AdmissionStatus,
    Budget,
    BudgetExhaustedError,
    cost_to_units,
    output_bytes,
)
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.execution import recover_task
from dagwerk.lineage import RunLink, child_lineage, encode_lineage
from dagwerk.models import DagNode, TaskInputs
from dagwerk.orchestrator import cancel_run, start_run
from dagwerk.runtime.budget_guard import ByteLimits
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.plugins import PluginRegistry
from dagwerk.runtime.worker import Worker
from dagwerk.store import DagBudgetStore, DagChildStore, InvalidStoreValueError
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    claim,
    emit,
    new_run,
    only_task,
    root,
    task,
)


def _budgeted(store: ContractStore, nodes: Any, budget: Budget, run_id: str = "run-1") -> None:
    assert isinstance(store, DagBudgetStore)
    new_run(store, nodes, run_id, start=False)
    assert store.try_set_run_budget(run_id, budget)
    start_run(store, run_id, callbacks=CallbackLog().callbacks)


def _usage(store: ContractStore, run_id: str = "run-1") -> Any:
    assert isinstance(store, DagBudgetStore)
    (usage,) = store.get_run_budget(run_id)
    return usage


def _admit(store: ContractStore, record: Any, units: int | None, size: int = 0) -> Any:
    assert isinstance(store, DagBudgetStore)
    return store.try_admit_task(
        record.task_id, expected_attempt_id=record.attempt_id, input_bytes=size, cost_units=units
    )


def _worker(
    store: ContractStore, tmp_path: Path, plugins: dict[str, Any] | PluginRegistry, **kw: Any
) -> Worker:
    return Worker(store, plugins, execution_root=tmp_path, **kw)


def test_bg_05_estimate_is_reserved_then_charged_on_success(
    store: ContractStore, tmp_path: Path
) -> None:
    """Limit 1 credit, estimate 0.4: success leaves 0.4 charged, nothing reserved."""
    _budgeted(store, [root("a")], Budget(max_cost=1))
    seen: list[float] = []

    def plugin(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        seen.append(_usage(store).reserved_cost)
        return {"ok": True}

    _worker(store, tmp_path, {"a": plugin}, cost_estimates={"a": 0.4}).run_until_idle()
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert seen == [0.4]  # held while the plugin ran
    usage = _usage(store)
    assert usage.charged_cost == 0.4
    assert usage.reserved_units == 0


def test_bg_05_missing_estimate_fails_without_executing(
    store: ContractStore, tmp_path: Path
) -> None:
    _budgeted(store, [root("a")], Budget(max_cost=1))
    calls: list[str] = []
    _worker(store, tmp_path, {"a": lambda i, c: calls.append("ran")}).run_until_idle()
    assert calls == []
    record = only_task(store, "run-1", 0)
    assert record.status is TaskStatus.FAILED
    assert "cost_estimate_missing" in (record.error or "")


def test_bg_04_exhaustion_is_a_non_retryable_failure(store: ContractStore, tmp_path: Path) -> None:
    _budgeted(store, [root("a")], Budget(max_cost=1))
    calls: list[str] = []
    worker = _worker(
        store, tmp_path, {"a": lambda i, c: calls.append("ran")}, cost_estimates={"a": 1.5}
    )
    worker.run_until_idle()
    record = only_task(store, "run-1", 0)
    assert calls == []
    assert record.status is TaskStatus.FAILED
    assert record.attempt_number == 1  # no retry
    assert "budget_exhausted" in (record.error or "")
    assert _usage(store).charged_units == 0


def test_bg_05_siblings_racing_for_the_last_unit_never_both_run(store: ContractStore) -> None:
    _budgeted(store, [root("a"), root("b")], Budget(max_cost=1))
    records = [only_task(store, "run-1", 0), only_task(store, "run-1", 1)]
    for record in records:
        claim(store, record)
    barrier = threading.Barrier(2)
    results: list[Any] = []

    def admit(record: Any) -> None:
        barrier.wait()
        results.append(_admit(store, record, cost_to_units(1)).status)

    threads = [threading.Thread(target=admit, args=(r,)) for r in records]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [AdmissionStatus.ADMITTED, AdmissionStatus.EXHAUSTED]
    assert _usage(store).reserved_units == cost_to_units(1)


def test_bg_05_reclaim_after_a_crash_releases_the_hold(store: ContractStore) -> None:
    _budgeted(store, [root("a")], Budget(max_cost=1))
    record = only_task(store, "run-1", 0)
    claim(store, record)
    assert _admit(store, record, cost_to_units(0.7)).status is AdmissionStatus.ADMITTED
    assert _usage(store).reserved_units == cost_to_units(0.7)
    # The worker died here; a redelivery reclaims the task under a new attempt.
    recovered = recover_task(
        store,
        record.task_id,
        expected_attempt_id=record.attempt_id,
        expected_generation=record.generation,
    )
    assert recovered is not None
    assert _usage(store).reserved_units == 0
    retried = task(store, record.task_id)
    claim(store, retried)
    assert _admit(store, retried, cost_to_units(0.7)).status is AdmissionStatus.ADMITTED


def test_bg_05_failure_and_cancellation_release_the_hold(store: ContractStore) -> None:
    _budgeted(store, [root("a"), root("b")], Budget(max_cost=1))
    first, second = only_task(store, "run-1", 0), only_task(store, "run-1", 1)
    claim(store, first)
    claim(store, second)
    assert _admit(store, first, cost_to_units(0.5)).status is AdmissionStatus.ADMITTED
    assert _admit(store, second, cost_to_units(0.5)).status is AdmissionStatus.ADMITTED
    store.mark_task_failed(first.task_id, "boom", expected_attempt_id=first.attempt_id)
    assert _usage(store).reserved_units == cost_to_units(0.5)
    assert cancel_run(store, "run-1", callbacks=CallbackLog().callbacks)
    assert _usage(store).reserved_units == 0
    assert _usage(store).charged_units == 0


def test_bg_04_stale_writes_consume_nothing(store: ContractStore) -> None:
    _budgeted(store, [root("a")], Budget(max_cost=1, max_input_bytes=100, max_output_bytes=100))
    record = only_task(store, "run-1", 0)
    # Not claimed yet: the QUEUED attempt cannot be admitted.
    assert _admit(store, record, 10, size=10).status is AdmissionStatus.STALE
    claim(store, record)
    assert store.try_complete_task(record.task_id, emit("x"), expected_attempt_id="nope") is None
    usage = _usage(store)
    assert (usage.used_input_bytes, usage.used_output_bytes, usage.reserved_units) == (0, 0, 0)


def test_bg_04_accepted_input_stays_charged_and_repeats_charge_once(store: ContractStore) -> None:
    _budgeted(store, [root("a")], Budget(max_input_bytes=100))
    record = only_task(store, "run-1", 0)
    claim(store, record)
    assert _admit(store, record, None, size=60).status is AdmissionStatus.ADMITTED
    assert _admit(store, record, None, size=60).status is AdmissionStatus.ADMITTED
    store.mark_task_failed(record.task_id, "boom", expected_attempt_id=record.attempt_id)
    assert _usage(store).used_input_bytes == 60


def test_bg_02_input_over_budget_is_refused(store: ContractStore) -> None:
    _budgeted(store, [root("a")], Budget(max_input_bytes=10))
    record = only_task(store, "run-1", 0)
    claim(store, record)
    admission = _admit(store, record, None, size=11)
    assert admission.status is AdmissionStatus.EXHAUSTED
    assert "max_input_bytes" in admission.detail
    assert _usage(store).used_input_bytes == 0


def test_bg_02_outputs_are_charged_in_the_completion_commit(store: ContractStore) -> None:
    _budgeted(store, [root("a"), root("b")], Budget(max_output_bytes=60))
    first, second = only_task(store, "run-1", 0), only_task(store, "run-1", 1)
    claim(store, first)
    claim(store, second)
    assert store.try_complete_task(
        first.task_id, emit("o1", v=1), expected_attempt_id=first.attempt_id
    )
    used = _usage(store).used_output_bytes
    assert 0 < used <= 60
    with pytest.raises(BudgetExhaustedError):
        store.try_complete_task(
            second.task_id, emit("o2", "o3", v="x" * 40), expected_attempt_id=second.attempt_id
        )
    # Refused before any write: still RUNNING, nothing published or charged.
    assert task(store, second.task_id).status is TaskStatus.RUNNING
    assert store.get_output_ids("run-1", 1) == ()
    assert _usage(store).used_output_bytes == used


def test_bg_child_draws_on_its_roots_budget(store: ContractStore) -> None:
    assert isinstance(store, DagChildStore) and isinstance(store, DagBudgetStore)
    _budgeted(store, [root("p")], Budget(max_cost=1))
    lineage = child_lineage(
        None, parent_run_id="run-1", parent_task_id="t", parent_pipeline_id="p", pipeline_id="c"
    )

    def link(run_id: str) -> RunLink:
        return RunLink(run_id, "run-1", "t", "run-1", encode_lineage(lineage))

    assert store.create_child_run("kid", [root("k")], link=link("kid"))
    assert [a.account_run_id for a in store.get_run_budget("kid")] == ["run-1"]
    assert store.create_child_run("own", [root("k")], link=link("own"), budget=Budget(max_cost=0.5))
    assert [a.account_run_id for a in store.get_run_budget("own")] == ["own", "run-1"]
    with pytest.raises(InvalidStoreValueError):
        store.create_child_run("big", [root("k")], link=link("big"), budget=Budget(max_cost=2))
    assert store.get_run_status("big") is None


def test_bg_06_without_budget_nothing_is_accounted(store: ContractStore, tmp_path: Path) -> None:
    new_run(store, [root("a")])
    _worker(store, tmp_path, {"a": lambda i, c: {"x": 1}}).run_until_idle()
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert isinstance(store, DagBudgetStore)
    assert store.get_run_budget("run-1") == ()


def test_bg_01_worker_byte_limits_are_fixed_at_construction(
    store: ContractStore, tmp_path: Path
) -> None:
    """A run budget far above the worker's limit does not raise it."""
    _budgeted(store, [root("a")], Budget(max_output_bytes=10_000_000))
    seen: list[ByteLimits] = []

    def plugin(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        seen.append(ctx.byte_limits)
        return {"big": "x" * 200}

    limits = ByteLimits(max_output_bytes=100)
    worker = _worker(store, tmp_path, {"a": plugin}, byte_limits=limits)
    worker.run_until_idle()
    assert seen == [ByteLimits(max_output_bytes=100)]
    record = only_task(store, "run-1", 0)
    assert record.status is TaskStatus.FAILED
    assert "budget_exhausted" in (record.error or "")


# --- per-node cost estimates -------------------------------------------------------------


def test_bg_05_node_cost_estimate_wins_over_the_plugins(
    store: ContractStore, tmp_path: Path
) -> None:
    """A node's ``cost_estimate`` is reserved and charged instead of the
    plugin's registered ``cost``; a node without one uses the plugin's."""
    nodes = [DagNode(slug="cheap", plugin="a", cost_estimate=0.25), root("plain", plugin="a")]
    _budgeted(store, nodes, Budget(max_cost=1))
    registry = PluginRegistry()
    registry.register("a", lambda i, c: {"ok": True}, cost=0.5)
    _worker(store, tmp_path, registry).run_until_idle()
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    usage = _usage(store)
    assert usage.charged_units == cost_to_units(0.25) + cost_to_units(0.5)
    assert usage.reserved_units == 0


def test_bg_05_node_cost_estimate_suffices_without_a_plugin_estimate(
    store: ContractStore, tmp_path: Path
) -> None:
    _budgeted(store, [DagNode(slug="a", plugin="a", cost_estimate=0.6)], Budget(max_cost=1))
    calls: list[str] = []
    _worker(store, tmp_path, {"a": lambda i, c: calls.append("ran")}).run_until_idle()
    assert calls == ["ran"]
    assert _usage(store).charged_units == cost_to_units(0.6)


# --- BG-04: a persistence exception never under-counts ----------------------------------


class _PersistenceFailed(RuntimeError):
    pass


@contextmanager
def _failing_statement(store: ContractStore, statement: str) -> Iterator[None]:
    """Make the SQL store's write transactions raise at ``statement``, after
    every earlier statement of the transaction (the charges) has run."""
    if not isinstance(store, SqlStore):
        pytest.skip("the in-memory store has no transactions to interrupt")
    gateway: Any = store.gateway
    original = gateway.write

    class _Tx:
        def __init__(self, tx: Any) -> None:
            self._tx = tx

        def run(self, name: str, params: Any = None) -> int:
            if name == statement:
                raise _PersistenceFailed(f"{name} could not be written")
            result: int = self._tx.run(name, params)
            return result

        def __getattr__(self, name: str) -> Any:
            return getattr(self._tx, name)

    @contextmanager
    def write() -> Iterator[Any]:
        with original() as tx:
            yield _Tx(tx)

    gateway.write = write
    try:
        yield
    finally:
        gateway.write = original


def test_bg_04_persistence_exception_in_admission_consumes_nothing(
    store: ContractStore,
) -> None:
    """The input charge and the hold are one transaction with the admission's
    own record: a write that fails after the charge rolls the charge back
    with it, so usage always equals what was persisted."""
    _budgeted(store, [root("a")], Budget(max_cost=1, max_input_bytes=100))
    record = only_task(store, "run-1", 0)
    claim(store, record)
    with _failing_statement(store, "budget_hold_insert"), pytest.raises(_PersistenceFailed):
        _admit(store, record, cost_to_units(0.4), size=30)
    usage = _usage(store)
    assert (usage.used_input_bytes, usage.reserved_units) == (0, 0)
    # Nothing is left half-done: the same admission succeeds once, in full.
    assert _admit(store, record, cost_to_units(0.4), size=30).status is AdmissionStatus.ADMITTED
    usage = _usage(store)
    assert (usage.used_input_bytes, usage.reserved_units) == (30, cost_to_units(0.4))


def test_bg_04_persistence_exception_in_completion_keeps_the_reservation(
    store: ContractStore,
) -> None:
    """A completion whose write fails after the output charge commits nothing:
    no outputs, no output bytes, no cost charge, and the hold stays reserved
    for the still-RUNNING attempt (never under-counted). A later completion
    of the same attempt charges exactly once."""
    _budgeted(store, [root("a")], Budget(max_cost=1, max_output_bytes=1_000))
    record = only_task(store, "run-1", 0)
    claim(store, record)
    assert _admit(store, record, cost_to_units(0.4)).status is AdmissionStatus.ADMITTED
    outputs = emit("o1", v=1)
    with _failing_statement(store, "task_complete"), pytest.raises(_PersistenceFailed):
        store.try_complete_task(record.task_id, outputs, expected_attempt_id=record.attempt_id)
    usage = _usage(store)
    assert (usage.used_output_bytes, usage.charged_units) == (0, 0)
    assert usage.reserved_units == cost_to_units(0.4)
    assert task(store, record.task_id).status is TaskStatus.RUNNING
    assert store.get_output_ids("run-1", 0) == ()
    assert store.try_complete_task(record.task_id, outputs, expected_attempt_id=record.attempt_id)
    usage = _usage(store)
    assert usage.used_output_bytes == output_bytes(outputs)
    assert (usage.charged_units, usage.reserved_units) == (cost_to_units(0.4), 0)
