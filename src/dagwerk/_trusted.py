"""Models built from values that are already valid, without pydantic's
per-call work.

``Model.model_construct`` skips validation but still walks the fields, fills
defaults and sorts out extras on every call; on the worker's hot path (a plan
per claimed task, a resolved output per input, an output reference per
planned input) that walk was a large share of the time. :func:`trusted_model`
sets the instance's state directly. The caller guarantees that ``values``
holds every field of the model, each a value validation would have produced
(values the store wrote itself from validated models, or values planning
has just checked); tests compare the result with validation for each model
built this way.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["trusted_model"]

_M = TypeVar("_M", bound=BaseModel)
_set_attribute = object.__setattr__
# Frozen models never change their fields set, so the instances of a class
# share one immutable set instead of carrying their own.
_FIELDS: dict[type[BaseModel], frozenset[str]] = {}


def trusted_model(
    cls: type[_M], values: dict[str, Any], fields_set: frozenset[str] | None = None
) -> _M:
    """What ``cls.model_construct(**values)`` builds when ``values`` holds
    every field of ``cls`` (a model without private attributes); with
    ``fields_set``, as if only those fields had been given (the others
    holding their defaults)."""
    fields = fields_set if fields_set is not None else _FIELDS.get(cls)
    if fields is None:
        fields = _FIELDS[cls] = frozenset(cls.model_fields)
    model = cls.__new__(cls)
    _set_attribute(model, "__dict__", values)
    _set_attribute(model, "__pydantic_fields_set__", fields)
    _set_attribute(model, "__pydantic_extra__", None)
    _set_attribute(model, "__pydantic_private__", None)
    return model
