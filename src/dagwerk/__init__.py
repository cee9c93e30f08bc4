"""dagwerk: durable DAG workflows.

The seed engine API lives in submodules at the seed's paths
(``dagwerk.models``, ``dagwerk.orchestrator``, ...). The batteries
(``Engine``, the CLI) are added by later layers.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from dagwerk.pipeline_file import load_pipeline as load_pipeline

# Names loaded on first use, so that ``import dagwerk`` stays light.
_LAZY = {
    "load_pipeline": "dagwerk.pipeline_file",
}


def __getattr__(name: str) -> object:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'dagwerk' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
