"""Workers sharing one database file, through the ``dagwerk`` command: a
worker leaves tasks it has no plugin for to a worker that has them, two
``dagwerk run`` of different pipelines complete side by side, ``--queue``
narrows what a worker serves, and ``worker --burst`` waits for a retry on
its backoff; a dead worker's expired lease and its absence show in
``runs --stalled``, ``show --why`` and ``/healthz``."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.engine import Engine
from dagwerk.health import HealthServer, HealthState
from dagwerk.metrics import Metrics
from dagwerk.pipeline_file import load_pipeline
from dagwerk.testing.cli import DagwerkCli

ROOT = Path(__file__).resolve().parents[2]
FLAKY = str(ROOT / "examples" / "pipelines" / "flaky.yaml")

_PIPELINE = """\
name: {name}
plugins: [{name}_plugins]
nodes:
  - slug: rows
    plugin: {name}_rows
  - slug: each
    plugin: {name}_each
    input_mode: each
    {queue}
    edges:
      - {{name: rows, source: rows}}
"""

_PLUGINS = """\
import dagwerk


@dagwerk.plugin("{name}_rows")
def rows(inputs, ctx):
    return [{{"n": n}} for n in range({count})]


@dagwerk.plugin("{name}_each")
def each(inputs, ctx):
    (row,) = inputs.edges["rows"]
    return {{"{name}": row.fields["n"]}}
"""


class Cli(DagwerkCli):
    def pipeline(self, name: str, *, count: int = 20, queue: str | None = None) -> str:
        """A pipeline of its own plugins (``<name>_plugins.py``) next to the database."""
        (self.cwd / f"{name}_plugins.py").write_text(
            _PLUGINS.format(name=name, count=count), encoding="utf-8"
        )
        path = self.cwd / f"{name}.yaml"
        line = f"queue: {queue}" if queue else ""
        path.write_text(_PIPELINE.format(name=name, queue=line), encoding="utf-8")
        return str(path)


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path, "shared.db")


def test_run_leaves_another_pipelines_queued_tasks_alone(cli: Cli) -> None:
    customers = cli.pipeline("customers")
    orders = cli.pipeline("orders")
    waiting = cli("submit", customers, "--run-id", "customers-run")
    assert waiting.returncode == 0, waiting.stderr
    # This run's worker has only the orders plugins: it completes its own run
    # and never touches the customers run's queued task (nothing failed,
    # no delivery spent).
    ran = cli.json("run", orders)
    assert ran["status"] == "completed"
    shown = cli.json("show", "customers-run")
    assert shown["run"]["status"] == "running"
    (rows,) = [node for node in shown["nodes"] if node["slug"] == "rows"]
    assert rows["tasks"] == {"queued": 1}
    assert cli.json("dlq", "list") == []
    # The diagnosis names what is missing.
    stalled = cli.json("runs", "--stalled")
    assert [s["run_id"] for s in stalled] == ["customers-run"]
    assert "no live worker has plugin 'customers_rows'" in stalled[0]["reason"]
    # A worker that has the plugins finishes it.
    burst = cli("worker", "--pipeline", customers, "--burst")
    assert burst.returncode == 0, burst.stderr
    assert cli.json("show", "customers-run")["run"]["status"] == "completed"


def test_two_runs_of_different_pipelines_on_one_file_both_complete(cli: Cli) -> None:
    first, second = cli.pipeline("alpha", count=40), cli.pipeline("beta", count=40)
    processes = [
        subprocess.Popen(
            cli.argv("run", path, "--json"),
            cwd=cli.cwd,
            env=cli.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in (first, second)
    ]
    results = [process.communicate(timeout=180) for process in processes]
    for process, (stdout, stderr) in zip(processes, results, strict=True):
        assert process.returncode == 0, stderr
        document = json.loads(stdout)
        assert document["status"] == "completed", document
        assert "UnknownPluginError" not in stderr


def test_worker_queue_option_serves_only_those_queues(cli: Cli) -> None:
    pipeline = cli.pipeline("routed", count=3, queue="io")
    assert cli("submit", pipeline, "--run-id", "routed-run").returncode == 0
    # The roots are on the default queue, the fan-out on "io".
    other = cli("worker", "--pipeline", pipeline, "--queue", "cpu", "--burst")
    assert other.returncode == 0, other.stderr
    assert "no work left after 0 task attempts" in other.stderr
    roots = cli("worker", "--pipeline", pipeline, "--queue", "default", "--burst")
    assert "no work left after 1 task attempt " in roots.stderr, roots.stderr
    shown = cli.json("show", "routed-run")
    assert {n["slug"]: n["tasks"] for n in shown["nodes"]}["each"] == {"queued": 3}
    io = cli("worker", "--pipeline", pipeline, "--queue", "io", "--burst")
    assert "no work left after 3 task attempts" in io.stderr, io.stderr
    assert cli.json("show", "routed-run")["run"]["status"] == "completed"


def test_run_queue_option_is_accepted_and_limits_the_worker(cli: Cli) -> None:
    pipeline = cli.pipeline("single", count=2)
    ran = cli.json("run", pipeline, "--queue", "default")
    assert ran["status"] == "completed"


def test_burst_worker_waits_for_a_retry_on_its_backoff(cli: Cli) -> None:
    failed = cli.json_failing("run", FLAKY, env={"FLAKY_STORE_DOWN": "1"})
    run_id = failed["run_id"]
    # Running fetch again means two failed attempts, each retried after a
    # backoff: the burst worker must wait for them instead of exiting.
    assert cli("rerun", run_id, "--node", "fetch").returncode == 0
    burst = cli("worker", "--pipeline", FLAKY, "--burst")
    assert burst.returncode == 0, burst.stderr
    shown = cli.json("show", run_id)
    assert shown["run"]["status"] == "completed", shown


def test_a_dead_workers_expired_lease_shows_in_the_diagnosis_and_in_health(cli: Cli) -> None:
    pipeline = cli.pipeline("lost", count=1)
    # 100 s ago: the run was submitted, a worker claimed its root task under
    # a 30 s lease and then died.
    with Engine(cli.db, clock=lambda: time.time() - 100.0) as before:
        before.submit(load_pipeline(pipeline), run_id="lost-run")
        (claimed,) = before.store.claim_deliveries("dead-worker", limit=1, lease_seconds=30.0)
        assert claimed.task is not None
        before.store.record_worker(
            "dead-worker", plugins=["lost_rows", "lost_each"], queues=None, ttl_seconds=30.0
        )
    (stalled,) = cli.json("runs", "--stalled")
    assert stalled["run_id"] == "lost-run" and stalled["held_nodes"] == ["rows", "each"]
    assert re.search(
        r"rows: task \S+ is RUNNING on a lease of worker dead-worker that expired 7\ds ago; "
        r"no live worker has plugin 'lost_rows' \(no worker seen for 1\d\ds\)",
        stalled["reason"],
    ), stalled["reason"]
    why = cli("show", "lost-run", "--why")
    assert "rows: held - task" in why.stdout and "no worker seen for" in why.stdout
    store = SqliteStore(cli.db)
    try:
        with HealthServer(Metrics(store=store), HealthState(store), port=0) as server:
            try:
                urllib.request.urlopen(f"{server.url}/healthz", timeout=10)
            except urllib.error.HTTPError as exc:
                status, health = exc.code, json.loads(exc.read())
    finally:
        store.close()
    assert status == 503 and health["status"] == "unhealthy"
    assert health["workers_live"] == 0 and health["expired_leases"] == 1
    first, second = health["problems"][-2:]
    assert first.startswith("1 deliveries held on leases expired over 60s ago")
    assert "worker dead-worker" in first
    assert re.fullmatch(
        r"deliveries are waiting and no worker is live \(no worker seen for 1\d\ds\)", second
    )
    # A worker that has the plugins recovers the task and finishes the run.
    assert cli("worker", "--pipeline", pipeline, "--burst").returncode == 0
    assert cli.json("show", "lost-run")["run"]["status"] == "completed"
