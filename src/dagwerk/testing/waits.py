"""Polling with a deadline, for tests that wait on another thread or process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(
    check: Callable[[], bool], what: str, *, timeout: float = 10.0, interval: float = 0.002
) -> None:
    """Return once ``check()`` holds; ``AssertionError`` naming ``what`` when
    ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        pause.wait(interval)
