"""The W2 benchmark's hop ledger (``bench/workloads.py``): lines are kept in
memory while the worker runs (no file write inside a hop) and written at
its exit, where ``read_hops`` finds them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

workloads = pytest.importorskip("bench.workloads")

_CHILD = """
import sys
from pathlib import Path
from bench import workloads
root = Path(sys.argv[1])
workloads._append(root, "0 1.0 2.0\\n")
workloads._append(root, "1 2.5 3.0\\n")
print(sorted(p.name for p in root.iterdir()))
"""


def test_lines_are_written_at_exit_and_read_back(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        timeout=60,
    )
    assert done.stdout.strip() == "[]"  # nothing on disk while it ran
    assert workloads.read_hops(tmp_path) == [0.5]  # written at exit
