"""Store faults made for real, against real ``dagwerk run`` / ``dagwerk worker``
processes on SQLite: a full filesystem (a small tmpfs this test mounts, as
root), a database file made read-only and writable again, permission denied
on open, a schema newer than this dagwerk, a plugin module that is missing.

For a fault that passes: the process says it in a bounded number of lines,
uses little CPU while it waits, and the run completes once the fault clears
with every task settled once. For a fatal fault: one line and exit code 2.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from dagwerk.backends.errors import StoreFullError
from dagwerk.backends.sqlite.gateway import SqliteGateway
from dagwerk.constants import RunStatus
from dagwerk.engine import Engine

SRC = Path(__file__).resolve().parents[2] / "src"

PLUGINS = """
import os
import time
import dagwerk

@dagwerk.plugin("fault_gen")
def fault_gen(inputs, ctx):
    return [{"i": i} for i in range(int(inputs.parameters["count"]))]

@dagwerk.plugin("fault_big")
def fault_big(inputs, ctx):
    i = inputs.parameters["i"]
    # One line per execution, outside the database: how often each item ran.
    with open(os.environ["FAULT_LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(f"{i}\\n")
    time.sleep(float(os.environ.get("FAULT_SLEEP", "0")))
    return {"i": i, "blob": "x" * 20000}
"""

PIPELINE = """
name: faults
plugins: [{module}]
nodes:
  - slug: gen
    plugin: fault_gen
    bindings:
      count: {{source: literal, value: {count}}}
  - slug: big
    plugin: fault_big
    input_mode: each
    edges:
      - {{name: items, source: gen}}
    bindings:
      i: {{source: edge, edge: items, field: i}}
"""

# The CPU a process may use while it waits out a fault: well under a core.
CPU_SHARE = 0.25
WINDOW = 3.0


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_share_while_waiting(process: subprocess.Popen[str]) -> float:
    before, started = _cpu_seconds(process.pid), time.monotonic()
    time.sleep(WINDOW)  # a measuring window, not synchronisation
    return (_cpu_seconds(process.pid) - before) / (time.monotonic() - started)


def _unprivileged() -> list[str]:
    """A prefix that runs a command without root's power to ignore file
    modes (as root: without CAP_DAC_OVERRIDE), so ``chmod`` applies to it."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: file modes do not apply to root")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]


class Project:
    """A folder with the plugins, a pipeline, a ledger and a database URL."""

    def __init__(self, root: Path, db_dir: Path, count: int) -> None:
        self.root = root
        self.db = db_dir / "dagwerk.db"
        self.url = f"sqlite:///{self.db}"
        self.ledger = root / "ledger.txt"
        self.ledger.touch()
        self.count = count
        self.sleep = 0.0  # seconds each fault_big execution takes
        (root / "fault_plugins.py").write_text(PLUGINS, encoding="utf-8")
        self.pipeline = root / "faults.yaml"
        self.pipeline.write_text(
            PIPELINE.format(module="fault_plugins", count=count), encoding="utf-8"
        )

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(self.root)])
        env["FAULT_LEDGER"] = str(self.ledger)
        env["FAULT_SLEEP"] = str(self.sleep)
        env.pop("DAGWERK_DEBUG", None)
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "dagwerk", *args]

    def run(self, *args: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*(prefix or []), *self.argv(*args)],
            check=False,
            cwd=self.root,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def start(self, *args: str, prefix: list[str] | None = None) -> subprocess.Popen[str]:
        self.err_path = self.root / "stderr.txt"
        # The child writes to its own copies of the descriptors.
        with (
            (self.root / "stdout.txt").open("w", encoding="utf-8") as out,
            self.err_path.open("w", encoding="utf-8") as err,
        ):
            return subprocess.Popen(
                [*(prefix or []), *self.argv(*args)],
                cwd=self.root,
                env=self.env(),
                stdout=out,
                stderr=err,
                text=True,
            )

    def stderr(self) -> str:
        return self.err_path.read_text(encoding="utf-8")

    def left_over(self) -> str:
        """What a run that did not complete left: its unfinished tasks, the
        deliveries and the process's stderr (a failure's diagnosis)."""
        with closing(sqlite3.connect(self.db)) as conn:
            tasks = conn.execute(
                "SELECT task_id, node_index, status, attempt_id FROM dagwerk_tasks"
                " WHERE status != 'completed'"
            ).fetchall()
            deliveries = conn.execute(
                "SELECT task_id, attempt_id, lease_owner, lease_expires_at, available_at,"
                " delivery_count FROM dagwerk_deliveries"
            ).fetchall()
        return f"tasks {tasks}; deliveries {deliveries}; stderr:\n{self.stderr()}"

    def assert_settled_once(self, run_id: str) -> Counter[int]:
        """The run completed with one output per item; the ledger's count of
        executions per item (each item ran at least once)."""
        with Engine(self.url) as engine:
            result = engine.result(run_id)
        assert result.status is RunStatus.COMPLETED, (result.error, self.left_over())
        items = sorted(int(str(out.fields["i"])) for out in result.outputs["big"])
        assert items == list(range(self.count))
        runs = Counter(int(line) for line in self.ledger.read_text().split())
        assert set(runs) == set(range(self.count))
        return runs


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs mounted for this test (root only), unmounted after it."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    target = tmp_path / "small"
    target.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(target)],
        check=False,
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False, capture_output=True)


def _reap(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def _ended_calmly(process: subprocess.Popen[str], share: float, project: Project) -> str:
    """The process exited 0, used little CPU while waiting and printed no
    traceback; its stderr."""
    stderr = project.stderr()
    assert process.returncode == 0, stderr
    assert share < CPU_SHARE, f"{share:.2f} of a core while waiting"
    assert "Traceback" not in stderr
    return stderr


def _log_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _progress_free(text: str) -> list[str]:
    """Lines other than ``dagwerk run``'s progress lines."""
    return [line for line in _log_lines(text) if not line.startswith("[")]


def _fill(tmpfs: Path) -> Path:
    """A filler file that leaves too little of the tmpfs free for 60 outputs
    of 20 KB; unlink it to free the space."""
    filler = tmpfs / "filler"
    filler.write_bytes(b"\0" * (7 * 1024 * 1024 + 256 * 1024))
    return filler


def _outlast_full_disk(process: subprocess.Popen[str], project: Project, filler: Path) -> float:
    """Wait for ``process`` to say the disk is full, measure its CPU share
    while it waits (it must not exit), free the space and wait for its end;
    the share."""
    try:
        _wait_for(lambda: "database or disk is full" in project.stderr(), 60, "the fault line")
        share = _cpu_share_while_waiting(process)
        assert process.poll() is None, project.stderr()  # waits, does not exit
        filler.unlink()
        process.wait(timeout=90)
    finally:
        _reap(process)
    return share


def test_a_full_disk_is_waited_out_and_the_run_completes_once_space_is_freed(
    tmp_path: Path, tmpfs: Path
) -> None:
    project = Project(tmp_path, tmpfs, count=60)
    filler = _fill(tmpfs)
    run = project.start(
        "run", str(project.pipeline), "--db", project.url, "--run-id", "full-run", "--json"
    )
    share = _outlast_full_disk(run, project, filler)
    stderr = _ended_calmly(run, share, project)
    fault_lines = [line for line in _progress_free(stderr) if "disk is full" in line]
    assert fault_lines, stderr
    first = fault_lines[0]
    assert str(project.db) in first and f"bytes free on {tmpfs}" in first, first
    assert "free space and the run continues" in first
    assert len(_progress_free(stderr)) <= 12, stderr
    assert len(_log_lines(stderr)) <= 40, stderr
    assert any("answers again" in line for line in _log_lines(stderr)), stderr
    # The progress line named the fault while it lasted.
    shown = [line for line in stderr.splitlines() if line.startswith("[full-run]")]
    assert any("waiting out a store fault" in line for line in shown), stderr
    runs = project.assert_settled_once("full-run")
    # A result held while the disk was full is committed, not recomputed:
    # no item ran more than twice (a lease that expired meanwhile re-runs).
    assert max(runs.values()) <= 2, runs
    with closing(sqlite3.connect(project.db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_burst_worker_waits_out_a_full_disk_and_exits_once_the_work_is_done(
    tmp_path: Path, tmpfs: Path
) -> None:
    project = Project(tmp_path, tmpfs, count=60)
    filler = _fill(tmpfs)
    submitted = project.run(
        "submit", str(project.pipeline), "--db", project.url, "--run-id", "burst-run"
    )
    assert submitted.returncode == 0, submitted.stderr
    worker = project.start("worker", "--db", project.url, "--plugins", "fault_plugins", "--burst")
    share = _outlast_full_disk(worker, project, filler)
    stderr = _ended_calmly(worker, share, project)
    assert len(_log_lines(stderr)) <= 12, stderr
    assert any("answers again" in line for line in _log_lines(stderr)), stderr
    assert "no work left" in stderr, stderr
    project.assert_settled_once("burst-run")


def test_fail_on_fault_ends_run_after_the_fault_lasted(tmp_path: Path, tmpfs: Path) -> None:
    project = Project(tmp_path, tmpfs, count=60)
    _fill(tmpfs)
    started = time.monotonic()
    done = project.run("run", str(project.pipeline), "--db", project.url, "--fail-on-fault", "2")
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 60
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert "disk is full" in errors[0] and "at most 2s" in errors[0], errors[0]
    assert "Traceback" not in done.stderr


def _healthz(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _db_files(db: Path) -> list[Path]:
    return [path for path in db.parent.glob(db.name + "*") if not path.name.endswith(".lock")]


def _submitted(tmp_path: Path, count: int, run_id: str) -> Project:
    """A project whose database (in ``tmp_path/data``) holds run ``run_id``."""
    data = tmp_path / "data"
    data.mkdir()
    project = Project(tmp_path, data, count=count)
    submitted = project.run(
        "submit", str(project.pipeline), "--db", project.url, "--run-id", run_id
    )
    assert submitted.returncode == 0, submitted.stderr
    return project


def _wait_for_completion(project: Project, run_id: str) -> None:
    def completed() -> bool:
        with Engine(project.url) as engine:
            return engine.get_run(run_id).status is RunStatus.COMPLETED  # type: ignore[union-attr]

    _wait_for(completed, 60, "the run to complete")


def test_a_read_only_database_is_waited_out_and_health_reports_it(tmp_path: Path) -> None:
    prefix = _unprivileged()
    project = _submitted(tmp_path, 8, "ro-run")
    for path in _db_files(project.db):
        path.chmod(0o444)
    worker = project.start(
        "worker",
        "--db",
        project.url,
        "--plugins",
        "fault_plugins",
        "--metrics-port",
        "0",
        prefix=prefix,
    )
    try:
        _wait_for(lambda: "metrics on http" in project.stderr(), 30, "the health server")
        url = project.stderr().split("metrics on ", 1)[1].split("/metrics", 1)[0]
        _wait_for(lambda: "readonly database" in project.stderr(), 30, "the fault line")
        share = _cpu_share_while_waiting(worker)
        status, document = _healthz(url)
        assert status == 503, document
        fault = document["fault"]
        assert isinstance(fault, dict) and fault["code"] == "store_readonly", document
        for path in _db_files(project.db):
            path.chmod(0o644)
        _wait_for_completion(project, "ro-run")
        _wait_for(lambda: _healthz(url)[1]["fault"] is None, 30, "the fault to clear")
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    finally:
        for path in _db_files(project.db):
            path.chmod(0o644)
        _reap(worker)
    stderr = _ended_calmly(worker, share, project)
    first = next(line for line in stderr.splitlines() if "readonly" in line)
    assert str(project.db) in first and "writable again" in first, first
    assert len(_log_lines(stderr)) <= 12, stderr
    project.assert_settled_once("ro-run")


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = _log_lines(done.stderr)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: "), lines
    return lines[0]


def test_permission_denied_on_open_exits_2_with_one_line(tmp_path: Path) -> None:
    prefix = _unprivileged()
    data = tmp_path / "data"
    data.mkdir()
    project = Project(tmp_path, data, count=2)
    assert project.run("submit", str(project.pipeline), "--db", project.url).returncode == 0
    project.db.chmod(0o000)
    try:
        for args in (
            ("worker", "--db", project.url, "--plugins", "fault_plugins"),
            ("run", str(project.pipeline), "--db", project.url),
        ):
            started = time.monotonic()
            done = project.run(*args, prefix=prefix)
            assert done.returncode == 2, done.stderr
            assert time.monotonic() - started < 30
            line = _one_error_line(done)
            assert "permission denied" in line and str(project.db) in line, line
            assert "permissions" in line, line  # what to do
    finally:
        project.db.chmod(0o644)


def test_a_schema_newer_than_this_dagwerk_exits_2_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    project = Project(tmp_path, data, count=2)
    assert project.run("submit", str(project.pipeline), "--db", project.url).returncode == 0
    with closing(sqlite3.connect(project.db)) as conn, conn:
        conn.execute("UPDATE dagwerk_schema_version SET version = version + 100")
    for args in (
        ("worker", "--db", project.url, "--plugins", "fault_plugins"),
        ("run", str(project.pipeline), "--db", project.url),
    ):
        done = project.run(*args)
        assert done.returncode == 2, done.stderr
        line = _one_error_line(done)
        assert "schema version" in line and "upgrade dagwerk" in line, line


def test_a_missing_plugin_module_exits_2_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    project = Project(tmp_path, data, count=2)
    assert project.run("submit", str(project.pipeline), "--db", project.url).returncode == 0
    # The code changed: the module the pipeline lists is gone.
    (tmp_path / "fault_plugins.py").unlink()
    for args in (
        ("worker", "--db", project.url, "--pipeline", str(project.pipeline)),
        ("run", str(project.pipeline), "--db", project.url),
    ):
        done = project.run(*args)
        assert done.returncode == 2, done.stderr
        line = _one_error_line(done)
        assert "fault_plugins" in line, line


def test_a_read_only_directory_at_start_is_waited_out_and_the_run_completes(
    tmp_path: Path,
) -> None:
    """A database without its -wal file in a directory that cannot be
    written cannot be opened yet: the worker waits (one line, little CPU)
    and serves once the directory is writable again."""
    prefix = _unprivileged()
    project = _submitted(tmp_path, 6, "late-run")
    data = project.db.parent
    assert not (data / "dagwerk.db-wal").exists()  # closed cleanly: SQLite must create it
    data.chmod(0o555)
    worker = project.start(
        "worker", "--db", project.url, "--plugins", "fault_plugins", prefix=prefix
    )
    try:
        _wait_for(lambda: "opening the database failed" in project.stderr(), 30, "the fault line")
        share = _cpu_share_while_waiting(worker)
        assert worker.poll() is None, project.stderr()
        data.chmod(0o755)
        _wait_for_completion(project, "late-run")
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    finally:
        data.chmod(0o755)
        _reap(worker)
    stderr = _ended_calmly(worker, share, project)
    first = next(line for line in stderr.splitlines() if "opening the database failed" in line)
    assert str(project.db) in first and "readonly" in first and "writable again" in first, first
    assert sum("opening the database failed" in line for line in stderr.splitlines()) == 1
    assert any("answers again" in line for line in stderr.splitlines()), stderr
    assert len(_log_lines(stderr)) <= 8, stderr
    project.assert_settled_once("late-run")


def test_fail_on_fault_bounds_the_wait_to_open_the_store(tmp_path: Path) -> None:
    prefix = _unprivileged()
    project = _submitted(tmp_path, 2, "bounded-run")
    data = project.db.parent
    data.chmod(0o555)
    try:
        started = time.monotonic()
        done = project.run(
            "run",
            str(project.pipeline),
            "--db",
            project.url,
            "--fail-on-fault",
            "2",
            prefix=prefix,
        )
        took = time.monotonic() - started
    finally:
        data.chmod(0o755)
    assert done.returncode == 1, done.stderr
    assert took < 30, took
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert "readonly" in errors[0] and "at most 2s" in errors[0], errors[0]
    assert len(_log_lines(done.stderr)) <= 3, done.stderr  # the fault line and the error
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("removed", ["directory", "file"])
def test_a_database_removed_under_a_running_worker_ends_it_with_exit_2(
    tmp_path: Path, removed: str
) -> None:
    """Writes to a removed file reach no one: the worker notices, says it
    in one line and exits 2 instead of working on into the void."""
    data = tmp_path / "data"
    data.mkdir()
    project = Project(tmp_path, data, count=2000)
    project.sleep = 0.05
    submitted = project.run("submit", str(project.pipeline), "--db", project.url)
    assert submitted.returncode == 0, submitted.stderr
    worker = project.start("worker", "--db", project.url, "--plugins", "fault_plugins")
    try:
        _wait_for(lambda: len(project.ledger.read_text().split()) >= 20, 60, "tasks to run")
        if removed == "directory":
            shutil.rmtree(data)
        else:
            project.db.unlink()
        removed_at = time.monotonic()
        worker.wait(timeout=30)
        took = time.monotonic() - removed_at
    finally:
        _reap(worker)
    stderr = project.stderr()
    assert worker.returncode == 2, stderr
    assert took < 10, took
    assert "Traceback" not in stderr
    lines = [line for line in _log_lines(stderr) if not line.startswith("worker ")]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and str(project.db) in lines[0], lines[0]
    assert "removed" in lines[0] and "start again" in lines[0], lines[0]
    if removed == "file":
        assert not project.db.exists()  # nothing made a new, empty database there
    # It stopped claiming: far fewer executions than the run has tasks.
    assert len(project.ledger.read_text().split()) < project.count


def test_the_log_grown_until_the_disk_filled_gives_its_space_back(tmpfs: Path) -> None:
    """A write-ahead log keeps its size once grown: without a truncating
    checkpoint after the fault, the space it took while the disk filled
    would stay taken after the user freed space."""
    db = tmpfs / "log.db"
    wal = Path(f"{db}-wal")
    gateway = SqliteGateway(str(db))
    try:
        with gateway.write() as tx:
            tx._conn.execute("CREATE TABLE blobs (id INTEGER PRIMARY KEY, body BLOB)")
        filler = tmpfs / "filler"
        filler.write_bytes(b"\0" * (6 * 1024 * 1024))
        with pytest.raises(StoreFullError):
            for _ in range(1000):
                with gateway.write() as tx:
                    tx._conn.execute("INSERT INTO blobs (body) VALUES (?)", (os.urandom(65536),))
        grown = wal.stat().st_size
        assert grown > 512 * 1024, grown
        filler.unlink()
        with gateway.write() as tx:
            tx._conn.execute("INSERT INTO blobs (body) VALUES (?)", (b"x",))
        assert wal.stat().st_size < 64 * 1024, (grown, wal.stat().st_size)
        with gateway.read() as tx:
            assert tx._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        gateway.close()
