"""A completion of a run without budget accounts reads the accounts once.

Accounts are attached while a run is PENDING (or with a child's creation) and
a run never returns to PENDING, so the SQL store remembers a started run found
without any; on PostgreSQL that read was a round trip inside every
completion's run lock. Budgeted runs are never remembered: the budget
contract suite checks their charges on every backend.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.budgets import Budget
from dagwerk.orchestrator import start_run
from dagwerk.store import CompletionRequest
from dagwerk.testing.helpers import CallbackLog, new_run, root


def _count_account_reads(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    original = store._accounts

    def counting(tx: object, run_id: str) -> object:
        reads.append(run_id)
        return original(tx, run_id)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_accounts", counting)
    return reads


def _complete_each(store: SqliteStore, *, batched: bool) -> None:
    claimed = store.claim_deliveries("w", limit=10, lease_seconds=60.0)
    assert len(claimed) == 2
    for row in claimed:
        assert row.task is not None
        if batched:
            request = CompletionRequest(
                delivery_id=row.delivery.delivery_id,
                task_id=row.task.task_id,
                expected_attempt_id=row.task.attempt_id,
                outputs=(),
            )
            (outcome,) = store.complete_and_ack("w", [request])
        else:
            outcome = store.try_complete_task(
                row.task.task_id, (), expected_attempt_id=row.task.attempt_id
            )
        assert outcome is not None and not isinstance(outcome, Exception)


@pytest.mark.parametrize("batched", [True, False], ids=["complete_and_ack", "try_complete_task"])
def test_an_unbudgeted_run_reads_its_accounts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batched: bool
) -> None:
    with SqliteStore(tmp_path / "db.sqlite") as store:
        new_run(store, [root("a"), root("b")])
        reads = _count_account_reads(store, monkeypatch)
        _complete_each(store, batched=batched)
        assert reads == ["run-1"]


@pytest.mark.parametrize("batched", [True, False], ids=["complete_and_ack", "try_complete_task"])
def test_a_budgeted_run_reads_its_accounts_at_every_completion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batched: bool
) -> None:
    with SqliteStore(tmp_path / "db.sqlite") as store:
        new_run(store, [root("a"), root("b")], start=False)
        assert store.try_set_run_budget("run-1", Budget(max_output_bytes=10_000))
        start_run(store, "run-1", callbacks=CallbackLog().callbacks)
        reads = _count_account_reads(store, monkeypatch)
        _complete_each(store, batched=batched)
        assert reads.count("run-1") >= 2


def test_a_started_unbudgeted_run_reports_no_budget_without_a_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker reads a run's budget for every batch; once a completion
    found the started run without accounts, that read is not repeated."""
    with SqliteStore(tmp_path / "db.sqlite") as store:
        new_run(store, [root("a"), root("b")])
        reads = _count_account_reads(store, monkeypatch)
        assert store.get_run_budget("run-1") == ()
        _complete_each(store, batched=True)
        assert reads == ["run-1", "run-1"]  # the view, then the first completion
        assert store.get_run_budget("run-1") == ()
        assert reads == ["run-1", "run-1"]
