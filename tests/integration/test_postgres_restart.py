"""PostgreSQL restarted while a run is in progress.

A throw-away cluster of its own (``.ci/postgres.sh`` into a temporary
directory; the shared test server is never restarted) serves a fan-out run
to two ``dagwerk worker`` processes. While eight tasks are running, the
server is restarted (``pg_ctl restart -m fast``, which drops every
connection); then the tasks are let go. The workers stay up, reconnect and
finish the run: it completes, every output is published once, no attempt ran
twice, and SIGTERM still stops each worker cleanly.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_cluster import Cluster, private_cluster
from pg_workers import (
    WorkerProcess,
    assert_fan_settled_once,
    fan_nodes,
    ledger_entries,
    open_store,
    until,
)

from dagwerk.constants import RUN_TERMINAL_STATUSES
from dagwerk.orchestrator import OrchestratorCallbacks, start_run

RUN_ID = "run-1"
HOLDS = 16

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses pg_ctl and SIGTERM")


@pytest.fixture
def cluster(postgres_url: str) -> Iterator[Cluster]:
    """A cluster of this test's own (``postgres_url`` only gates the test:
    without a server in reach outside CI it is skipped like the others)."""
    del postgres_url
    with private_cluster() as made:
        yield made


def _noop(run_id: str) -> None:
    del run_id


def test_workers_survive_a_server_restart_and_finish_the_run(
    cluster: Cluster, tmp_path: Path
) -> None:
    ledger, logs = tmp_path / "ledger", tmp_path / "logs"
    ledger.mkdir()
    logs.mkdir()
    store = open_store(cluster.url)
    workers: list[WorkerProcess] = []
    try:
        assert store.create_run(RUN_ID, fan_nodes("mw_hold"), run_input={"count": HOLDS})
        start_run(store, RUN_ID, callbacks=OrchestratorCallbacks(_noop, _noop, _noop, _noop))
        workers = [
            WorkerProcess(cluster.url, ledger, logs, f"w{n}", "--concurrency", "4")
            for n in range(2)
        ]
        # The generator and eight holds (every slot of both workers) are running.
        until(lambda: len(ledger_entries(ledger)[0]) == 1 + 8, 60, "eight running tasks")
        cluster.restart()
        assert [w.proc.poll() for w in workers] == [None, None]
        (ledger / "release").write_text("go")
        until(lambda: store.get_run_status(RUN_ID) in RUN_TERMINAL_STATUSES, 180, "the run")
        assert [w.proc.poll() for w in workers] == [None, None]  # still serving
        codes = [w.terminate() for w in workers]
    finally:
        for w in workers:
            w.kill()
    stderr = "\n".join(w.stderr() for w in workers)
    assert codes == [0, 0], stderr
    assert_fan_settled_once(store, RUN_ID, ledger, HOLDS, stderr)
    store.close()
