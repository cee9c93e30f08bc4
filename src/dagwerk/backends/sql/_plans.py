"""Parsed task plans, memoised by their stored JSON text.

A plan is validated when it is written and never changes afterwards, and a
task's plan is read several times per attempt (the worker's task read, the
completion's correlation check). Parsing and re-validating it each time costs
about 0.17 ms; this cache hands back the same immutable
:class:`~dagwerk.models.TaskInputPlan` for the same text instead. The result
is exactly what validation of that text returns, because it *is* that result:
only texts that parsed successfully are cached.

The cache is bounded: at most ``_MAX_ENTRIES`` plans of at most
``_MAX_TEXT`` characters each (larger plans are parsed every time), evicted
least recently used.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from dagwerk.models import TaskInputPlan

__all__ = ["parse_plan"]

_MAX_ENTRIES = 2048
_MAX_TEXT = 4096

_LOCK = threading.Lock()
_CACHE: OrderedDict[str, TaskInputPlan] = OrderedDict()


def parse_plan(text: str) -> TaskInputPlan:
    """``TaskInputPlan.model_validate_json(text)``, memoised for small plans."""
    if len(text) > _MAX_TEXT:
        return TaskInputPlan.model_validate_json(text)
    with _LOCK:
        found = _CACHE.get(text)
        if found is not None:
            _CACHE.move_to_end(text)
            return found
    plan = TaskInputPlan.model_validate_json(text)
    with _LOCK:
        _CACHE[text] = plan
        while len(_CACHE) > _MAX_ENTRIES:
            _CACHE.popitem(last=False)
    return plan
