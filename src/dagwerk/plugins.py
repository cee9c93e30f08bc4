"""Plugin metadata that the run-input schema reads.

The engine needs only one thing from a plugin to build a pipeline's input
schema: the inputs it declares. A plugin object satisfies :class:`PluginMeta`
by providing ``get_effective_inputs()``; nothing else is required (RI-04).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

from dagwerk.errors import DagwerkError
from dagwerk.json import JsonInput, freeze_json

__all__ = ["PluginInputMeta", "PluginLookup", "PluginMeta", "PluginMetadataError"]


class PluginMetadataError(DagwerkError, ValueError):
    """A plugin declared malformed input metadata."""

    code = "plugin_metadata_invalid"


@dataclass(frozen=True, slots=True)
class PluginInputMeta:
    """One input a plugin declares.

    ``source`` says where the value comes from; inputs whose source is
    ``"runtime"`` become run-input schema fields. ``name`` and ``source`` are
    non-empty strings; ``default`` must be JSON and is stored frozen.
    """

    name: str
    description: str
    source: str
    required: bool = False
    placeholder: str = ""
    default: JsonInput = None

    def __post_init__(self) -> None:
        for attribute in ("name", "source"):
            value = getattr(self, attribute)
            if not isinstance(value, str) or not value:
                raise PluginMetadataError(
                    f"plugin input {attribute} must not be empty", field=attribute
                )
        try:
            frozen = freeze_json(self.default)
        except ValueError as error:
            raise PluginMetadataError(
                f"default of plugin input '{self.name}' is not JSON-compatible: {error}",
                field="default",
            ) from error
        object.__setattr__(self, "default", frozen)


@runtime_checkable
class PluginMeta(Protocol):
    """What the schema builder needs from a plugin: its declared inputs."""

    def get_effective_inputs(self) -> list[PluginInputMeta]: ...


PluginLookup: TypeAlias = Callable[[str], PluginMeta | None]
"""Plugin name → metadata, or ``None`` when the name is unknown."""
