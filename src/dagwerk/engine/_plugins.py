"""Where an engine finds plugins: its own registry, the module-level default
registry, then an import path (``package.module:function``).

``@dagwerk.plugin("name")`` registers into the default registry, so a plugin
module only needs importing (``plugins:`` in a pipeline file, ``--plugins``
on the command line) for every engine and worker in the process to see it.
Modules are found on ``sys.path``, to which a pipeline file's folder is
appended when its plugins are loaded (and the ``dagwerk`` command appends
the current directory).
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from dagwerk.errors import DagwerkError
from dagwerk.runtime.errors import UnknownPluginError
from dagwerk.runtime.plugins import CostEstimateFn, PluginFn, PluginRegistry, PluginSpec
from dagwerk.runtime.retry_policy import RetryPolicy

if TYPE_CHECKING:
    from dagwerk.models import DagNode

__all__ = [
    "DEFAULT_REGISTRY",
    "EngineRegistry",
    "PluginImportError",
    "PluginProblem",
    "import_plugin_modules",
    "plugin",
    "plugin_problems",
    "search_for_plugins_in",
]

DEFAULT_REGISTRY: Final = PluginRegistry()
"""The registry that ``@dagwerk.plugin`` fills; every engine falls back to it."""

# A dotted module path and a function name: ``package.module:function``.
_IMPORT_PATH: Final = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_MODULE_NAME: Final = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")


class PluginImportError(DagwerkError, ValueError):
    """A plugin module or import path cannot be imported."""

    code = "plugin_import_failed"


def plugin(
    name: str,
    *,
    retry: RetryPolicy | None = None,
    timeout_seconds: float | None = None,
    cost: CostEstimateFn | float | int | None = None,
) -> Callable[[PluginFn], PluginFn]:
    """Register the decorated function as plugin ``name`` in the default registry.

    ``cost`` is the estimate a cost-limited run reserves before a task of
    this plugin executes (a number, or a function of the task inputs); a
    node's ``cost_estimate`` takes precedence. The function is returned
    unchanged, so it stays callable (and picklable by reference for the
    process executor).
    """
    return DEFAULT_REGISTRY.plugin(name, retry=retry, timeout_seconds=timeout_seconds, cost=cost)


def _spec_for_function(name: str, fn: PluginFn) -> PluginSpec:
    # A function registered with @dagwerk.plugin keeps its retry settings when
    # a node names it by import path.
    for registered in DEFAULT_REGISTRY:
        spec = DEFAULT_REGISTRY.get(registered)
        if spec.fn is fn:
            return PluginSpec(name, fn, spec.retry, spec.timeout_seconds, spec.cost)
    return PluginSpec(name, fn, RetryPolicy())


def _did_you_mean(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _module_hint(module_name: str, error: ImportError) -> str:
    """A "did you mean" for a module that was not found, among the top-level
    modules on ``sys.path`` (a package's submodules would need importing it)."""
    if not isinstance(error, ModuleNotFoundError) or error.name != module_name:
        return ""
    return _did_you_mean(module_name, (found.name for found in pkgutil.iter_modules()))


def _import_function(path: str) -> PluginFn:
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise PluginImportError(
            f"plugin {path!r}: cannot import module {module_name!r}: {error}"
            + _module_hint(module_name, error),
            field="plugin",
        ) from error
    fn = getattr(module, attribute, None)
    if fn is None or not callable(fn):
        functions = (
            key for key, value in vars(module).items() if callable(value) and key[:1] != "_"
        )
        raise UnknownPluginError(
            f"plugin {path!r}: module {module_name!r} has no function {attribute!r}"
            + _did_you_mean(attribute, functions),
            field="plugin",
        )
    result: PluginFn = fn
    return result


class EngineRegistry(PluginRegistry):
    """A registry that falls back to :data:`DEFAULT_REGISTRY`, then to import paths.

    Lookup order for a node's plugin name: this registry, the default
    registry, then ``package.module:function`` (the module is imported; only
    dotted module names are accepted, never file paths).
    """

    _union: tuple[frozenset[str], frozenset[str], frozenset[str]] | None = None
    """The two registries' names (as :meth:`names` last saw them) and their union."""

    def get(self, name: str) -> PluginSpec:
        if super().__contains__(name):
            return super().get(name)
        if name in DEFAULT_REGISTRY:
            return DEFAULT_REGISTRY.get(name)
        if isinstance(name, str) and _IMPORT_PATH.match(name):
            spec = _spec_for_function(name, _import_function(name))
            return self.register(
                name,
                spec.fn,
                retry=spec.retry,
                timeout_seconds=spec.timeout_seconds,
                cost=spec.cost,
            )
        hint = _did_you_mean(name, self.names()) if isinstance(name, str) else ""
        raise UnknownPluginError(
            f"no plugin is registered as {name!r}"
            + (
                hint
                or "; import the module that registers it (pipeline 'plugins:' or "
                "--plugins) or name it as 'package.module:function'"
            ),
            field="plugin",
        )

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name) or name in DEFAULT_REGISTRY

    def names(self) -> frozenset[str]:
        """This registry's names, the default registry's, and every import
        path resolved so far."""
        own, default = super().names(), DEFAULT_REGISTRY.names()
        union = self._union
        if union is None or union[0] is not own or union[1] is not default:
            union = self._union = (own, default, own | default)
        return union[2]


@dataclass(frozen=True, slots=True)
class PluginProblem:
    """A node whose plugin cannot be resolved: its position in the node
    list, its slug, and the reason (with a "did you mean" when a registered
    name or a function of the module is close)."""

    index: int
    slug: str
    plugin: str
    reason: str


def plugin_problems(nodes: Iterable[DagNode], registry: EngineRegistry) -> list[PluginProblem]:
    """Resolve every node's plugin in ``registry`` (importing the module of
    each ``package.module:function``); one problem per node that fails."""
    problems: list[PluginProblem] = []
    for index, node in enumerate(nodes):
        try:
            registry.get(node.plugin)
        except (UnknownPluginError, PluginImportError) as error:
            problems.append(PluginProblem(index, node.slug, node.plugin, str(error)))
    return problems


def search_for_plugins_in(directory: str | Path) -> None:
    """Append ``directory`` (made absolute) to ``sys.path`` unless it is there."""
    entry = str(Path(directory).resolve())
    if entry not in sys.path:
        # Appended, not prepended: a local file never shadows an installed module.
        sys.path.append(entry)


def import_plugin_modules(modules: Iterable[str], *, base_dir: str | Path | None = None) -> None:
    """Import plugin modules so that their ``@dagwerk.plugin`` registrations run.

    Each entry is a dotted module name or a path to a ``.py`` file. A file's
    directory is added to ``sys.path`` and the file imported by its stem, so
    worker processes started by the process executor can import it too.
    ``base_dir`` (a pipeline file's directory) resolves relative file paths
    and is searched for module names, also those of plugins named by import
    path (``module:function``) that are imported later.
    """
    base = Path(base_dir) if base_dir is not None else None
    if base is not None:
        search_for_plugins_in(base)
    for entry in modules:
        if not isinstance(entry, str) or not entry:
            raise PluginImportError("plugin module names must be non-empty strings")
        if entry.endswith(".py") or "/" in entry or "\\" in entry:
            file = Path(entry)
            if not file.is_absolute() and base is not None and not file.exists():
                file = base / file
            if not file.is_file():
                raise PluginImportError(f"plugin file {entry!r} does not exist", field="plugins")
            search_for_plugins_in(file.parent)
            module_name = file.stem
        else:
            if not _MODULE_NAME.match(entry):
                raise PluginImportError(
                    f"plugin module {entry!r} is not a dotted module name", field="plugins"
                )
            module_name = entry
        try:
            importlib.import_module(module_name)
        except ImportError as error:
            raise PluginImportError(
                f"cannot import plugin module {entry!r}: {error}"
                + _module_hint(module_name, error),
                field="plugins",
            ) from error
