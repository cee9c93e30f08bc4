"""The batteries: :class:`Engine` opens a store from a URL, registers plugins,
submits and runs pipelines, and builds workers.

>>> with Engine("memory://") as engine:  # doctest: +SKIP
...     result = engine.run(nodes, input={"titles": ["a"]})
"""

from __future__ import annotations

from ._engine import (
    DEFAULT_IDEMPOTENCY_RETENTION,
    Engine,
    EngineError,
    IdempotencyConflictError,
    ResumeRejectedError,
    RunExistsError,
    RunWaitTimeoutError,
    SubmitOutcome,
    UnknownNodeError,
    UnsupportedOperationError,
    new_run_id,
    submit_fingerprint,
)
from ._plugins import (
    DEFAULT_REGISTRY,
    EngineRegistry,
    PluginImportError,
    PluginProblem,
    import_plugin_modules,
    plugin,
    plugin_problems,
    search_for_plugins_in,
)
from ._results import MAX_TREE_RUNS, RunLineage, RunNotFoundError, RunProgress, RunResult, RunTree
from ._schedules import (
    BackfillProgress,
    BackfillReport,
    ScheduleExistsError,
    ScheduleNotFoundError,
    SyncReport,
    UnknownPipelineError,
)
from ._urls import DEFAULT_URL, BackendUnavailableError, is_postgres_url, open_store

__all__ = [
    "DEFAULT_IDEMPOTENCY_RETENTION",
    "DEFAULT_REGISTRY",
    "DEFAULT_URL",
    "MAX_TREE_RUNS",
    "BackendUnavailableError",
    "BackfillProgress",
    "BackfillReport",
    "Engine",
    "EngineError",
    "EngineRegistry",
    "IdempotencyConflictError",
    "PluginImportError",
    "PluginProblem",
    "ResumeRejectedError",
    "RunExistsError",
    "RunLineage",
    "RunNotFoundError",
    "RunProgress",
    "RunResult",
    "RunTree",
    "RunWaitTimeoutError",
    "ScheduleExistsError",
    "ScheduleNotFoundError",
    "SubmitOutcome",
    "SyncReport",
    "UnknownNodeError",
    "UnknownPipelineError",
    "UnsupportedOperationError",
    "import_plugin_modules",
    "is_postgres_url",
    "new_run_id",
    "open_store",
    "plugin",
    "plugin_problems",
    "search_for_plugins_in",
    "submit_fingerprint",
]
