"""A ``dagwerk worker`` process waits out a stopped PostgreSQL server.

The server (a cluster of this test's own) is stopped while the worker runs
four tasks; the tasks are let go during the outage, so their settlements
meet the stopped server. After a few seconds the server is started again.
The worker stays up, used little CPU while it waited, logged a bounded
number of lines and no traceback, and finishes the run: every task is
settled once, every output published once, no attempt ran twice.

With the default reconnect timeout (30 s) the outage passes inside the
store's calls; with ``?reconnect_timeout=1`` in the URL the calls fail
during it, and the worker's fault gate says so in one line, pauses, and
says when the server answers again.
"""

from __future__ import annotations

import os
import sys
import time
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

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses pg_ctl and /proc")

RUN_ID = "run-1"
HOLDS = 8
OUTAGE = 5.0
# The CPU the worker may use while the server is down: well under a core.
CPU_SHARE = 0.25
# The worker's own lines: its start, the fault and its clearing (a few
# threads may each report theirs), its stop.
MAX_LINES = 20


@pytest.fixture
def cluster(postgres_url: str) -> Iterator[Cluster]:
    del postgres_url  # gates the test as the other PostgreSQL tests
    with private_cluster() as made:
        yield made


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime: fields 14 and 15 of the line, 12 and 13 after the name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _noop(run_id: str) -> None:
    del run_id


@pytest.mark.parametrize("query", ["", "?reconnect_timeout=1"], ids=["in-call", "fault-gate"])
def test_a_worker_waits_out_a_stopped_server_and_settles_every_task_once(
    cluster: Cluster, tmp_path: Path, query: str
) -> None:
    ledger, logs = tmp_path / "ledger", tmp_path / "logs"
    ledger.mkdir()
    logs.mkdir()
    store = open_store(cluster.url)
    worker: WorkerProcess | None = None
    try:
        assert store.create_run(RUN_ID, fan_nodes("mw_hold"), run_input={"count": HOLDS})
        start_run(store, RUN_ID, callbacks=OrchestratorCallbacks(_noop, _noop, _noop, _noop))
        worker = WorkerProcess(cluster.url + query, ledger, logs, "w0", "--concurrency", "4")
        until(lambda: len(ledger_entries(ledger)[0]) == 1 + 4, 60, "four running tasks")
        cluster.stop()
        (ledger / "release").write_text("go")  # they finish while the server is down
        used = _cpu_seconds(worker.proc.pid)
        begun = time.monotonic()
        deadline = begun + OUTAGE
        while time.monotonic() < deadline:  # the outage lasts OUTAGE seconds
            assert worker.proc.poll() is None, worker.stderr()
            time.sleep(0.1)
        share = (_cpu_seconds(worker.proc.pid) - used) / (time.monotonic() - begun)
        cluster.start()
        # The same store object serves again once the server is back.
        until(lambda: store.get_run_status(RUN_ID) in RUN_TERMINAL_STATUSES, 180, "the run")
        assert worker.proc.poll() is None, worker.stderr()
        code = worker.terminate()
    finally:
        if worker is not None:
            worker.kill()
    stderr = worker.stderr()
    assert code == 0, stderr
    assert share < CPU_SHARE, f"{share:.2f} of a core while the server was down"
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) <= MAX_LINES, stderr
    if query:
        where = f"PostgreSQL at 127.0.0.1:{cluster.port}"
        faults = [line for line in lines if where in line]
        assert faults, stderr
        assert all("start the server and the run continues" in line for line in faults), stderr
        assert any("answers again" in line for line in lines), stderr
    assert_fan_settled_once(store, RUN_ID, ledger, HOLDS, stderr)
    store.close()


# The default reconnect timeout, which one call to open the store waited.
RECONNECT_TIMEOUT = 30.0


def _fault_lines(worker: WorkerProcess, cluster: Cluster) -> list[str]:
    where = f"PostgreSQL at 127.0.0.1:{cluster.port}"
    return [line for line in worker.stderr().splitlines() if where in line]


def test_a_worker_started_while_the_server_is_down_says_so_at_once_and_serves_once_it_is_up(
    cluster: Cluster, tmp_path: Path
) -> None:
    ledger, logs = tmp_path / "ledger", tmp_path / "logs"
    ledger.mkdir()
    logs.mkdir()
    open_store(cluster.url).close()  # the schema exists; the worker only opens it
    cluster.stop()
    started = time.monotonic()
    worker = WorkerProcess(cluster.url, ledger, logs, "w0")
    try:
        until(lambda: bool(_fault_lines(worker, cluster)), 60, "the fault line")
        # Before the store's reconnect timeout: the line does not wait for it.
        assert time.monotonic() - started < RECONNECT_TIMEOUT / 2, worker.stderr()
        assert worker.worker_id is None  # not serving yet
        cluster.start()
        until(lambda: worker.worker_id is not None, 60, "the worker serving")
        store = open_store(cluster.url)
        try:
            assert store.create_run(RUN_ID, fan_nodes(), run_input={"count": 3})
            start_run(store, RUN_ID, callbacks=OrchestratorCallbacks(_noop, _noop, _noop, _noop))
            until(lambda: store.get_run_status(RUN_ID) in RUN_TERMINAL_STATUSES, 60, "the run")
            assert store.get_run_status(RUN_ID) == "completed"
        finally:
            store.close()
        code = worker.terminate()
    finally:
        worker.kill()
    stderr = worker.stderr()
    assert code == 0, stderr
    assert "Traceback" not in stderr
    faults = _fault_lines(worker, cluster)
    assert len(faults) == 1, stderr
    assert "start the server" in faults[0], faults
    assert any("answers again" in line for line in stderr.splitlines()), stderr


def test_sigterm_while_the_worker_waits_for_the_server_exits_0_at_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    ledger, logs = tmp_path / "ledger", tmp_path / "logs"
    ledger.mkdir()
    logs.mkdir()
    cluster.stop()
    worker = WorkerProcess(cluster.url, ledger, logs, "w0")
    try:
        until(lambda: bool(_fault_lines(worker, cluster)), 60, "the fault line")
        code = worker.terminate(timeout=15)
    finally:
        worker.kill()
    stderr = worker.stderr()
    assert code == 0, stderr
    assert "Traceback" not in stderr
    assert "stopped before the database opened" in stderr, stderr
