"""The errors of :class:`~dagwerk.engine.Engine`."""

from __future__ import annotations

from dagwerk.errors import DagwerkError

__all__ = [
    "EngineError",
    "IdempotencyConflictError",
    "ResumeRejectedError",
    "RunExistsError",
    "RunWaitTimeoutError",
    "UnknownNodeError",
    "UnsupportedOperationError",
]


class EngineError(DagwerkError):
    """Root of the engine facade's own errors."""

    code = "engine_error"


class RunExistsError(EngineError, ValueError):
    """``submit`` was given a run ID that already exists."""

    code = "run_exists"


class UnknownNodeError(EngineError, ValueError):
    """A node slug does not name a node of the run."""

    code = "node_unknown"


class RunWaitTimeoutError(EngineError, TimeoutError):
    """The run did not reach a terminal state in time; it is left as it is."""

    code = "run_wait_timeout"


class ResumeRejectedError(EngineError, RuntimeError):
    """The task cannot be resumed under that wait ID (nothing changed)."""

    code = "resume_rejected"


class UnsupportedOperationError(EngineError, RuntimeError):
    """The engine's store does not implement the operation."""

    code = "store_operation_unsupported"


class IdempotencyConflictError(EngineError, ValueError):
    """An idempotency key already names a run of another pipeline or input."""

    code = "idempotency_conflict"

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message, field="idempotency_key")
        self.run_id = run_id
