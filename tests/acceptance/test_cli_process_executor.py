"""``--executor process`` from the command line: warm plugin processes are
reused (at most one per worker slot), import the plugin module once each,
and none outlives the worker, whether it finishes, is stopped with SIGTERM
or is killed with SIGKILL.

The plugin module lives next to its pipeline file in a temporary directory,
as a user's would; each task leaves a file naming the process it ran in.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

TASKS = 6
WAIT = 120.0

PLUGINS = """
import os
from pathlib import Path

import dagwerk

MARKS = Path(os.environ["POOL_MARKS"])
with open(MARKS / f"import-{os.getpid()}", "a") as imported:
    imported.write("x")


@dagwerk.plugin("items")
def items(inputs, ctx):
    return [{"n": n} for n in range(int(os.environ["POOL_TASKS"]))]


@dagwerk.plugin("where")
def where(inputs, ctx):
    # Written aside and renamed: a reader never sees it empty.
    partial = MARKS / f".ran-{inputs.parameters['n']}"
    partial.write_text(str(os.getpid()))
    partial.replace(MARKS / f"ran-{inputs.parameters['n']}")
    ctx.logger.info("task %s ran in process %s", inputs.parameters["n"], os.getpid())
    ctx.logger.debug("debug detail of task %s", inputs.parameters["n"])
    return {"pid": os.getpid()}
"""

PIPELINE = """
name: pool
plugins: [pool_plugins]
nodes:
  - slug: items
    plugin: items
  - slug: where
    plugin: where
    input_mode: each
    edges:
      - {name: items, source: items}
    bindings:
      n: {source: edge, edge: items, field: n}
"""


def _project(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    project, marks = tmp_path / "project", tmp_path / "marks"
    project.mkdir()
    marks.mkdir()
    (project / "pool_plugins.py").write_text(PLUGINS)
    (project / "pool.yaml").write_text(PIPELINE)
    env = {k: v for k, v in os.environ.items() if k != "DAGWERK_DEBUG"}
    env.update(
        DAGWERK_DB=f"sqlite:///{tmp_path / 'pool.db'}",
        POOL_MARKS=str(marks),
        POOL_TASKS=str(TASKS),
    )
    return project / "pool.yaml", marks, env


def _dagwerk(*args: str) -> list[str]:
    return [sys.executable, "-m", "dagwerk", *args]


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling with a deadline, not synchronisation by sleeping


def _ran_in(marks: Path) -> set[int]:
    return {int(path.read_text()) for path in marks.glob("ran-*")}


def _ended(pid: int) -> bool:
    """No such process, or one that has exited and awaits its reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _plugin_processes(marks: Path, worker_pid: int) -> set[int]:
    pids = _ran_in(marks)
    assert pids and worker_pid not in pids
    return pids


def test_run_reuses_at_most_one_process_per_worker_slot_and_leaves_none(tmp_path: Path) -> None:
    pipeline, marks, env = _project(tmp_path)
    result = subprocess.run(
        _dagwerk("run", str(pipeline), "--executor", "process", "--workers", "2"),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert len(list(marks.glob("ran-*"))) == TASKS
    pids = _ran_in(marks)
    assert 1 <= len(pids) <= 2  # two worker slots, each one warm process
    # The plugin module was imported once in each plugin process.
    for pid in pids:
        assert (marks / f"import-{pid}").read_text() == "x"
    assert all(_ended(pid) for pid in pids)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_stopped_or_killed_worker_leaves_no_plugin_process(
    tmp_path: Path, stop: signal.Signals
) -> None:
    pipeline, marks, env = _project(tmp_path)
    submitted = subprocess.run(
        _dagwerk("submit", str(pipeline)),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    worker = subprocess.Popen(
        _dagwerk("worker", "--pipeline", str(pipeline), "--executor", "process"),
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _until(lambda: len(list(marks.glob("ran-*"))) == TASKS, "every task to run")
        pids = _plugin_processes(marks, worker.pid)
        assert not any(_ended(pid) for pid in pids)  # warm, waiting for more work
        worker.send_signal(stop)
        _, stderr = worker.communicate(timeout=WAIT)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(WAIT)
    if stop is signal.SIGTERM:
        assert worker.returncode == 0, stderr
        assert all(_ended(pid) for pid in pids)  # joined before the worker exited
    else:
        # Killed without a chance to stop them: each sees its pipe close and exits.
        _until(lambda: all(_ended(pid) for pid in pids), "the plugin processes to exit")


@pytest.mark.parametrize("level", ["info", "warning"])
def test_a_plugin_process_logs_at_the_commands_log_level(tmp_path: Path, level: str) -> None:
    pipeline, _, env = _project(tmp_path)
    result = subprocess.run(
        _dagwerk("run", str(pipeline), "--executor", "process", "--log-level", level),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    shown = [line for line in result.stderr.splitlines() if " ran in process " in line]
    if level == "info":
        assert len(shown) == TASKS, result.stderr
        assert all(" INFO dagwerk.task." in line for line in shown)
    else:
        assert shown == []
    assert "debug detail" not in result.stderr
