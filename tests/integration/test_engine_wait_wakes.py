"""``Engine.wait`` reads the run again as soon as the store says it may have
changed (``ChangeWaitStore``: on a SQLite file another process's commit, on
PostgreSQL the notification of a run's end), not only every
``poll_interval``: a client with a 30 s poll still sees a run a worker
process ended within moments."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from dagwerk import DagNode, Engine, RunStatus

PLUGIN = """
import dagwerk

@dagwerk.plugin("ping")
def ping(inputs, ctx):
    return {"ok": 1}
"""

POLL = 30.0


def test_wait_sees_another_processs_end_of_the_run_long_before_its_poll(
    database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "ping_plugins.py").write_text(PLUGIN)
    with Engine(database_url, execution_root=tmp_path, poll_interval=POLL) as client:
        assert client.capabilities.changes is not None
        run_id = client.submit([DagNode(slug="p", plugin="ping")])
        with open(tmp_path / "worker.err", "w") as err:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dagwerk",
                    "worker",
                    "--db",
                    database_url,
                    "--plugins",
                    str(tmp_path / "ping_plugins.py"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                cwd=tmp_path,
            )
        try:
            began = time.monotonic()
            # The first read finds the run unfinished (the worker is still
            # starting); the next comes with the worker's commits.
            result = client.wait(run_id, timeout=120)
            waited = time.monotonic() - began
        finally:
            worker.terminate()
            worker.wait(60)
    assert result.status is RunStatus.COMPLETED, (tmp_path / "worker.err").read_text()
    assert result.outputs["p"][0].fields["ok"] == 1
    assert waited < POLL / 2, waited
