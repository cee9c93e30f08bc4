"""The README's first command runs examples/quickstart.py; it must keep working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def test_quickstart_example_completes_the_seed_pipeline() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)], check=False, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "run-1: completed after 6 tasks" in result.stdout
    assert "publish -> ALPHA | BETA | GAMMA" in result.stdout
