"""Parsed task plans: rebuilt from the store's own rows, memoised by their text.

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

A plan the cache does not hold is rebuilt from its JSON without running the
validators again (:func:`_trusted`): the store writes only plans that passed
validation (``TaskInputPlan.model_dump_json`` of a validated plan), so
re-checking sizes and uniqueness on every read only repeats work (about
0.15 ms per task). The rebuilt plan equals the validated one (tested on
generated plans); text that does not have the written shape, e.g. a row
edited by hand, goes through full validation and fails there.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from dagwerk._trusted import trusted_model
from dagwerk.constants import InputRole
from dagwerk.json import ReadOnlyDict, freeze_object
from dagwerk.models import PlannedEdgeInput, TaskInputPlan

__all__ = ["parse_plan", "remember_plan"]

_MAX_ENTRIES = 2048
_MAX_TEXT = 4096

_LOCK = threading.Lock()
_CACHE: OrderedDict[str, TaskInputPlan] = OrderedDict()


def parse_plan(text: str) -> TaskInputPlan:
    """``TaskInputPlan.model_validate_json(text)``, memoised for small plans."""
    if len(text) > _MAX_TEXT:
        return _trusted(text)
    with _LOCK:
        found = _CACHE.get(text)
        if found is not None:
            _CACHE.move_to_end(text)
            return found
    plan = _trusted(text)
    with _LOCK:
        _CACHE[text] = plan
        while len(_CACHE) > _MAX_ENTRIES:
            _CACHE.popitem(last=False)
    return plan


def remember_plan(text: str, plan: TaskInputPlan) -> None:
    """Hold ``plan`` as the parse of ``text``, its ``model_dump_json()``: the
    store writes validated plans, and a worker that launched a task often
    claims it next, so the claim need not parse what was just written."""
    if len(text) > _MAX_TEXT:
        return
    with _LOCK:
        _CACHE[text] = plan
        _CACHE.move_to_end(text)
        while len(_CACHE) > _MAX_ENTRIES:
            _CACHE.popitem(last=False)


_PLAN_KEYS = frozenset(
    {"schema_version", "generation", "edges", "parameters", "secret_refs", "correlation_id"}
)
_EDGE_KEYS = frozenset({"edge", "source_index", "role", "output_ids"})


def _trusted(text: str) -> TaskInputPlan:
    """The plan a validated ``model_dump_json`` wrote, rebuilt without
    re-validation; anything of another shape is fully validated."""
    try:
        raw = json.loads(text)
        if (
            type(raw) is not dict
            or raw.keys() != _PLAN_KEYS
            or raw["schema_version"] != 1
            or type(raw["generation"]) is not int
            or raw["generation"] < 0
            or type(raw["parameters"]) is not dict
            or type(raw["secret_refs"]) is not dict
            or not (raw["correlation_id"] is None or type(raw["correlation_id"]) is str)
        ):
            return TaskInputPlan.model_validate_json(text)
        edges = []
        for edge in raw["edges"]:
            if (
                type(edge) is not dict
                or edge.keys() != _EDGE_KEYS
                or type(edge["edge"]) is not str
                or type(edge["source_index"]) is not int
                or edge["source_index"] < 0
                or type(edge["output_ids"]) is not list
                or not all(type(oid) is str for oid in edge["output_ids"])
            ):
                return TaskInputPlan.model_validate_json(text)
            edges.append(
                trusted_model(
                    PlannedEdgeInput,
                    {
                        "edge": edge["edge"],
                        "source_index": edge["source_index"],
                        "role": InputRole(edge["role"]),
                        "output_ids": tuple(edge["output_ids"]),
                    },
                )
            )
        return trusted_model(
            TaskInputPlan,
            {
                "schema_version": 1,
                "generation": raw["generation"],
                "edges": tuple(edges),
                "parameters": freeze_object(raw["parameters"]),
                "secret_refs": ReadOnlyDict(raw["secret_refs"]),
                "correlation_id": raw["correlation_id"],
            },
        )
    except (ValueError, TypeError, KeyError):
        return TaskInputPlan.model_validate_json(text)
