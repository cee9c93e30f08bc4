"""A bounded mapping for caches of immutable per-run data.

The SQL store caches each run's parsed node definitions, topology, failure
policy and queue route, and the worker each run's lineage link: all written
once and never changed, so a cached value never goes stale. Unbounded, those
caches grow with every run a long-lived process ever touches. A
:class:`FifoCache` holds at most ``limit`` entries and, when full, forgets
the entry stored first: a run evicted while still active is read again once
(one small query), which is far cheaper than ordering entries by use on
every lookup.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["RUN_CACHE_LIMIT", "FifoCache"]

_K = TypeVar("_K")
_V = TypeVar("_V")

RUN_CACHE_LIMIT = 4096
"""Runs whose immutable data one store or worker keeps parsed."""


class FifoCache(dict[_K, _V]):
    """A ``dict`` of at most ``limit`` entries; storing a new key into a full
    cache first removes the oldest one. Only ``cache[key] = value`` adds
    entries (the callers' only way)."""

    __slots__ = ("limit",)

    def __init__(self, limit: int = RUN_CACHE_LIMIT) -> None:
        if limit < 1:
            raise ValueError("a cache holds at least one entry")
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: _K, value: _V) -> None:
        if key not in self and len(self) >= self.limit:
            del self[next(iter(self))]
        super().__setitem__(key, value)
