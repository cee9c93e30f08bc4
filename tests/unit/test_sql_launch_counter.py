"""A launch's completion counter moves in one statement where the database
has ``RETURNING`` (SQLite 3.35+, PostgreSQL), in an update and a read where
it has not; either way each completion learns whether it completed the
launch (issue 9)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.backends.sqlite import gateway as sqlite_gateway
from dagwerk.constants import RunStatus
from dagwerk.models import EmittedOutput
from dagwerk.orchestrator import reconcile_run
from dagwerk.store import ClaimedDelivery, CompletionRequest, TaskCompletionResult
from dagwerk.testing.helpers import child, emit, new_run, root


def _complete(
    store: SqliteStore, entry: ClaimedDelivery, outputs: tuple[EmittedOutput, ...]
) -> TaskCompletionResult:
    row = entry.delivery
    request = CompletionRequest(
        task_id=row.task_id,
        expected_attempt_id=row.attempt_id,
        outputs=outputs,
        delivery_id=row.delivery_id,
    )
    (outcome,) = store.complete_and_ack("w1", [request])
    assert isinstance(outcome, TaskCompletionResult), outcome
    return outcome


@pytest.mark.parametrize("returning", [True, False])
def test_each_completion_learns_whether_it_completed_the_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, returning: bool
) -> None:
    if returning and not sqlite_gateway.SqliteGateway.returning:
        pytest.skip("this SQLite has no RETURNING")
    names: Counter[str] = Counter()
    execute, many = sqlite_gateway._Tx._execute, sqlite_gateway._Tx.many

    def counted_execute(self: sqlite_gateway._Tx, name: str, params: object) -> object:
        names[name] += 1
        return execute(self, name, params)  # type: ignore[arg-type]

    def counted_many(self: sqlite_gateway._Tx, name: str, rows: object) -> None:
        names[name] += 1
        many(self, name, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite_gateway._Tx, "_execute", counted_execute)
    monkeypatch.setattr(sqlite_gateway._Tx, "many", counted_many)
    with SqliteStore(str(tmp_path / "db.sqlite")) as store:
        monkeypatch.setattr(store._sqlite, "returning", returning)
        log = new_run(store, [root("a"), child("c", "a")])
        (first,) = store.claim_deliveries("w1", limit=3, lease_seconds=30.0)
        assert _complete(store, first, emit("a-1", "a-2", "a-3")).launch_complete
        reconcile_run(store, "run-1", callbacks=log.callbacks)
        claimed = store.claim_deliveries("w1", limit=3, lease_seconds=30.0)
        assert len(claimed) == 3  # one launch of three tasks
        names.clear()
        # One completion per call: the counter moves three times.
        completes = [
            _complete(store, entry, emit(f"c-{n}")).launch_complete
            for n, entry in enumerate(claimed)
        ]
        assert completes == [False, False, True]
        reconcile_run(store, "run-1", callbacks=log.callbacks)
        assert store.get_run_status("run-1") is RunStatus.COMPLETED
    if returning:
        assert names["launch_count_returning"] == 3 and names["launch_by_id"] == 0, names
    else:
        assert names["launch_count_completions"] == 3 and names["launch_by_id"] == 3, names
