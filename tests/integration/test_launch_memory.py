"""A large launch holds each of its task rows once while it writes them."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from dagwerk.engine import open_store
from dagwerk.orchestrator import reconcile_run
from dagwerk.store import CompletionRequest
from dagwerk.testing.helpers import chain, emit, new_run, tasks_of

TASKS = 20_000

BYTES_PER_TASK = 1_000
"""The launch's own allocations per task, at their peak. It peaks at 760-890
bytes per task (SQLite and PostgreSQL, Python 3.11 and 3.13), mostly its task
rows; building every task's delivery row beside them, as a second list, takes
a SQLite launch past 1,200."""


@pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)
def test_a_large_launch_holds_its_rows_once(database_url: str) -> None:
    """W3's memory bound: the launch of a 20,000-task EACH node peaks at
    under 1,000 bytes of its own per task."""
    peaks: list[int] = []
    with open_store(database_url) as store:
        log = new_run(store, chain(2))
        (entry,) = store.claim_deliveries("w", limit=1, lease_seconds=60.0)
        request = CompletionRequest(
            delivery_id=entry.delivery.delivery_id,
            task_id=entry.delivery.task_id,
            expected_attempt_id=entry.delivery.attempt_id,
            outputs=emit(*(f"out-{n}" for n in range(TASKS)), k=1),
        )
        store.complete_and_ack("w", [request])
        launch = store.try_create_node_launch

        def measured(*args: Any, **kwargs: Any) -> Any:
            tracemalloc.start()
            try:
                before, _ = tracemalloc.get_traced_memory()
                result = launch(*args, **kwargs)
                peaks.append(tracemalloc.get_traced_memory()[1] - before)
            finally:
                tracemalloc.stop()
            return result

        store.try_create_node_launch = measured
        reconcile_run(store, "run-1", callbacks=log.callbacks)
        assert len(tasks_of(store, "run-1", 1)) == TASKS
    (peak,) = peaks
    assert peak / TASKS < BYTES_PER_TASK, peak / TASKS
