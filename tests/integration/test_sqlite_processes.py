"""Real processes on one SQLite file: concurrency and SIGKILL crash safety.

The workers are this file run as a script (``python test_sqlite_processes.py
work ...``), so each one is a separate interpreter with its own connection.
A worker prints one line per event it committed (``C`` claim, ``D`` done,
``R`` recovery), flushed at once, so the parent knows what a killed worker
did. ``DAGWERK_SQLITE_STRESS_TASKS`` raises the task count of the stress test
(default 2,000; the issue's full run is 20,000) and
``DAGWERK_SQLITE_LAUNCH_TASKS`` the size of the launch killed mid-write.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import RUN_TERMINAL_STATUSES, RunStatus, TaskStatus
from dagwerk.execution import claim_task, recover_task
from dagwerk.orchestrator import OrchestratorCallbacks, on_task_complete, reconcile_run
from dagwerk.testing.helpers import (
    assert_queued_tasks_deliverable,
    child,
    emit,
    new_run,
    root,
    tasks_of,
)

STRESS_TASKS = int(os.environ.get("DAGWERK_SQLITE_STRESS_TASKS", "2000"))
LAUNCH_TASKS = int(os.environ.get("DAGWERK_SQLITE_LAUNCH_TASKS", "5000"))
RUN_ID = "run-1"


def _callbacks() -> OrchestratorCallbacks:
    def noop(run_id: str) -> None:
        del run_id

    return OrchestratorCallbacks(
        on_run_completed=noop, on_run_failed=noop, on_run_crashed=noop, on_run_cancelled=noop
    )


# --- the worker (runs in a child process) --------------------------------------------


def worker_main(path: str, worker_id: str, limit: int, fanout: int, clock_offset: float) -> None:
    """Drain run-1: dequeue, claim, complete (the root emits ``fanout``
    outputs), ack; recover attempts abandoned by a dead worker on redelivery;
    reconcile when a redelivered task has already settled."""
    store = SqliteStore(path, clock=lambda: time.time() + clock_offset)
    callbacks = _callbacks()
    out = sys.stdout
    while store.get_run_status(RUN_ID) not in RUN_TERMINAL_STATUSES:
        rows = store.dequeue(worker_id, limit=limit, lease_seconds=60.0)
        if not rows:
            time.sleep(0.005)  # idle poll of a worker, not a test synchronisation
            continue
        for row in rows:
            claimed = claim_task(
                store,
                row.task_id,
                expected_attempt_id=row.attempt_id,
                expected_generation=row.generation,
            )
            if claimed is None:
                record = store.get_task(row.task_id)
                if (
                    record is not None
                    and record.status is TaskStatus.RUNNING
                    and record.attempt_id == row.attempt_id
                ):
                    # Redelivered after its lease expired: the owner died.
                    if recover_task(
                        store,
                        row.task_id,
                        expected_attempt_id=row.attempt_id,
                        expected_generation=row.generation,
                    ):
                        out.write(f"R {row.task_id} {row.attempt_id}\n")
                else:
                    # Settled or stale: make sure the run moved on from it.
                    reconcile_run(store, row.run_id, callbacks=callbacks)
                store.ack(row.delivery_id, worker_id)
                out.flush()
                continue
            out.write(f"C {row.task_id} {row.attempt_id}\n")
            out.flush()
            outputs = emit(*(f"o{i}" for i in range(fanout))) if row.node_index == 0 else ()
            on_task_complete(
                store,
                task_id=row.task_id,
                expected_attempt_id=row.attempt_id,
                outputs=outputs,
                callbacks=callbacks,
            )
            out.write(f"D {row.task_id} {row.attempt_id}\n")
            out.flush()
            store.ack(row.delivery_id, worker_id)
    store.close()


def _spawn(
    path: Path,
    worker_id: str,
    *,
    limit: int,
    fanout: int = 0,
    offset: float = 0.0,
    log: Path | None = None,
) -> subprocess.Popen[str]:
    """Start a worker. With ``log`` its output goes to files (a pipe that no one
    reads would fill up and block the worker); otherwise to pipes."""
    args = [
        sys.executable,
        __file__,
        "work",
        str(path),
        worker_id,
        str(limit),
        str(fanout),
        str(offset),
    ]
    if log is None:
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(log, "w") as out, open(log.with_suffix(".err"), "w") as err:
        return subprocess.Popen(args, stdout=out, stderr=err, text=True)


def _events(text: str) -> list[tuple[str, str, str]]:
    events = []
    for line in text.splitlines():
        kind, task_id, attempt_id = line.split()
        events.append((kind, task_id, attempt_id))
    return events


def _setup(path: Path, tasks: int) -> None:
    """run-1: a root whose completion fans out into ``tasks`` leaf tasks."""
    with SqliteStore(path) as store:
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


def _integrity(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()


def _assert_consistent(store: SqliteStore) -> None:
    """The state-machine invariants after a crash: queued work is deliverable,
    launches are all-or-nothing, counts agree with the tasks."""
    assert_queued_tasks_deliverable(store, RUN_ID)
    launches = store.list_node_launches(RUN_ID)
    for index, launch in launches.items():
        assert len(tasks_of(store, RUN_ID, index)) == len(launch.task_ids)
    if 1 not in launches:
        assert tasks_of(store, RUN_ID, 1) == []
    run = store.get_run(RUN_ID)
    assert run is not None
    completed = sum(1 for t in store.list_tasks(RUN_ID) if t.status is TaskStatus.COMPLETED)
    assert run.settled_nodes <= 2 and completed <= len(store.list_tasks(RUN_ID))


# --- tests ---------------------------------------------------------------------------------


def test_four_processes_complete_every_task_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "stress.db"
    _setup(path, STRESS_TASKS)
    # Two workers take one row at a time, two take batches of eight.
    logs = [tmp_path / f"w{n}.log" for n in range(4)]
    workers = [_spawn(path, f"w{n}", limit=1 + n % 2 * 7, log=logs[n]) for n in range(4)]
    events: list[tuple[str, str, str]] = []
    try:
        for proc, log in zip(workers, logs, strict=True):
            proc.wait(timeout=600)
            stderr = log.with_suffix(".err").read_text()
            assert proc.returncode == 0, stderr
            assert "locked" not in stderr
            events += _events(log.read_text())
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    claims = [(task_id, attempt) for kind, task_id, attempt in events if kind == "C"]
    done = [task_id for kind, task_id, _ in events if kind == "D"]
    # No attempt was claimed twice, every task was claimed and completed once.
    assert len(set(claims)) == len(claims) == STRESS_TASKS
    assert Counter(done) == Counter({task_id: 1 for task_id, _ in claims})
    with SqliteStore(path) as store:
        assert store.get_run_status(RUN_ID) is RunStatus.COMPLETED
        leaves = tasks_of(store, RUN_ID, 1)
        assert len(leaves) == STRESS_TASKS
        assert {t.status for t in leaves} == {TaskStatus.COMPLETED}
        assert {t.task_id for t in leaves} == set(done)
        assert store.list_deliveries() == []  # nothing lost, nothing left over
        assert store.list_dead_letters() == []
    _integrity(path)


def test_sigkill_mid_work_leaves_a_consistent_database_and_work_resumes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "crash.db"
    tasks = 400
    _setup(path, tasks)
    victim = _spawn(path, "victim", limit=4)
    assert victim.stdout is not None
    seen = 0
    for line in victim.stdout:
        seen += line.startswith("D ")
        if seen >= 60:
            break
    os.kill(victim.pid, signal.SIGKILL)
    victim.communicate()
    assert victim.returncode == -signal.SIGKILL
    _integrity(path)
    with SqliteStore(path) as store:
        _assert_consistent(store)
        assert store.get_run_status(RUN_ID) is RunStatus.RUNNING
    # A new worker whose clock is an hour ahead sees every lease of the dead
    # worker expired, recovers its RUNNING attempts and finishes the run.
    rescuer = _spawn(path, "rescuer", limit=8, offset=3600.0)
    _, stderr = rescuer.communicate(timeout=600)
    assert rescuer.returncode == 0, stderr
    with SqliteStore(path) as store:
        assert store.get_run_status(RUN_ID) is RunStatus.COMPLETED
        leaves = tasks_of(store, RUN_ID, 1)
        assert len(leaves) == tasks
        assert {t.status for t in leaves} == {TaskStatus.COMPLETED}
        assert store.list_deliveries() == []
    _integrity(path)


def test_sigkill_during_launch_creation_is_all_or_nothing(tmp_path: Path) -> None:
    path = tmp_path / "launch.db"
    fanout = LAUNCH_TASKS
    with SqliteStore(path) as store:
        new_run(store, [root("src"), child("leaf", "src")], RUN_ID)
    victim = _spawn(path, "victim", limit=1, fanout=fanout)
    assert victim.stdout is not None
    assert victim.stdout.readline().startswith("C ")  # the root is claimed
    wal = Path(f"{path}-wal")
    start = wal.stat().st_size if wal.exists() else 0
    # Kill while the big completion/launch transaction is writing.
    deadline = time.monotonic() + 60
    while (wal.stat().st_size if wal.exists() else 0) < start + 100_000:
        assert time.monotonic() < deadline, "the launch never started writing"
    os.kill(victim.pid, signal.SIGKILL)
    victim.communicate()
    _integrity(path)
    with SqliteStore(path) as store:
        _assert_consistent(store)
        assert len(tasks_of(store, RUN_ID, 1)) in (0, fanout)
        outputs = store.get_output_ids(RUN_ID, 0)
        assert len(outputs) in (0, fanout)
    rescuer = _spawn(path, "rescuer", limit=64, fanout=fanout, offset=3600.0)
    _, stderr = rescuer.communicate(timeout=900)
    assert rescuer.returncode == 0, stderr
    with SqliteStore(path) as store:
        assert store.get_run_status(RUN_ID) is RunStatus.COMPLETED
        leaves = tasks_of(store, RUN_ID, 1)
        assert len(leaves) == fanout
        assert {t.status for t in leaves} == {TaskStatus.COMPLETED}


if __name__ == "__main__":
    if sys.argv[1] == "work":
        worker_main(
            sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
        )
    else:
        raise SystemExit(json.dumps({"error": f"unknown mode {sys.argv[1]!r}"}))
