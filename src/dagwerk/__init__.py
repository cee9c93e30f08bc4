"""dagwerk: durable DAG workflows.

The seed engine API lives in submodules at the seed's paths
(``dagwerk.models``, ``dagwerk.orchestrator``, ...). The batteries are
re-exported here: ``Engine``, ``plugin``, ``load_pipeline`` and the names a
plugin or pipeline author needs.

>>> from dagwerk import Engine, DagNode  # doctest: +SKIP
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from dagwerk.constants import InputMode as InputMode
    from dagwerk.constants import RunStatus as RunStatus
    from dagwerk.constants import TaskStatus as TaskStatus
    from dagwerk.engine import Engine as Engine
    from dagwerk.engine import RunResult as RunResult
    from dagwerk.engine import plugin as plugin
    from dagwerk.json import FrozenDict as FrozenDict
    from dagwerk.json import thaw_json as thaw_json
    from dagwerk.models import DagNode as DagNode
    from dagwerk.models import EdgeSource as EdgeSource
    from dagwerk.models import EmittedOutput as EmittedOutput
    from dagwerk.models import ExpressionSource as ExpressionSource
    from dagwerk.models import InputEdge as InputEdge
    from dagwerk.models import TaskInputs as TaskInputs
    from dagwerk.pipeline_file import load_pipeline as load_pipeline
    from dagwerk.runtime.context import TaskContext as TaskContext
    from dagwerk.runtime.errors import NonRetryableError as NonRetryableError
    from dagwerk.runtime.retry_policy import RetryPolicy as RetryPolicy

# Names loaded on first use, so that ``import dagwerk`` stays light.
_LAZY = {
    "Engine": "dagwerk.engine",
    "RunResult": "dagwerk.engine",
    "plugin": "dagwerk.engine",
    "load_pipeline": "dagwerk.pipeline_file",
    # A plugin's JSON objects (read-only dicts) and their mutable copy.
    "FrozenDict": "dagwerk.json",
    "thaw_json": "dagwerk.json",
    "DagNode": "dagwerk.models",
    "InputEdge": "dagwerk.models",
    "EdgeSource": "dagwerk.models",
    "ExpressionSource": "dagwerk.models",
    "TaskInputs": "dagwerk.models",
    "EmittedOutput": "dagwerk.models",
    "InputMode": "dagwerk.constants",
    "RunStatus": "dagwerk.constants",
    "TaskStatus": "dagwerk.constants",
    # The worker's context (what a plugin receives), not the seed's record.
    "TaskContext": "dagwerk.runtime.context",
    "RetryPolicy": "dagwerk.runtime.retry_policy",
    "NonRetryableError": "dagwerk.runtime.errors",
}

__all__ = [  # noqa: RUF022 (grouped as in _LAZY)
    "__version__",
    "Engine",
    "RunResult",
    "plugin",
    "load_pipeline",
    "FrozenDict",
    "thaw_json",
    "DagNode",
    "InputEdge",
    "EdgeSource",
    "ExpressionSource",
    "TaskInputs",
    "EmittedOutput",
    "InputMode",
    "RunStatus",
    "TaskStatus",
    "TaskContext",
    "RetryPolicy",
    "NonRetryableError",
]


def __getattr__(name: str) -> object:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'dagwerk' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
