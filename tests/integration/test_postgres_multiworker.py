"""Many machines on one PostgreSQL server: four ``dagwerk worker`` processes.

Four separate ``python -m dagwerk worker --db postgresql://...`` processes
(as on four machines: each its own interpreter and connection pool) serve
20 runs of the fan-out/fan-in pipeline submitted at once. Every run
completes; every task ran exactly once per attempt, by the store's attempt
records and by the ledger the plugins write; each of the four workers did
some of the work; SIGTERM stops each worker cleanly (exit 0).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from pg_workers import (
    WorkerProcess,
    fan_nodes,
    ledger_entries,
    open_store,
    schema_url,
    until,
)

from dagwerk.constants import RUN_TERMINAL_STATUSES, RunStatus, TaskStatus
from dagwerk.orchestrator import OrchestratorCallbacks, start_run

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGTERM")

RUNS = 20
ITEMS = 12  # spread tasks per run: 20 * (1 + 12 + 1) = 280 tasks in all


def _noop(run_id: str) -> None:
    del run_id


CALLBACKS = OrchestratorCallbacks(_noop, _noop, _noop, _noop)


def test_four_worker_processes_share_twenty_fan_out_fan_in_runs(
    postgres_url: str, tmp_path: Path
) -> None:
    ledger, logs = tmp_path / "ledger", tmp_path / "logs"
    ledger.mkdir()
    logs.mkdir()
    with schema_url(postgres_url, "multi") as url:
        store = open_store(url)
        workers: list[WorkerProcess] = []
        try:
            workers = [
                WorkerProcess(url, ledger, logs, f"w{n}", "--concurrency", "4") for n in range(4)
            ]
            until(lambda: all(w.worker_id for w in workers), 60, "four workers to start")
            run_ids = [f"run-{n:02d}" for n in range(RUNS)]
            for run_id in run_ids:
                assert store.create_run(run_id, fan_nodes(), run_input={"count": ITEMS})
            for run_id in run_ids:
                start_run(store, run_id, callbacks=CALLBACKS)
            until(
                lambda: all(store.get_run_status(r) in RUN_TERMINAL_STATUSES for r in run_ids),
                240,
                "every run to end",
            )
            codes = [w.terminate() for w in workers]
        finally:
            for w in workers:
                w.kill()
        stderr = {w.worker_id: w.stderr() for w in workers}
        assert codes == [0, 0, 0, 0], stderr
        for worker_id, text in stderr.items():
            assert f"worker {worker_id}: stopped" in text, text
            assert "Traceback" not in text, text
        ids = {w.worker_id for w in workers}
        assert len(ids) == 4

        statuses = {run_id: store.get_run_status(run_id) for run_id in run_ids}
        assert set(statuses.values()) == {RunStatus.COMPLETED}, statuses
        attempts = []
        for run_id in run_ids:
            tasks = store.list_tasks(run_id)
            assert len(tasks) == 1 + ITEMS + 1
            assert {t.status for t in tasks} == {TaskStatus.COMPLETED}
            for task in tasks:
                history = store.list_attempts(task.task_id)
                # Nothing failed or crashed: each task has its one attempt.
                assert [(a.number, a.status) for a in history] == [(1, TaskStatus.COMPLETED)]
                attempts.append((task.task_id, history[0].worker_id))
            fanin = store.get_output_ids(run_id, 2)
            (total,) = store.resolve_outputs(run_id, fanin).values()
            assert total.fields["total"] == sum(range(ITEMS))
        # The ledger: one entry per attempt, none run twice.
        entries, duplicates = ledger_entries(ledger)
        assert duplicates == []
        expected = sorted(f"{task_id.replace(':', '_')}.1" for task_id, _ in attempts)
        assert entries == expected
        # The work was spread over all four workers.
        per_worker = Counter(worker for _, worker in attempts)
        assert set(per_worker) == ids, per_worker
        assert store.list_deliveries() == []
        assert store.list_dead_letters() == []
        store.close()
