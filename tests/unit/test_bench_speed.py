"""The benchmark says when this machine is far from the one the targets were
set on (``bench/_env.py``): the calibration workload's time against the
reference range."""

from __future__ import annotations

import pytest

_env = pytest.importorskip("bench._env")


def test_within_the_reference_range_there_is_no_warning() -> None:
    low, high = _env.REFERENCE_CALIBRATION_MS
    assert _env.speed_warning(low) is None
    assert _env.speed_warning(high) is None
    assert _env.speed_warning(1.1 * high) is None  # a slow hour, not another machine


def test_a_much_slower_machine_is_named_with_its_factor() -> None:
    high = _env.REFERENCE_CALIBRATION_MS[1]
    warning = _env.speed_warning(4 * high)
    assert warning is not None
    assert "4.0x slower" in warning and "--src" in warning


def test_a_much_faster_machine_is_named_too() -> None:
    low = _env.REFERENCE_CALIBRATION_MS[0]
    warning = _env.speed_warning(low / 2)
    assert warning is not None and "2.0x faster" in warning
