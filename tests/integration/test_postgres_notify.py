"""An idle worker on PostgreSQL is woken by LISTEN/NOTIFY, not by polling.

A separate process (this file run as a script) blocks in
``dequeue(wait_seconds=30)``; the test process then enqueues a run's first
task. The waiting process returns with the delivery far sooner than its 30 s
wait (the slow poll it would otherwise fall back to), and while it waited
its listening connection sat in ``LISTEN dagwerk_work``.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import psycopg
from pg_workers import open_store, schema_url, until

from dagwerk.backends.postgres import PostgresStore
from dagwerk.orchestrator import OrchestratorCallbacks, start_run
from dagwerk.testing.helpers import root

WAIT = 30.0


def waiter_main(url: str, label: str, out: str) -> None:
    store = PostgresStore(url, pool_size=1, application_name=label)
    assert store.dequeue("idle", limit=1, lease_seconds=30.0) == []
    store.wait_for_work(0.0)  # starts listening (the first wait returns at once)
    Path(out).with_suffix(".ready").write_text("ready")
    rows = store.dequeue("idle", limit=1, lease_seconds=30.0, wait_seconds=WAIT)
    Path(out).write_text(f"{time.time()} {len(rows)}")
    store.close()


def _noop(run_id: str) -> None:
    del run_id


def test_idle_worker_in_another_process_wakes_on_notify(postgres_url: str, tmp_path: Path) -> None:
    import subprocess

    out = tmp_path / "woke"
    label = f"dagwerk-idle-{uuid.uuid4().hex[:8]}"
    with schema_url(postgres_url, "notify") as url:
        store = open_store(url)  # migrates the schema before the waiter opens it
        proc = subprocess.Popen([sys.executable, __file__, "wait", url, label, str(out)])
        try:
            until(lambda: out.with_suffix(".ready").exists(), 60, "the waiter to listen")
            with psycopg.connect(postgres_url, autocommit=True) as admin:
                # The waiter has nothing to do: its listener idles in LISTEN.
                until(
                    lambda: (
                        admin.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                            "AND state = 'idle' AND query = 'LISTEN dagwerk_work'",
                            (label,),
                        ).fetchone()
                        == (1,)
                    ),
                    30,
                    "the listening connection",
                )
            assert proc.poll() is None
            enqueued = time.time()
            assert store.create_run("run-1", [root("src")])
            start_run(store, "run-1", callbacks=OrchestratorCallbacks(_noop, _noop, _noop, _noop))
            assert proc.wait(WAIT + 30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        woke, count = out.read_text().split()
        assert int(count) == 1
        latency = float(woke) - enqueued
        # Woken by the notification: a small fraction of the 30 s wait.
        assert latency < 2.0, latency
        store.close()


if __name__ == "__main__":
    if sys.argv[1] == "wait":
        waiter_main(sys.argv[2], sys.argv[3], sys.argv[4])
