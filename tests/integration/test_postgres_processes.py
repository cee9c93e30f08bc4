"""Real processes on one PostgreSQL server: four workers share one queue.

The workers are this file run as a script (``python test_postgres_processes.py
work ...``), so each is a separate interpreter with its own connection pool,
as on separate machines. A worker prints one line per event it committed
(``C`` claim, ``D`` done), flushed at once. Idle workers block in
``dequeue(wait_seconds=...)``, which LISTENs for new work.
``DAGWERK_POSTGRES_STRESS_TASKS`` raises the task count (default 2,000).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dagwerk.backends.postgres import PostgresStore
from dagwerk.constants import RUN_TERMINAL_STATUSES, RunStatus, TaskStatus
from dagwerk.execution import claim_task
from dagwerk.orchestrator import OrchestratorCallbacks, on_task_complete, reconcile_run
from dagwerk.testing.helpers import child, emit, new_run, root, tasks_of

STRESS_TASKS = int(os.environ.get("DAGWERK_POSTGRES_STRESS_TASKS", "2000"))
RUN_ID = "run-1"


def _callbacks() -> OrchestratorCallbacks:
    def noop(run_id: str) -> None:
        del run_id

    return OrchestratorCallbacks(
        on_run_completed=noop, on_run_failed=noop, on_run_crashed=noop, on_run_cancelled=noop
    )


# --- the worker (runs in a child process) --------------------------------------------


def worker_main(url: str, schema: str, worker_id: str, limit: int) -> None:
    """Drain run-1: dequeue, claim, complete, ack; reconcile when a delivered
    task has already settled. Starts when the parent writes a line to stdin,
    so all four begin together."""
    store = PostgresStore(url, schema=schema, pool_size=2)
    callbacks = _callbacks()
    out = sys.stdout
    sys.stdin.readline()
    while store.get_run_status(RUN_ID) not in RUN_TERMINAL_STATUSES:
        rows = store.dequeue(worker_id, limit=limit, lease_seconds=60.0, wait_seconds=0.2)
        for row in rows:
            claimed = claim_task(
                store,
                row.task_id,
                expected_attempt_id=row.attempt_id,
                expected_generation=row.generation,
            )
            if claimed is None:
                reconcile_run(store, row.run_id, callbacks=callbacks)
                store.ack(row.delivery_id, worker_id)
                continue
            out.write(f"C {row.task_id} {row.attempt_id}\n")
            out.flush()
            on_task_complete(
                store,
                task_id=row.task_id,
                expected_attempt_id=row.attempt_id,
                outputs=(),
                callbacks=callbacks,
            )
            out.write(f"D {row.task_id} {row.attempt_id}\n")
            out.flush()
            # False once the run has completed: finalising drops its queue rows.
            store.ack(row.delivery_id, worker_id)
    store.close()


# --- the test --------------------------------------------------------------------------


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = f"procs_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _setup(url: str, schema: str, tasks: int) -> None:
    """run-1: a root whose completion fans out into ``tasks`` leaf tasks."""
    with PostgresStore(url, schema=schema) as store:
        new_run(store, [root("src"), child("leaf", "src")], RUN_ID)
        (root_row,) = store.dequeue("setup", limit=1, lease_seconds=60.0)
        assert claim_task(
            store,
            root_row.task_id,
            expected_attempt_id=root_row.attempt_id,
            expected_generation=0,
        )
        on_task_complete(
            store,
            task_id=root_row.task_id,
            expected_attempt_id=root_row.attempt_id,
            outputs=emit(*(f"o{i}" for i in range(tasks))),
            callbacks=_callbacks(),
        )
        assert store.ack(root_row.delivery_id, "setup")
        assert len(tasks_of(store, RUN_ID, 1)) == tasks


def test_four_processes_complete_every_task_exactly_once(
    postgres_url: str, schema: str, tmp_path: Path
) -> None:
    _setup(postgres_url, schema, STRESS_TASKS)
    logs = [tmp_path / f"w{n}.log" for n in range(4)]
    workers = []
    for n, log in enumerate(logs):
        # Two workers take one row at a time, two take batches of eight.
        args = [sys.executable, __file__, "work", postgres_url, schema, f"w{n}", str(1 + n % 2 * 7)]
        with open(log, "w") as out, open(log.with_suffix(".err"), "w") as err:
            workers.append(
                subprocess.Popen(args, stdin=subprocess.PIPE, stdout=out, stderr=err, text=True)
            )
    events: list[tuple[str, str, str, str]] = []
    try:
        for proc in workers:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.close()
        for n, (proc, log) in enumerate(zip(workers, logs, strict=True)):
            proc.wait(timeout=600)
            assert proc.returncode == 0, log.with_suffix(".err").read_text()
            for line in log.read_text().splitlines():
                kind, task_id, attempt = line.split()
                events.append((f"w{n}", kind, task_id, attempt))
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    claims = [(task_id, attempt) for _, kind, task_id, attempt in events if kind == "C"]
    done = [task_id for _, kind, task_id, _ in events if kind == "D"]
    # No attempt was claimed twice; every task was claimed and completed once.
    assert len(set(claims)) == len(claims) == STRESS_TASKS
    assert Counter(done) == Counter({task_id: 1 for task_id, _ in claims})
    # The work was spread: every process claimed some of it.
    per_worker = Counter(worker for worker, kind, _, _ in events if kind == "C")
    assert set(per_worker) == {"w0", "w1", "w2", "w3"}, per_worker
    with PostgresStore(postgres_url, schema=schema) as store:
        assert store.get_run_status(RUN_ID) is RunStatus.COMPLETED
        leaves = tasks_of(store, RUN_ID, 1)
        assert len(leaves) == STRESS_TASKS
        assert {t.status for t in leaves} == {TaskStatus.COMPLETED}
        assert {t.task_id for t in leaves} == set(done)
        assert store.list_deliveries() == []  # nothing lost, nothing left over
        assert store.list_dead_letters() == []


if __name__ == "__main__":
    if sys.argv[1] == "work":
        worker_main(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        raise SystemExit(json.dumps({"error": f"unknown mode {sys.argv[1]!r}"}))
