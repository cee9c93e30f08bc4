"""The context a plugin receives next to its inputs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from dagwerk.budgets import Budget
from dagwerk.json import JsonValue
from dagwerk.lineage import child_wait_id
from dagwerk.runtime.budget_guard import ByteLimits
from dagwerk.runtime.children import ChildRequests, ChildResult, ChildRunError
from dagwerk.runtime.errors import ExecutionRootError, TaskCancelled, WaitRequested
from dagwerk.runtime.task_logs import AttemptLog
from dagwerk.store import validate_wait_id

__all__ = ["AbortSignal", "TaskContext", "validate_execution_root"]


class AbortSignal(Protocol):
    """What ``ctx.cancelled`` offers: ``threading.Event`` in threads,
    ``multiprocessing.Event`` in a child process."""

    def is_set(self) -> bool: ...
    def set(self) -> None: ...
    def wait(self, timeout: float | None = None) -> bool: ...


def _no_heartbeat() -> None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskContext:
    """Where an attempt runs and how it talks back to its worker.

    ``attempt`` is the 1-based attempt number the worker knows of;
    ``resumed_from_wait_id`` names the wait this attempt's lineage resumed
    from (load the application's checkpoint under it). ``cancelled`` is set
    when the run is cancelled, the attempt times out or the worker stops;
    a cooperative plugin checks it (``check_cancelled()``) between steps.
    ``execution_root`` is the worker's validated, absolute execution
    directory, never the process's current directory.
    """

    run_id: str
    task_id: str
    node_index: int
    generation: int
    attempt_id: str
    attempt: int
    plugin: str
    execution_root: Path
    cancelled: AbortSignal
    resumed_from_wait_id: str | None = None
    secrets: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger] = field(
        default_factory=lambda: logging.getLogger("dagwerk.task")
    )
    heartbeat_fn: Callable[[], None] = _no_heartbeat
    wait_response: JsonValue | None = None
    """The response stored when this attempt's lineage resumed from
    ``resumed_from_wait_id`` (``None`` without one)."""
    children: ChildRequests = field(default_factory=ChildRequests)
    """Child runs this attempt asked for (see :meth:`start_child`)."""
    byte_limits: ByteLimits = field(default_factory=ByteLimits)
    """The worker's per-task byte limits, fixed at worker construction (BG-01)."""
    task_log: AttemptLog | None = None
    """Where the attempt's log lines are captured (``None``: nowhere)."""

    def check_cancelled(self) -> None:
        """Raise :class:`TaskCancelled` if the abort signal has fired."""
        if self.cancelled.is_set():
            raise TaskCancelled(f"task {self.task_id!r} attempt {self.attempt_id!r} was aborted")

    def heartbeat(self) -> None:
        """Tell the worker the attempt is alive; the worker extends its lease."""
        self.heartbeat_fn()

    def wait(self, wait_id: str) -> None:
        """Release the worker and park the task in WAITING under ``wait_id``.

        Never returns: it raises :class:`WaitRequested`, which the worker
        commits as a wait. The application resumes the task later with
        ``resume_task``; the new attempt sees ``resumed_from_wait_id``.
        """
        validate_wait_id(wait_id)
        raise WaitRequested(wait_id)

    # --- child runs ---------------------------------------------------

    def start_child(
        self,
        nodes_or_pipeline: object,
        input: Mapping[str, object] | None = None,
        *,
        run_id: str | None = None,
        budget: Budget | None = None,
    ) -> str:
        """Ask for a child run of ``nodes_or_pipeline`` (a list of ``DagNode``, a
        :class:`~dagwerk.runtime.children.ChildPipeline` or a loaded
        ``Pipeline``) and return its run ID. An invalid graph raises here.
        The child is stored and started when the attempt waits for it."""
        return self.children.add(nodes_or_pipeline, input, child_run_id=run_id, budget=budget)

    def wait_for_child(self, child_run_id: str) -> None:
        """Release the worker until the child run is terminal. Never returns:
        the resumed attempt reads :meth:`child_result`."""
        if child_run_id not in self.children.pending:
            raise ChildRunError(
                f"child run {child_run_id!r} was not started by this attempt", field="run_id"
            )
        self.wait(child_wait_id(child_run_id))

    def run_child(
        self,
        nodes_or_pipeline: object,
        input: Mapping[str, object] | None = None,
        *,
        run_id: str | None = None,
        budget: Budget | None = None,
    ) -> None:
        """:meth:`start_child` then :meth:`wait_for_child`; never returns."""
        self.wait_for_child(
            self.start_child(nodes_or_pipeline, input, run_id=run_id, budget=budget)
        )

    def child_result(self, child_run_id: str | None = None) -> ChildResult | None:
        """The result of the child this attempt resumed from (of ``child_run_id``
        when given); ``None`` when the attempt did not resume from that child."""
        waited = self.resumed_from_wait_id
        if waited is None or not waited.startswith("child:"):
            return None
        if child_run_id is not None and waited != child_wait_id(child_run_id):
            return None
        return ChildResult.from_response(self.wait_response)


def validate_execution_root(root: object) -> Path:
    """An existing directory, made absolute; never ``None``, ``""`` or ``"."`` (AA-08)."""
    if root is None or not isinstance(root, str | Path):
        raise ExecutionRootError("execution root is required", field="execution_root")
    if str(root) in ("", "."):
        raise ExecutionRootError(
            f"execution root {str(root)!r} is not an explicit directory", field="execution_root"
        )
    path = Path(root)
    if not path.is_absolute():
        raise ExecutionRootError(
            f"execution root {str(root)!r} must be an absolute path", field="execution_root"
        )
    resolved = path.resolve()
    if not resolved.is_dir():
        raise ExecutionRootError(
            f"execution root {str(root)!r} is not an existing directory", field="execution_root"
        )
    return resolved
