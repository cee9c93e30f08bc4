"""Injected time for the worker runtime.

Leases, backoff, sweeps, timeouts and idle waits read time from a
:class:`Clock`, so tests drive time with :class:`FakeClock` instead of
sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FakeClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Wall time, monotonic time and a timed wait on an event."""

    def time(self) -> float:
        """Seconds since the epoch (used for durable lease deadlines)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (used for local deadlines)."""
        ...

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Block until ``event`` is set or ``timeout`` seconds of this clock pass.

        Returns whether the event is set. ``None`` waits without a deadline;
        a timeout of zero or less only checks the event.
        """
        ...


class SystemClock:
    """The real clock: ``time.time``, ``time.monotonic`` and ``Event.wait``."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if timeout is not None and timeout <= 0:
            return event.is_set()
        return event.wait(timeout)


class FakeClock:
    """A clock that moves only when :meth:`advance` is called.

    A thread blocked in :meth:`wait` returns as soon as its event is set or
    an :meth:`advance` carries the clock past its deadline; no real time has
    to pass. ``waiters`` counts blocked threads, so a test can wait until a
    worker is parked before advancing.
    """

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = float(start)
        self._cond = threading.Condition()
        self._waiters = 0

    def time(self) -> float:
        with self._cond:
            return self._now

    def monotonic(self) -> float:
        with self._cond:
            return self._now

    @property
    def waiters(self) -> int:
        with self._cond:
            return self._waiters

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every waiter whose deadline has passed."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        with self._cond:
            self._now += seconds
            self._cond.notify_all()

    def wait_for_waiters(self, count: int, timeout: float = 10.0) -> bool:
        """Block (in real time, bounded by ``timeout``) until ``count`` threads wait.

        A synchronisation aid for tests: it polls a condition, never sleeps
        for time to pass on this clock.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._waiters < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.05))
            return True

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        with self._cond:
            deadline = None if timeout is None else self._now + timeout
            if deadline is not None and self._now >= deadline:
                return event.is_set()
            self._waiters += 1
            self._cond.notify_all()
            try:
                while not event.is_set():
                    if deadline is not None and self._now >= deadline:
                        break
                    # A set event does not notify this condition, so the wait is
                    # re-checked at a short real-time interval (a poll with a
                    # deadline, not a sleep standing in for time passing).
                    self._cond.wait(0.005)
            finally:
                self._waiters -= 1
                self._cond.notify_all()
            return event.is_set()
