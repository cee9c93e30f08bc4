"""The context a plugin receives next to its inputs."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, overload

from dagwerk.budgets import Budget
from dagwerk.errors import DagwerkError
from dagwerk.identifiers import check_identifier
from dagwerk.json import JsonValue, bounded_json_size, canonical_json_bytes, freeze_json, thaw_json
from dagwerk.lineage import child_wait_id
from dagwerk.runtime.budget_guard import ByteLimits
from dagwerk.runtime.children import ChildRequests, ChildResult, ChildRunError
from dagwerk.runtime.durable import (
    AttemptJournal,
    ChildRunNondeterministicError,
    RecordedChild,
    StepError,
    derived_child_run_id,
)
from dagwerk.runtime.errors import (
    ExecutionRootError,
    NonRetryableError,
    TaskCancelled,
    WaitRequested,
)
from dagwerk.runtime.task_logs import AttemptLog
from dagwerk.store import InvalidStoreValueError, validate_step_name, validate_wait_id

__all__ = ["AbortSignal", "ChildRunFailed", "TaskContext", "validate_execution_root"]


class ChildRunFailed(NonRetryableError):
    """``ctx.wait_for_child`` found the child FAILED, CRASHED or CANCELLED.

    ``result`` is the child's :class:`~dagwerk.runtime.children.ChildResult`.
    Uncaught, it fails the parent task without retry, naming the child.
    """

    code = "child_run_failed"

    def __init__(self, result: ChildResult) -> None:
        error = f": {result.error}" if result.error else ""
        super().__init__(
            f"child_run_failed: child run {result.run_id!r} is {result.status.value}{error}",
            field="run_id",
        )
        self.result = result

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its result when it crosses a process boundary.
        return (type(self), (self.result,))


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

    A plugin is re-run from the top on every attempt; :meth:`step`,
    :meth:`wait` and :meth:`start_child` replay what earlier attempts of the
    task recorded (``journal``, read when the attempt starts), so a plugin
    can be written as straight-line code.
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
    journal: AttemptJournal = field(default_factory=AttemptJournal)
    """What earlier attempts of the task recorded (steps, resolved waits,
    child runs) and what this attempt has used of it."""
    task_log: AttemptLog | None = None
    """Where the attempt's log lines are captured (``None``: nowhere)."""

    def check_cancelled(self) -> None:
        """Raise :class:`TaskCancelled` if the abort signal has fired."""
        if self.cancelled.is_set():
            raise TaskCancelled(f"task {self.task_id!r} attempt {self.attempt_id!r} was aborted")

    def heartbeat(self) -> None:
        """Tell the worker the attempt is alive; the worker extends its lease."""
        self.heartbeat_fn()

    def wait(self, wait_id: str) -> Any:
        """Wait under ``wait_id`` for the application's response and return it.

        On an attempt of a task resumed from ``wait_id`` in this generation
        (directly or through a later wait) it returns the stored response
        (``None`` if the resume gave none). Otherwise it parks the task:
        it raises :class:`WaitRequested`, which the worker commits as a wait,
        and the attempt ends. ``resume_task`` (``dagwerk resume``) resolves
        the wait; the new attempt runs the plugin from the top and this call
        returns the response there. A task never reuses a wait ID.
        """
        validate_wait_id(wait_id)
        waits = self.journal.waits
        if wait_id in waits:
            return waits[wait_id]
        raise WaitRequested(wait_id)

    # --- durable steps ------------------------------------------------

    @overload
    def step(self, name: str, /) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...

    @overload
    def step(self, name: Callable[..., Any], /) -> Callable[..., Any]: ...

    @overload
    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any: ...

    def step(
        self,
        name: str | Callable[..., Any],
        fn: Callable[..., Any] | None = None,
        /,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once per task generation and return its
        JSON result.

        The result is recorded, fenced by this attempt, before the call
        returns; a later attempt of the task (a retry, a recovery, a resume)
        returns the recorded result (as plain ``dict``/``list`` values)
        without calling ``fn``. Use it for side effects that must happen
        once: charge a card, send a mail. A step that raises records
        nothing. Names are unique within a task; the result obeys the
        worker's ``max_output_bytes``. An ``async`` ``fn`` makes the call
        awaitable. As a decorator, ``@ctx.step`` or ``@ctx.step("name")``
        makes each call of the function such a step.

        Raises :class:`~dagwerk.runtime.durable.StepError` (never retried)
        for a malformed or reused name, a result that is not JSON or is too
        large, or a store that records no steps; :class:`TaskCancelled` when
        this attempt is no longer the task's running attempt.
        """
        if fn is None:
            if callable(name):
                return self._step_function(name.__name__, name)
            return lambda function: self._step_function(_checked_name(name), function)
        step_name = _checked_name(name)
        self.journal.claim_step(step_name)
        recorded = self.journal.steps
        if step_name in recorded:
            value = thaw_json(recorded[step_name])
            return _ready(value) if inspect.iscoroutinefunction(fn) else value
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            return self._record_later(step_name, result)
        return self._record(step_name, result)

    def _step_function(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            return self.step(name, function, *args, **kwargs)

        return run

    async def _record_later(self, name: str, result: Awaitable[Any]) -> Any:
        return self._record(name, await result)

    def _record(self, name: str, result: object) -> Any:
        recorder = self.journal.recorder
        if recorder is None:
            raise StepError(
                "step_unsupported: this store records no steps (it does not implement "
                "DurableTaskStore)",
                code="step_unsupported",
                field="store",
            )
        try:
            frozen = freeze_json(result)
        except (DagwerkError, ValueError, TypeError) as exc:
            raise StepError(
                f"step_result_invalid: step {name!r} returned a value that is not JSON: {exc}",
                code="step_result_invalid",
                field="result",
            ) from None
        limit = self.byte_limits.max_output_bytes
        if limit is not None and bounded_json_size(frozen, limit) > limit:
            raise StepError(
                f"step_result_too_large: the result of step {name!r} exceeds the "
                f"worker's max_output_bytes {limit}",
                code="step_result_too_large",
                field="max_output_bytes",
                limit=limit,
            )
        return thaw_json(recorder(name, frozen))

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
        The child is stored and started when the attempt waits for it.

        The k-th call of a task generation gets the same run ID on every
        attempt (derived from the task ID, the generation and k, unless
        ``run_id`` is given); once that child exists the call returns it and
        starts no other. A later call that asks for another pipeline or input
        than the existing child raises
        :class:`~dagwerk.runtime.durable.ChildRunNondeterministicError`
        (never retried): start children in the same order on every attempt.
        """
        if run_id is not None:
            check_identifier(run_id, field="run_id")
        index = self.journal.next_child_index()
        chosen = run_id
        if chosen is None:
            chosen = derived_child_run_id(self.task_id, self.generation, index)
        added = self.children.add(nodes_or_pipeline, input, child_run_id=chosen, budget=budget)
        recorded = self.journal.children.get(added)
        if recorded is None:
            return added
        request = self.children.pending.pop(added)
        _check_same_child(index, recorded, request.pipeline.identity, request.run_input)
        return added

    def wait_for_child(self, child_run_id: str) -> ChildResult:
        """The child's result once it COMPLETED; until then the task parks.

        Returns a :class:`~dagwerk.runtime.children.ChildResult` on an
        attempt resumed after the child finished; raises
        :class:`ChildRunFailed` (carrying the result; never retried) when the
        child FAILED, CRASHED or was CANCELLED. Otherwise it releases the
        worker until the child is terminal (as :meth:`wait` parks).
        """
        wait_id = child_wait_id(child_run_id)
        waits = self.journal.waits
        if wait_id in waits:
            result = ChildResult.from_response(waits[wait_id])
            if result is None:
                raise ChildRunError(f"child run {child_run_id!r} left no result", field="run_id")
            if not result.ok:
                raise ChildRunFailed(result)
            return result
        if child_run_id not in self.children.pending:
            raise ChildRunError(
                f"child run {child_run_id!r} was not started by this attempt", field="run_id"
            )
        raise WaitRequested(wait_id)

    def wait_for_children(self, child_run_ids: Sequence[str]) -> list[ChildResult]:
        """:meth:`wait_for_child` for each child in order: their results, once
        all COMPLETED (the task parks on the first unfinished one)."""
        return [self.wait_for_child(child_run_id) for child_run_id in child_run_ids]

    def run_child(
        self,
        nodes_or_pipeline: object,
        input: Mapping[str, object] | None = None,
        *,
        run_id: str | None = None,
        budget: Budget | None = None,
    ) -> ChildResult:
        """:meth:`start_child` then :meth:`wait_for_child`."""
        return self.wait_for_child(
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


def _checked_name(name: object) -> str:
    try:
        return validate_step_name(name)
    except InvalidStoreValueError as exc:
        raise StepError(f"step_name_invalid: {exc.message}", field="name") from None


async def _ready(value: object) -> object:
    return value


def _json_text(value: object) -> bytes | None:
    try:
        return canonical_json_bytes(value)
    except (DagwerkError, ValueError, TypeError):
        return None


def _check_same_child(
    index: int, recorded: RecordedChild, pipeline_id: str, run_input: Mapping[str, object]
) -> None:
    """A replayed ``start_child`` call must ask for the child it started."""
    problems = []
    if recorded.pipeline_id != pipeline_id:
        problems.append(f"pipeline {pipeline_id} instead of {recorded.pipeline_id}")
    wanted = _json_text(dict(run_input))
    if wanted is None or wanted != _json_text(recorded.run_input):
        problems.append("another input")
    if problems:
        raise ChildRunNondeterministicError(
            f"child_run_nondeterministic: start_child call {index} (0-based) of this task "
            f"asks for {' and '.join(problems)} than child run {recorded.run_id!r} it "
            "started on an earlier attempt; start the same children in the same order "
            "on every attempt",
            field="start_child",
        )


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
