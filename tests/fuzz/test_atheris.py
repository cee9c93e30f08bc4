"""Short atheris (libFuzzer) runs of every target in ``atheris_targets.py``.

Each target runs in its own process, because libFuzzer owns the process and
exits on the first crash. A run passes when libFuzzer exits 0: every input
ended in a value or a documented error. Skipped where atheris is missing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

SCRIPT = Path(__file__).with_name("atheris_targets.py")
TIMEOUT_SECONDS = 120


@pytest.mark.parametrize("target", ["expressions", "pipeline_file", "json"])
def test_atheris_target_survives_fuzzing(target: str, tmp_path: Path) -> None:
    """2,000 coverage-guided inputs end in a value or a documented error."""
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            target,
            "-runs=2000",
            "-max_len=4096",
            "-seed=1",
            f"-artifact_prefix={tmp_path}/",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    assert result.returncode == 0, (
        f"atheris target {target!r} exited {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )
