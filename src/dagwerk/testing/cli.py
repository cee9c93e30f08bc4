"""The ``dagwerk`` command run as a user runs it, for tests: a subprocess of
``python -m dagwerk`` in a directory of its own, on one database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["DagwerkCli"]

# Variables of the developer's shell that would change what a command does.
_LEFT_OUT = ("DAGWERK_DEBUG", "FLAKY_STORE_DOWN")


class DagwerkCli:
    """``cli("show", run_id)`` runs ``dagwerk show RUN`` in ``cwd`` with
    ``DAGWERK_DB`` set to a SQLite file there; ``cli.json(...)`` adds
    ``--json`` and parses what it printed."""

    def __init__(self, cwd: Path, db_file: str = "cli.db", *, timeout: float = 180) -> None:
        self.cwd = cwd
        self.db = f"sqlite:///{cwd / db_file}"
        self.timeout = timeout

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _LEFT_OUT}
        env["DAGWERK_DB"] = self.db
        env.update(extra or {})
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "dagwerk", *args]

    def __call__(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            cwd=self.cwd,
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=self.timeout,
            check=False,
        )

    def json(self, *args: str) -> Any:
        """``--json`` output of a command that must exit 0."""
        result = self(*args, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def json_failing(self, *args: str, env: dict[str, str] | None = None) -> Any:
        """``--json`` output of a command that must exit 1 (a run that failed)."""
        result = self(*args, "--json", env=env)
        assert result.returncode == 1, result.stderr
        return json.loads(result.stdout)
