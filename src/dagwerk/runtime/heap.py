"""Keeping the cyclic garbage collector off a worker's start-up objects.

A worker process holds tens of thousands of long-lived objects from start-up
(modules, pydantic schemas, the plugins and their imports). CPython's oldest
generation collection walks all of them; in a ``dagwerk worker`` one such
pass took ~15 ms and, landing inside a unit of work, held SQLite's write
lock for all of it (issue 9). :func:`freeze_startup_heap` moves everything
alive at that point into the permanent generation (``gc.freeze``), so later
passes walk only what the worker allocated since. The objects stay alive as
they would anyway; cycles created later are collected as before.

It also makes the youngest generation's collections rarer
(:data:`YOUNG_THRESHOLD` allocations instead of CPython's 700): a worker
allocates a few hundred tracked objects per task, nearly all freed by
reference counting at once, so the default ran a young collection every
other task for little (about 1.5 % of a chain's hop, measured).

Only the process's owner should call it: the ``dagwerk worker`` command does,
once, after loading the plugins and before serving; a library embedding a
worker leaves its host's heap alone.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "freeze_startup_heap"]

YOUNG_THRESHOLD = 20_000
"""Allocations between two collections of the youngest generation in a worker."""


def freeze_startup_heap() -> int:
    """Collect garbage once, then freeze every surviving tracked object, and
    raise the youngest generation's threshold to :data:`YOUNG_THRESHOLD`
    (never lower it; the older generations' thresholds are kept).

    Returns how many objects are frozen (``gc.get_freeze_count()``)."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young:  # 0 disables the collector: leave that choice alone
        gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)
    return gc.get_freeze_count()
