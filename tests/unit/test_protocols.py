"""``implements``: a runtime protocol check decided once per class."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from dagwerk._protocols import implements


@runtime_checkable
class _Greets(Protocol):
    def greet(self) -> str: ...


class _Greeter:
    def greet(self) -> str:
        return "hello"


class _Silent:
    pass


class _Proxy:
    """Forwards attributes to what it wraps: its class has no members."""

    def __init__(self, target: object) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def test_a_class_with_every_member_implements() -> None:
    assert implements(_Greeter(), _Greets)
    assert implements(_Greeter(), _Greets)  # from the cache


def test_a_class_without_the_members_does_not() -> None:
    assert not implements(_Silent(), _Greets)


def test_an_instance_can_add_the_members_its_class_lacks() -> None:
    silent = _Silent()
    silent.greet = lambda: "hi"  # type: ignore[attr-defined]
    assert implements(silent, _Greets)
    assert not implements(_Silent(), _Greets)


def test_proxies_are_decided_per_instance() -> None:
    assert implements(_Proxy(_Greeter()), _Greets)
    assert not implements(_Proxy(_Silent()), _Greets)
    assert implements(_Proxy(_Greeter()), _Greets)


class _Disowned(_Greeter):
    """Inherits the method and sets it to ``None``: the protocol's way to say
    "not implemented"."""

    greet = None  # type: ignore[assignment]


def test_a_method_set_to_none_counts_as_absent_on_every_python() -> None:
    assert not implements(_Disowned(), _Greets)
    assert not implements(_Proxy(_Disowned()), _Greets)
