"""The W2 benchmark's hop ledger (``bench/workloads.py``): entries are kept
in memory while the worker runs (no file write inside a hop) and written at
its exit, where ``read_hops`` finds them; the plugin marks its end after
filing its entry."""

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
workloads._append(root, [0, 1.0, 2.0])
late = [1, 2.5, 2.5]
workloads._append(root, late)
late[2] = 3.0  # an end set after filing is the one written
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


def test_the_end_is_marked_after_the_entry_is_filed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hop plugin's end mark comes after its ledger bookkeeping: the
    clock reading taken last is the end recorded."""
    readings = iter([10.0, 11.0])
    filed: list[list[float]] = []

    def append(root: Path, entry: list[float]) -> None:
        filed.append(list(entry))  # what the entry held when filed
        filed.append(entry)

    monkeypatch.setattr(workloads.time, "time", lambda: next(readings))
    monkeypatch.setattr(workloads, "_append", append)

    class Ctx:
        node_index = 4
        execution_root = tmp_path

    assert workloads.hop(None, Ctx()) == {"n": 4}
    assert filed[0] == [4, 10.0, 10.0]  # not yet ended when filed
    assert filed[1] == [4, 10.0, 11.0]  # ended by the last reading
