"""Keeping the cyclic garbage collector off a worker's start-up objects.

A worker process holds tens of thousands of long-lived objects from start-up
(modules, pydantic schemas, the plugins and their imports). CPython's oldest
generation collection walks all of them; in a ``dagwerk worker`` one such
pass took ~15 ms and, landing inside a unit of work, held SQLite's write
lock for all of it. :func:`freeze_startup_heap` moves everything
alive at that point into the permanent generation (``gc.freeze``), so later
passes walk only what the worker allocated since. The objects stay alive as
they would anyway; cycles created later are collected as usual.

Only the process's owner should call it: the ``dagwerk worker`` command does,
once, after loading the plugins and before serving; a library embedding a
worker leaves its host's heap alone.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap"]


def freeze_startup_heap() -> int:
    """Collect garbage once, then freeze every surviving tracked object.

    Returns how many objects are frozen (``gc.get_freeze_count()``)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
