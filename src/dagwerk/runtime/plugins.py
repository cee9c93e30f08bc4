"""The plugin registry and the conventions for what a plugin returns.

A plugin is ``fn(inputs: TaskInputs, ctx: TaskContext)``, plain or
``async def``. It returns ``None`` (no outputs), a dict (one output whose
routing fields are the dict), a list of dicts, an :class:`EmittedOutput`, or
a list mixing dicts and ``EmittedOutput`` values. Outputs without an explicit
ID get ``f"{task_id}/{position}"``: the ID depends only on the task and the
position, so every attempt of a task publishes the same IDs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from dagwerk.errors import DagwerkError
from dagwerk.models import EmittedOutput, TaskInputs, emitted_output
from dagwerk.runtime.errors import PluginOutputError, UnknownPluginError
from dagwerk.runtime.retry_policy import RetryPolicy

if TYPE_CHECKING:
    from dagwerk.runtime.context import TaskContext

__all__ = ["CostEstimateFn", "PluginFn", "PluginRegistry", "PluginSpec", "normalize_outputs"]

PluginFn = Callable[[TaskInputs, "TaskContext"], "object | Awaitable[object]"]
CostEstimateFn = Callable[[TaskInputs], float | int]


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """A registered plugin with its execution settings.

    ``timeout_seconds`` (``None``: the worker default) bounds each attempt;
    ``retry`` decides whether a failed attempt gets another.
    """

    name: str
    fn: PluginFn
    retry: RetryPolicy
    timeout_seconds: float | None = None
    cost: CostEstimateFn | float | int | None = None
    """The cost estimate a cost-limited run reserves before executing: a
    number, or a function of the task inputs (see :mod:`dagwerk.budgets`)."""


class PluginRegistry:
    """Maps plugin names (``DagNode.plugin``) to callables and their settings."""

    def __init__(self, plugins: Mapping[str, PluginFn] | None = None) -> None:
        self._specs: dict[str, PluginSpec] = {}
        # names() as of a registration count: a worker asks at every claim.
        self._registrations = 0
        self._names: tuple[int, frozenset[str]] = (0, frozenset())
        for name, fn in (plugins or {}).items():
            self.register(name, fn)

    def register(
        self,
        name: str,
        fn: PluginFn,
        *,
        retry: RetryPolicy | None = None,
        timeout_seconds: float | None = None,
        cost: CostEstimateFn | float | int | None = None,
    ) -> PluginSpec:
        """Register ``fn`` under ``name``; a second registration replaces the first."""
        if not isinstance(name, str) or not name:
            raise DagwerkError("plugin name must be a non-empty string", field="name")
        if not callable(fn):
            raise DagwerkError(f"plugin {name!r} is not callable", field="fn")
        if timeout_seconds is not None and not timeout_seconds > 0:
            raise DagwerkError(
                f"plugin {name!r} timeout_seconds must be > 0", field="timeout_seconds"
            )
        spec = PluginSpec(name, fn, retry or RetryPolicy(), timeout_seconds, cost)
        self._specs[name] = spec
        self._registrations += 1
        return spec

    def plugin(
        self,
        name: str,
        *,
        retry: RetryPolicy | None = None,
        timeout_seconds: float | None = None,
        cost: CostEstimateFn | float | int | None = None,
    ) -> Callable[[PluginFn], PluginFn]:
        """Decorator form of :meth:`register`."""

        def decorate(fn: PluginFn) -> PluginFn:
            self.register(name, fn, retry=retry, timeout_seconds=timeout_seconds, cost=cost)
            return fn

        return decorate

    def get(self, name: str) -> PluginSpec:
        """The plugin registered under ``name``; :class:`UnknownPluginError` otherwise."""
        spec = self._specs.get(name)
        if spec is None:
            raise UnknownPluginError(f"no plugin is registered as {name!r}", field="plugin")
        return spec

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def names(self) -> frozenset[str]:
        """Every name this registry resolves without importing anything: the
        plugins a worker over it serves."""
        registrations = self._registrations
        seen, names = self._names
        if seen != registrations:
            names = frozenset(self._specs)
            self._names = (registrations, names)
        return names

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


def _one(item: object, task_id: str, position: int) -> EmittedOutput:
    if isinstance(item, EmittedOutput):
        return item
    if isinstance(item, Mapping):
        try:
            return emitted_output(f"{task_id}/{position}", dict(item))
        except (ValidationError, ValueError) as exc:
            raise PluginOutputError(
                f"plugin output {position} of task {task_id!r} is not routable JSON: {exc}",
                field="outputs",
            ) from exc
    raise PluginOutputError(
        f"plugin output {position} of task {task_id!r} is a {type(item).__name__}; "
        "expected a dict or an EmittedOutput",
        field="outputs",
    )


def normalize_outputs(result: Any, task_id: str) -> tuple[EmittedOutput, ...]:
    """Turn a plugin's return value into the outputs to publish.

    Anything outside the conventions raises :class:`PluginOutputError`
    (code ``plugin_output_invalid``) naming the task and the position.
    """
    if result is None:
        return ()
    if isinstance(result, EmittedOutput | Mapping):
        return (_one(result, task_id, 0),)
    if isinstance(result, list | tuple):
        return tuple(_one(item, task_id, i) for i, item in enumerate(result))
    raise PluginOutputError(
        f"plugin for task {task_id!r} returned a {type(result).__name__}; expected None, "
        "a dict, a list of dicts or EmittedOutput values",
        field="outputs",
    )
