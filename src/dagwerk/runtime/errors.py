"""Typed errors and control-flow signals of the worker runtime."""

from __future__ import annotations

from dagwerk.errors import DagwerkError

__all__ = [
    "AdvancementWaitError",
    "ExecutionRootError",
    "NonRetryableError",
    "PluginOutputError",
    "RunAdvancementStoppedError",
    "TaskCancelled",
    "TaskTimedOut",
    "UnknownPluginError",
    "WaitRequested",
    "WorkerStoppedError",
]


class PluginOutputError(DagwerkError, TypeError):
    """A plugin returned something that is not one of the output conventions."""

    code = "plugin_output_invalid"


class UnknownPluginError(DagwerkError, LookupError):
    """No plugin is registered under the node's plugin name."""

    code = "plugin_unknown"


class NonRetryableError(DagwerkError):
    """Raised by a plugin to fail its task without any retry."""

    code = "task_non_retryable"


class TaskCancelled(DagwerkError):
    """The attempt's abort signal fired (run cancelled, timeout, or shutdown)."""

    code = "task_cancelled"


class TaskTimedOut(DagwerkError):
    """The attempt ran past its deadline; the outcome is settled as a timeout."""

    code = "task_timeout"


class WaitRequested(BaseException):
    """Raised by ``ctx.wait(wait_id)``; the worker turns it into a committed wait.

    It derives from ``BaseException`` so a plugin's ``except Exception`` does
    not swallow it by accident.
    """

    def __init__(self, wait_id: str) -> None:
        super().__init__(wait_id)
        self.wait_id = wait_id


class ExecutionRootError(DagwerkError, ValueError):
    """The worker's execution root is missing, empty, ``"."`` or not a directory."""

    code = "execution_root_invalid"


class RunAdvancementStoppedError(DagwerkError, RuntimeError):
    """``start`` was called on an advancement actor that was stopped (AA-07)."""

    code = "runtime_advancement_stopped"


class WorkerStoppedError(DagwerkError, RuntimeError):
    """``start`` was called on a worker that was stopped."""

    code = "worker_stopped"


class AdvancementWaitError(DagwerkError, RuntimeError):
    """An observer of a run stopped waiting without the run reaching a terminal state.

    ``code`` is ``runtime_advancement_wait_aborted``,
    ``runtime_advancement_wait_deadline``, ``runtime_advancement_stopped`` or
    ``runtime_advancement_query_throw``. The run itself is never cancelled.
    """

    code = "runtime_advancement_wait"
