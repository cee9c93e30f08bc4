"""A throw-away PostgreSQL cluster of one test's own (not a test module), for
tests that stop, start or restart the server: the shared test server is
never touched. ``.ci/postgres.sh`` makes it in a temporary directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "postgres.sh"


def _pg_ctl() -> str | None:
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return str(binaries[-1]) if binaries else shutil.which("pg_ctl")


class Cluster:
    """A running cluster in ``folder``, reached at ``url``."""

    def __init__(self, folder: Path, url: str) -> None:
        self.folder = folder
        self.url = url
        self.port = int((folder / "port").read_text())

    def stop(self) -> None:
        """``pg_ctl stop -m fast``: every session ends with an admin shutdown,
        and what was committed is kept (the cluster runs with
        ``synchronous_commit=off``, which an immediate stop would not honour)."""
        self._pg_ctl("stop")

    def start(self) -> None:
        """Start the stopped server again on its port; returns once it accepts
        connections."""
        subprocess.run(
            ["bash", str(SCRIPT), "up", str(self.folder)],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def restart(self) -> None:
        """``pg_ctl restart -m fast``."""
        self._pg_ctl("restart")

    def _pg_ctl(self, action: str) -> None:
        command = [
            _pg_ctl() or "pg_ctl",
            "-D",
            str(self.folder / "data"),
            "-l",
            str(self.folder / "server.log"),
            "-m",
            "fast",
            "-w",
            "-t",
            "60",
            action,
        ]
        if os.getuid() == 0:  # as .ci/postgres.sh does: the server runs as postgres
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    """A cluster of the caller's own, removed afterwards; skips the test when
    the PostgreSQL server binaries are missing (outside CI)."""
    if _pg_ctl() is None and not os.environ.get("CI"):
        pytest.skip("the PostgreSQL server binaries (pg_ctl) are not installed")
    folder = Path(tempfile.mkdtemp(prefix="dagwerk-pg-"))
    folder.chmod(0o755)  # the server's user must reach its data directory
    try:
        started = subprocess.run(
            ["bash", str(SCRIPT), "start", str(folder)],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        yield Cluster(folder, started.stdout.strip())
    finally:
        subprocess.run(
            ["bash", str(SCRIPT), "stop", str(folder)],
            check=False,
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(folder, ignore_errors=True)
