"""The worker command's start-up heap: frozen, and the young generation
collected less often (issue 9)."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import gc
from dagwerk.runtime.heap import YOUNG_THRESHOLD, freeze_startup_heap
{before}
frozen = freeze_startup_heap()
print(frozen > 0, gc.get_threshold() == {expected})
"""


def _probe(before: str, expected: str) -> str:
    code = _PROBE.format(before=before, expected=expected)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip()


def test_the_young_threshold_is_raised_and_the_older_ones_kept() -> None:
    out = _probe("gc.set_threshold(700, 10, 10)", "(YOUNG_THRESHOLD, 10, 10)")
    assert out == "True True"


def test_a_higher_threshold_or_a_disabled_collector_is_left_alone() -> None:
    assert _probe("gc.set_threshold(10**6, 3, 4)", "(10**6, 3, 4)") == "True True"
    assert _probe("gc.set_threshold(0, 3, 4)", "(0, 3, 4)") == "True True"
