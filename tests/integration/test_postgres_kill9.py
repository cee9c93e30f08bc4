"""``kill -9`` of a worker process mid-task on PostgreSQL (the SQLite version
is in test_worker_processes.py): another worker recovers the attempt once
its lease runs out, the run completes, and no output is published twice."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pg_workers import fan_nodes, ledger_entries, open_store, schema_url, spawn_script_worker, until

from dagwerk.constants import RUN_TERMINAL_STATUSES, RunStatus, TaskStatus
from dagwerk.orchestrator import OrchestratorCallbacks, start_run

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")

RUN_ID = "run-1"


def _noop(run_id: str) -> None:
    del run_id


def test_kill_9_mid_task_is_recovered_by_another_worker_on_postgres(
    postgres_url: str, tmp_path: Path
) -> None:
    ledger, logs = tmp_path / "ledger", tmp_path / "logs"
    ledger.mkdir()
    logs.mkdir()
    with schema_url(postgres_url, "kill9") as url:
        store = open_store(url)
        assert store.create_run(RUN_ID, fan_nodes("mw_hold"), run_input={"count": 3})
        start_run(store, RUN_ID, callbacks=OrchestratorCallbacks(_noop, _noop, _noop, _noop))
        first = spawn_script_worker(url, ledger, logs, "w1")
        second: subprocess.Popen[bytes] | None = None
        try:
            until(lambda: len(ledger_entries(ledger)[0]) == 2, 60, "the first hold to start")
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            (ledger / "release").write_text("go")
            second = spawn_script_worker(url, ledger, logs, "w2")
            until(lambda: store.get_run_status(RUN_ID) in RUN_TERMINAL_STATUSES, 90, "the run")
        finally:
            (ledger / "stop").write_text("stop")
            for proc in (first, second):
                if proc is not None:
                    try:
                        proc.wait(30)
                    finally:
                        if proc.poll() is None:
                            proc.kill()
        assert first.returncode == -signal.SIGKILL
        assert second is not None and second.returncode == 0, (logs / "w2.err").read_text()
        assert store.get_run_status(RUN_ID) is RunStatus.COMPLETED
        outputs = store.get_output_ids(RUN_ID, 1)
        assert len(outputs) == 3 == len(set(outputs))  # no output published twice
        history = {t.task_id: store.list_attempts(t.task_id) for t in store.list_tasks(RUN_ID)}
        killed = [a for attempts in history.values() for a in attempts if a.worker_id == "w1"]
        # w1 ran the generator (completed) and one hold, which crashed.
        assert sorted(str(a.status) for a in killed) == sorted(
            [str(TaskStatus.COMPLETED), str(TaskStatus.CRASHED)]
        )
        entries, duplicates = ledger_entries(ledger)
        assert duplicates == []
        # gen, the killed hold's attempt 1 and its retry, two more holds, fan-in.
        assert len(entries) == 6, entries
        store.close()
