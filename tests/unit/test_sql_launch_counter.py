"""A completion learns whether it completed its launch from the launch's
counter as read with its task, under the lock every write of the counter
takes: the counter's update needs no answer and no read of the launch follows
it (it used to be read back, or answered by ``RETURNING``).
PostgreSQL's side, the read under the run lock, is in
``tests/integration/test_postgres_lock_modes.py``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import RunStatus
from dagwerk.models import EmittedOutput
from dagwerk.orchestrator import reconcile_run
from dagwerk.store import ClaimedDelivery, CompletionRequest, TaskCompletionResult
from dagwerk.testing.helpers import CallbackLog, child, emit, new_run, root


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


def _launch_of_three(store: SqliteStore) -> tuple[CallbackLog, list[ClaimedDelivery]]:
    """A root that emitted three outputs, and its EACH child's three tasks
    (one launch) claimed."""
    log = new_run(store, [root("a"), child("c", "a")])
    (first,) = store.claim_deliveries("w1", limit=3, lease_seconds=30.0)
    assert _complete(store, first, emit("a-1", "a-2", "a-3")).launch_complete
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    claimed = list(store.claim_deliveries("w1", limit=3, lease_seconds=30.0))
    assert len(claimed) == 3
    return log, claimed


@pytest.mark.parametrize("batched", [True, False])
def test_each_completion_learns_whether_it_completed_the_launch(
    tmp_path: Path, statements: Counter[str], batched: bool
) -> None:
    names = statements
    with SqliteStore(str(tmp_path / "db.sqlite")) as store:
        log, claimed = _launch_of_three(store)
        names.clear()
        if batched:
            # One completion per call: the counter moves three times.
            completes = [
                _complete(store, entry, emit(f"c-{n}")).launch_complete
                for n, entry in enumerate(claimed)
            ]
            moved = names["launch_count_completions"]
        else:
            completes = []
            for n, entry in enumerate(claimed):
                row = entry.delivery
                result = store.try_complete_task(
                    row.task_id, emit(f"c-{n}"), expected_attempt_id=row.attempt_id
                )
                assert result is not None
                completes.append(result.launch_complete)
            moved = names["launch_count_completion"]
        assert completes == [False, False, True]
        assert moved == 3, names
        # Nothing read the launch: its counter came with each task.
        assert not [name for name in names if name.startswith("launch") and "count" not in name]
        reconcile_run(store, "run-1", callbacks=log.callbacks)
        assert store.get_run_status("run-1") is RunStatus.COMPLETED


def test_a_batch_of_one_launchs_tasks_completes_it_once(tmp_path: Path) -> None:
    """Requests for tasks of one launch in one call: each counts from the
    counter read with the tasks, in request order."""
    with SqliteStore(str(tmp_path / "db.sqlite")) as store:
        _, claimed = _launch_of_three(store)
        (lone, *pair) = claimed
        assert not _complete(store, lone, emit("c-0")).launch_complete
        outcomes = store.complete_and_ack(
            "w1",
            [
                CompletionRequest(
                    task_id=entry.delivery.task_id,
                    expected_attempt_id=entry.delivery.attempt_id,
                    outputs=emit(f"c-{n}"),
                    delivery_id=entry.delivery.delivery_id,
                )
                for n, entry in enumerate(pair, start=1)
            ],
        )
        assert [isinstance(o, TaskCompletionResult) and o.launch_complete for o in outcomes] == [
            False,
            True,
        ]
