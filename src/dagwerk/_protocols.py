"""Runtime protocol checks decided once per class.

``isinstance`` against a runtime-checkable :class:`typing.Protocol` looks up
every member of the protocol on each call (tens of microseconds on Python
3.11); the worker's hot path asks the same few questions of the same store
for every batch. :func:`implements` answers from a cache when the object's
class itself has every member (an instance can add members, never hide its
class's), and asks ``isinstance`` otherwise (e.g. a proxy that forwards
attributes through ``__getattr__``). Since Python 3.12 ``isinstance`` no
longer sees members such a proxy forwards (it looks them up statically), so
those are then looked up with ``hasattr``, as Python 3.11 does: the answer
is the same on every supported version.
"""

from __future__ import annotations

from typing import Any, TypeVar

from typing_extensions import TypeIs

__all__ = ["implements"]

_P = TypeVar("_P")

_BY_CLASS: dict[tuple[type, Any], bool] = {}


def implements(obj: object, protocol: type[_P]) -> TypeIs[_P]:
    """``isinstance(obj, protocol)`` for a runtime-checkable protocol."""
    key = (type(obj), protocol)
    found = _BY_CLASS.get(key)
    if found is None:
        try:
            found = issubclass(type(obj), protocol)
        except TypeError:  # a protocol with data members: per instance only
            found = False
        _BY_CLASS[key] = found
    return found or isinstance(obj, protocol) or _forwards_every_member(obj, protocol)


def _forwards_every_member(obj: object, protocol: type) -> bool:
    """Whether ``obj`` answers every member of ``protocol`` (Python 3.12+
    keeps the protocol's members in ``__protocol_attrs__``; earlier versions'
    ``isinstance`` already asked ``hasattr``). As ``isinstance`` does, a
    method member set to ``None`` counts as absent."""
    members: frozenset[str] = frozenset(getattr(protocol, "__protocol_attrs__", ()))
    if not members:
        return False
    for name in members:
        if not hasattr(obj, name):
            return False
        if callable(getattr(protocol, name, None)) and getattr(obj, name) is None:
            return False
    return True
