"""How many deliveries a worker claims beyond its concurrency.

A batch claims ``concurrency`` deliveries, and when the queue held that many,
up to :meth:`ClaimAheadPolicy.plan` more in the same round: the claim ahead.
Claimed ahead, a delivery waits in the batch for one of the ``concurrency``
runners, so the policy claims ahead only what the worker can start within
``horizon`` seconds, judged by how long each plugin's attempts took:

- a plugin whose attempts this worker has never timed is never claimed
  ahead (its first attempts come through the ordinary claim);
- each plugin's estimate is the duration of its latest attempts, rising at
  once to a slower attempt and decaying by :data:`DECAY` of the difference
  towards each faster one, so one long attempt stops the claim ahead of its
  plugin until faster ones have brought the estimate down again;
- the claim ahead takes only plugins whose estimate lets at least one of
  their attempts start within the horizon (``concurrency * horizon /
  estimate >= 1``): the fastest of them, and each slower one while the
  slowest taken still lets at least half as many start as the fastest;
  it claims as many as the slowest taken would start within the horizon,
  at most ``limit``.

Long tasks are therefore never claimed ahead (they wait in the queue for any
worker), short ones are claimed ahead in batches the worker drains in about
``horizon`` seconds. The estimates live in the worker process: a worker
learns its plugins again when it starts.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Collection

__all__ = ["DECAY", "ClaimAheadPolicy"]

DECAY = 0.2
"""Share of the difference a faster attempt takes off its plugin's estimate."""


class ClaimAheadPolicy:
    """The claim ahead of one worker with ``concurrency`` runners: at most
    ``limit`` deliveries (0: none), started within ``horizon`` seconds."""

    def __init__(self, *, concurrency: int, limit: int, horizon: float) -> None:
        self._concurrency = concurrency
        self._limit = limit
        self._horizon = horizon
        self._lock = threading.Lock()
        self._estimates: dict[str, float] = {}

    @property
    def limit(self) -> int:
        """The most deliveries ever claimed ahead."""
        return self._limit

    def estimate(self, plugin: str) -> float | None:
        """The plugin's estimated attempt duration (seconds); ``None`` before
        its first timed attempt."""
        with self._lock:
            return self._estimates.get(plugin)

    def observe(self, plugin: str, seconds: float) -> None:
        """One attempt of ``plugin`` took ``seconds`` (real time, plugin call only)."""
        seconds = max(seconds, 0.0)
        with self._lock:
            known = self._estimates.get(plugin)
            if known is None or seconds >= known:
                self._estimates[plugin] = seconds
            else:
                self._estimates[plugin] = known - (known - seconds) * DECAY

    def plan(self, served: Collection[str]) -> tuple[int, frozenset[str]]:
        """How many deliveries to claim ahead now, and of which of the
        ``served`` plugins; ``(0, frozenset())`` for none."""
        if self._limit <= 0:
            return 0, frozenset()
        budget = self._concurrency * self._horizon
        with self._lock:
            chosen = {
                name: estimate
                for name in served
                if (estimate := self._estimates.get(name)) is not None
                and self._startable(budget, estimate) >= 1
            }
        if not chosen:
            return 0, frozenset()
        # The fastest plugins first; a slower one joins while the count the
        # slowest of them allows stays at least half the fastest's: a rare
        # slow plugin does not shrink the claim ahead of the common fast ones.
        ordered = sorted(chosen, key=chosen.__getitem__)
        best = self._startable(budget, chosen[ordered[0]])
        count, taken = best, []
        for name in ordered:
            startable = self._startable(budget, chosen[name])
            if 2 * startable < best:
                break
            count = startable
            taken.append(name)
        return count, frozenset(taken)

    def _startable(self, budget: float, estimate: float) -> int:
        """Attempts of ``estimate`` seconds the runners start within the horizon."""
        if estimate <= 0.0:
            return self._limit
        ratio = budget / estimate
        return self._limit if ratio >= self._limit else math.floor(ratio)
