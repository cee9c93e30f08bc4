"""Completions that name their runs (``CompletionRequest.run_id``).

A worker knows each task's run from its delivery. On PostgreSQL,
``complete_and_ack`` groups the requests by run so that each group locks its
own run; with the runs named it needs no read to group them (one read
transaction less per batch). A group still locks the run of its first task as
stored, and checks that every task it read belongs to the named run: a wrong
name rolls the group back before it writes anything, and the rest of the call
is grouped by the stored runs, as without names.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dagwerk.backends.postgres import PostgresStore
from dagwerk.backends.postgres import gateway as pg_gateway
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.store import (
    ClaimedDelivery,
    CompletionRequest,
    InvalidStoreValueError,
    TaskCompletionResult,
)
from dagwerk.testing.helpers import emit, new_run, root


@pytest.fixture
def store(postgres_url: str, pg_schema: str) -> Iterator[PostgresStore]:
    with PostgresStore(postgres_url, schema=pg_schema) as opened:
        yield opened


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the blocks the store's transactions run."""
    seen: list[str] = []
    original = pg_gateway.PostgresTx._call

    def recording(self: Any, kind: str, name: str, *args: Any) -> Any:
        seen.append(name)
        return original(self, kind, name, *args)

    monkeypatch.setattr(pg_gateway.PostgresTx, "_call", recording)
    return seen


def _two_runs(store: Any) -> list[ClaimedDelivery]:
    new_run(store, [root("a"), root("b")], "run-1")
    new_run(store, [root("c")], "run-2")
    claimed = store.claim_deliveries("w", limit=3, lease_seconds=60.0)
    assert len(claimed) == 3 and all(e.task is not None for e in claimed)
    return list(claimed)


def _request(entry: ClaimedDelivery, run_id: str | None) -> CompletionRequest:
    row = entry.delivery
    return CompletionRequest(
        row.task_id, row.attempt_id, emit(f"out-{row.task_id}"), row.delivery_id, run_id
    )


def test_named_runs_need_no_read_to_group_the_requests(
    store: PostgresStore, calls: list[str]
) -> None:
    claimed = _two_runs(store)
    calls.clear()
    outcomes = store.complete_and_ack("w", [_request(e, e.delivery.run_id) for e in claimed])
    assert all(isinstance(o, TaskCompletionResult) for o in outcomes), outcomes
    assert "tasks_runs" not in calls
    # One completion transaction per run, each with its run's lock.
    assert sum("tasks_get_owned_many" in name for name in calls) == 2


def test_unnamed_runs_are_read_first(store: PostgresStore, calls: list[str]) -> None:
    claimed = _two_runs(store)
    calls.clear()
    outcomes = store.complete_and_ack("w", [_request(e, None) for e in claimed])
    assert all(isinstance(o, TaskCompletionResult) for o in outcomes), outcomes
    assert calls.count("tasks_runs") == 1


@pytest.mark.parametrize("wrong", ["swapped", "one run for all", "unknown run"])
def test_a_wrong_run_name_costs_a_read_never_a_wrong_write(
    store: PostgresStore, calls: list[str], wrong: str
) -> None:
    claimed = _two_runs(store)
    names = {
        "swapped": {"run-1": "run-2", "run-2": "run-1"},
        "one run for all": {"run-1": "run-1", "run-2": "run-1"},
        "unknown run": {"run-1": "run-9", "run-2": "run-9"},
    }[wrong]
    calls.clear()
    outcomes = store.complete_and_ack("w", [_request(e, names[e.delivery.run_id]) for e in claimed])
    assert all(isinstance(o, TaskCompletionResult) for o in outcomes), outcomes
    assert calls.count("tasks_runs") == 1  # the fallback grouped them by the stored runs
    for entry in claimed:
        record = store.get_task(entry.delivery.task_id)
        assert record is not None and record.status.value == "completed"
        wanted = f"out-{entry.delivery.task_id}"
        assert list(store.resolve_outputs(entry.delivery.run_id, (wanted,))) == [wanted]
    assert store.list_deliveries("run-1") == [] and store.list_deliveries("run-2") == []


def test_an_unknown_first_task_sends_the_group_to_the_read(
    store: PostgresStore, calls: list[str]
) -> None:
    """The run lock is taken through the group's first task: when that task
    is not found, the named run is not known to be locked, so the group is
    not completed on the name alone."""
    claimed = _two_runs(store)
    run_one = [e for e in claimed if e.delivery.run_id == "run-1"]
    ghost = CompletionRequest("no-such-task", "no-attempt", (), "no-delivery", "run-1")
    calls.clear()
    outcomes = store.complete_and_ack("w", [ghost, *(_request(e, "run-1") for e in run_one)])
    assert outcomes[0] is None
    assert all(isinstance(o, TaskCompletionResult) for o in outcomes[1:]), outcomes
    assert calls.count("tasks_runs") == 1


def test_a_run_id_that_is_not_a_string_is_refused(tmp_path: Any) -> None:
    with SqliteStore(str(tmp_path / "db.sqlite")) as store:
        (entry,) = _two_runs(store)[:1]
        bad = CompletionRequest(
            entry.delivery.task_id,
            entry.delivery.attempt_id,
            (),
            entry.delivery.delivery_id,
            5,  # type: ignore[arg-type]
        )
        with pytest.raises(InvalidStoreValueError) as raised:
            store.complete_and_ack("w", [bad])
        assert raised.value.field == "run_id"
