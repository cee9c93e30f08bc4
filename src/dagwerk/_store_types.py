"""Errors, request validators, results and records of the store protocols.

:mod:`dagwerk.store` re-exports every public name here; this module only
keeps the value types apart from the protocols that use them.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from dagwerk.constants import (
    MAX_OUTPUTS_PER_TASK_COMPLETION,
    MAX_PIPELINE_NAME_LENGTH,
    MAX_TASK_COMPLETION_ROUTING_BYTES,
    MAX_WAIT_ID_LENGTH,
    FailurePolicy,
    RunStatus,
    TaskStatus,
)
from dagwerk.errors import DagwerkError
from dagwerk.models import TaskInputPlan

# --- errors -----------------------------------------------------------------


class StoreContractError(DagwerkError, RuntimeError):
    """A store returned state that contradicts the request or the protocol.

    The message says what came back and what was expected; for a field that
    disagrees with the request, ``field`` names it.
    """

    code = "store_contract_violation"

    @classmethod
    def unexpected(
        cls, operation: str, value: object, expected: str, *, field: str | None = None
    ) -> StoreContractError:
        """``operation`` returned ``value`` (as its ``field``, where given),
        whose type is not ``expected``:
        ``"try_claim_task returned dict; expected TaskClaimResult or None"``."""
        what = type(value).__name__ if field is None else f"{field} {type(value).__name__}"
        return cls(f"{operation} returned {what}; expected {expected}", field=field)

    @classmethod
    def mismatch(cls, operation: str, field: str, got: object, want: object) -> StoreContractError:
        """``operation`` returned ``got`` in ``field`` where the request implies
        ``want``: ``"try_claim_task returned attempt_id 'b'; expected 'a'"``."""
        return cls(
            f"{operation} returned {field} {_shown(got)}; expected {_shown(want)}", field=field
        )


def _shown(value: object) -> str:
    """A value as a message shows it: enums by their value."""
    return repr(value.value if isinstance(value, Enum) else value)


class OutputPublicationError(DagwerkError, ValueError):
    """The current attempt supplied outputs that cannot be published."""

    code = "output_publication_invalid"


class RerunRefusedError(DagwerkError, RuntimeError):
    """A node re-run would reset a task that is RUNNING; nothing changed."""

    code = "rerun_running"


class InvalidStoreValueError(DagwerkError, ValueError):
    """A request to the store, or a record built for it, has an invalid field."""

    code = "store_value_invalid"


# --- validation helpers -----------------------------------------------------


def validate_wait_id(wait_id: object, *, limit: int = MAX_WAIT_ID_LENGTH) -> None:
    """A wait key is a non-empty ``str`` of at most ``limit`` characters without NUL.

    Whitespace is significant and kept verbatim.
    """
    if not isinstance(wait_id, str):
        raise InvalidStoreValueError("wait ID must be a string", field="wait_id")
    if not wait_id:
        raise InvalidStoreValueError("wait ID must not be empty", field="wait_id")
    if len(wait_id) > limit:
        raise InvalidStoreValueError(
            f"wait ID is {len(wait_id)} characters; maximum is {limit}",
            field="wait_id",
            limit=limit,
        )
    if "\x00" in wait_id:
        raise InvalidStoreValueError("wait ID must not contain NUL", field="wait_id")


def validate_pipeline_name(name: object) -> None:
    """A run's pipeline name is ``None`` or a ``str`` of at most
    :data:`MAX_PIPELINE_NAME_LENGTH` characters without NUL."""
    if name is None:
        return
    if not isinstance(name, str):
        raise InvalidStoreValueError("pipeline name must be a string", field="pipeline")
    if len(name) > MAX_PIPELINE_NAME_LENGTH:
        raise InvalidStoreValueError(
            f"pipeline name is {len(name)} characters; maximum is {MAX_PIPELINE_NAME_LENGTH}",
            field="pipeline",
            limit=MAX_PIPELINE_NAME_LENGTH,
        )
    if "\x00" in name:
        raise InvalidStoreValueError("pipeline name must not contain NUL", field="pipeline")


def _check_count(value: object, name: str) -> int:
    if type(value) is not int or value < 0:
        raise InvalidStoreValueError(f"{name} must be a non-negative int", field=name)
    return value


def validate_output_batch_size(
    output_count: int, *, limit: int = MAX_OUTPUTS_PER_TASK_COMPLETION
) -> None:
    """Reject a first completion batch holding more than ``limit`` outputs."""
    count = _check_count(output_count, "output_count")
    if count > limit:
        raise OutputPublicationError(
            f"task completion contains {count} outputs; maximum is {limit}",
            field="outputs",
            limit=limit,
        )


def validate_output_batch_routing_size(
    routing_size: int, *, limit: int = MAX_TASK_COMPLETION_ROUTING_BYTES
) -> None:
    """Reject a first completion batch whose routing data exceeds ``limit`` bytes."""
    size = _check_count(routing_size, "routing_size")
    if size > limit:
        raise OutputPublicationError(
            f"task completion routing data is {size} bytes; maximum is {limit}",
            field="outputs",
            limit=limit,
        )


def _check_id(value: object, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidStoreValueError(f"{name} must be a non-empty string", field=name)


def _check_index(value: object, name: str) -> None:
    # bool is an int subclass; structural integers reject it (LM-30).
    if type(value) is not int or value < 0:
        raise InvalidStoreValueError(f"{name} must be a non-negative int", field=name)


def _check_optional_wait(value: object, name: str) -> None:
    if value is not None:
        try:
            validate_wait_id(value)
        except InvalidStoreValueError as exc:
            raise InvalidStoreValueError(f"{name}: {exc.message}", field=name) from None


def validate_worker_id(worker_id: object) -> str:
    """A queue worker ID is a non-empty ``str``."""
    if not isinstance(worker_id, str) or not worker_id:
        raise InvalidStoreValueError("worker ID must be a non-empty string", field="worker_id")
    return worker_id


def validate_seconds(value: object, name: str, *, positive: bool) -> float:
    """A finite number of seconds, ``> 0`` when ``positive`` else ``>= 0``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidStoreValueError(f"{name} must be a number of seconds", field=name)
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        bound = "> 0" if positive else ">= 0"
        raise InvalidStoreValueError(f"{name} must be finite and {bound}", field=name)
    return seconds


def validate_queue_names(queues: Sequence[str] | None) -> list[str] | None:
    """``None`` (every queue) or a sequence of non-empty queue names."""
    if queues is None:
        return None
    if isinstance(queues, str) or not all(isinstance(q, str) and q for q in queues):
        raise InvalidStoreValueError(
            "queues must be a sequence of non-empty strings", field="queues"
        )
    return list(queues)


def validate_plugin_names(plugins: Collection[str] | None) -> list[str] | None:
    """``None`` (every plugin) or a collection of non-empty plugin names,
    returned sorted without repeats."""
    if plugins is None:
        return None
    if isinstance(plugins, str) or not all(isinstance(p, str) and p for p in plugins):
        raise InvalidStoreValueError(
            "plugins must be a collection of non-empty strings", field="plugins"
        )
    return sorted(set(plugins))


@dataclass(frozen=True, slots=True)
class WorkerPresenceRequest:
    """A checked ``record_worker`` request: the plugins sorted without
    repeats, the queues (``None``: every queue) and the record's lifetime."""

    worker_id: str
    plugins: tuple[str, ...]
    queues: tuple[str, ...] | None
    ttl_seconds: float


def check_worker_presence(
    worker_id: str,
    plugins: Collection[str],
    queues: Sequence[str] | None,
    ttl_seconds: float,
) -> WorkerPresenceRequest:
    """The checks every store makes of ``record_worker``'s arguments;
    :class:`InvalidStoreValueError` naming the field otherwise."""
    validate_worker_id(worker_id)
    served = validate_plugin_names(plugins)
    if served is None:
        raise InvalidStoreValueError(
            "plugins must be a collection of plugin names", field="plugins"
        )
    names = validate_queue_names(queues)
    ttl = validate_seconds(ttl_seconds, "ttl_seconds", positive=True)
    return WorkerPresenceRequest(
        worker_id, tuple(served), None if names is None else tuple(names), ttl
    )


def validate_run_preference(prefer_run: str | None) -> str | None:
    """``None`` or a non-empty run ID whose rows a dequeue takes first."""
    if prefer_run is not None and (not isinstance(prefer_run, str) or not prefer_run):
        raise InvalidStoreValueError("prefer_run must be a non-empty string", field="prefer_run")
    return prefer_run


# --- references and results -------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskAttemptRef:
    """Names one attempt of a task, e.g. as the cause of a run failure."""

    task_id: str
    attempt_id: str

    def __post_init__(self) -> None:
        _check_id(self.task_id, "task_id")
        _check_id(self.attempt_id, "attempt_id")


@dataclass(frozen=True, slots=True)
class NodeLaunchRef:
    """Names one node launch of one generation, e.g. a failed planning launch."""

    launch_id: str
    node_index: int
    generation: int

    def __post_init__(self) -> None:
        _check_id(self.launch_id, "launch_id")
        _check_index(self.node_index, "node_index")
        _check_index(self.generation, "generation")


@dataclass(frozen=True, slots=True)
class TaskClaimResult:
    """The attempt a delivery may now execute; ``resumed_from_wait_id`` names the
    application checkpoint to load when the attempt descends from a resume."""

    task_id: str
    attempt_id: str
    run_id: str
    node_index: int
    generation: int
    resumed_from_wait_id: str | None = None

    def __post_init__(self) -> None:
        _check_id(self.task_id, "task_id")
        _check_id(self.attempt_id, "attempt_id")
        _check_id(self.run_id, "run_id")
        _check_index(self.node_index, "node_index")
        _check_index(self.generation, "generation")
        _check_optional_wait(self.resumed_from_wait_id, "resumed_from_wait_id")


@dataclass(frozen=True, slots=True)
class TaskRecoveryResult:
    """A committed recovery: ``recovered_attempt_id`` replaced ``abandoned_attempt_id``.

    It records the transition; it does not authorise execution.
    """

    task_id: str
    abandoned_attempt_id: str
    recovered_attempt_id: str
    run_id: str
    node_index: int
    generation: int
    resumed_from_wait_id: str | None = None

    def __post_init__(self) -> None:
        _check_id(self.task_id, "task_id")
        _check_id(self.abandoned_attempt_id, "abandoned_attempt_id")
        _check_id(self.recovered_attempt_id, "recovered_attempt_id")
        _check_id(self.run_id, "run_id")
        _check_index(self.node_index, "node_index")
        _check_index(self.generation, "generation")
        _check_optional_wait(self.resumed_from_wait_id, "resumed_from_wait_id")
        if self.recovered_attempt_id == self.abandoned_attempt_id:
            raise InvalidStoreValueError(
                "recovered attempt must differ from the abandoned attempt",
                field="recovered_attempt_id",
            )


@dataclass(frozen=True, slots=True)
class TaskWaitResult:
    """A committed wait: ``attempt_id`` released its worker under ``wait_id``."""

    task_id: str
    attempt_id: str
    run_id: str
    node_index: int
    generation: int
    wait_id: str

    def __post_init__(self) -> None:
        _check_id(self.task_id, "task_id")
        _check_id(self.attempt_id, "attempt_id")
        _check_id(self.run_id, "run_id")
        _check_index(self.node_index, "node_index")
        _check_index(self.generation, "generation")
        validate_wait_id(self.wait_id)


@dataclass(frozen=True, slots=True)
class TaskResumeResult:
    """A committed resume: ``resumed_attempt_id`` replaced ``waiting_attempt_id``.

    It records the transition; the new attempt still has to win a claim.
    """

    task_id: str
    waiting_attempt_id: str
    resumed_attempt_id: str
    run_id: str
    node_index: int
    generation: int
    wait_id: str

    def __post_init__(self) -> None:
        _check_id(self.task_id, "task_id")
        _check_id(self.waiting_attempt_id, "waiting_attempt_id")
        _check_id(self.resumed_attempt_id, "resumed_attempt_id")
        _check_id(self.run_id, "run_id")
        _check_index(self.node_index, "node_index")
        _check_index(self.generation, "generation")
        validate_wait_id(self.wait_id)
        if self.resumed_attempt_id == self.waiting_attempt_id:
            raise InvalidStoreValueError(
                "resumed attempt must differ from the waiting attempt",
                field="resumed_attempt_id",
            )


@dataclass(frozen=True, slots=True)
class TaskCompletionResult:
    """A committed completion; ``launch_complete`` says whether it completed its launch."""

    task_id: str
    attempt_id: str
    run_id: str
    node_index: int
    generation: int
    launch_complete: bool

    def __post_init__(self) -> None:
        _check_id(self.task_id, "task_id")
        _check_id(self.attempt_id, "attempt_id")
        _check_id(self.run_id, "run_id")
        _check_index(self.node_index, "node_index")
        _check_index(self.generation, "generation")
        if not isinstance(self.launch_complete, bool):
            raise InvalidStoreValueError("launch_complete must be a bool", field="launch_complete")


_FAILURE_STATUSES = frozenset({TaskStatus.FAILED, TaskStatus.CRASHED})


@dataclass(frozen=True, slots=True)
class TaskFailureResult:
    """A committed FAILED or CRASHED result of one attempt."""

    task_id: str
    attempt_id: str
    run_id: str
    node_index: int
    generation: int
    status: TaskStatus

    def __post_init__(self) -> None:
        _check_id(self.task_id, "task_id")
        _check_id(self.attempt_id, "attempt_id")
        _check_id(self.run_id, "run_id")
        _check_index(self.node_index, "node_index")
        _check_index(self.generation, "generation")
        if self.status not in _FAILURE_STATUSES:
            raise InvalidStoreValueError("failure status must be FAILED or CRASHED", field="status")


@dataclass(frozen=True, slots=True)
class RunReopenResult:
    """What a run retry committed: the affected nodes, their new generations and
    the run's retry count."""

    affected_nodes: tuple[int, ...]
    retry_count: int
    generations: Mapping[int, int]

    def __post_init__(self) -> None:
        affected = self.affected_nodes
        if not isinstance(affected, tuple):
            raise InvalidStoreValueError("affected_nodes must be a tuple", field="affected_nodes")
        for index in affected:
            _check_index(index, "affected_nodes")
        if list(affected) != sorted(set(affected)):
            raise InvalidStoreValueError(
                "affected_nodes must be sorted and unique", field="affected_nodes"
            )
        if type(self.retry_count) is not int or self.retry_count < 1:
            raise InvalidStoreValueError("retry_count must be an int >= 1", field="retry_count")
        if not isinstance(self.generations, Mapping):
            raise InvalidStoreValueError("generations must be a mapping", field="generations")
        copied: dict[int, int] = {}
        for key, value in self.generations.items():
            _check_index(key, "generations")
            if type(value) is not int or value < 1:
                raise InvalidStoreValueError(
                    "generations must map node indices to ints >= 1", field="generations"
                )
            copied[key] = value
        if set(copied) != set(affected):
            raise InvalidStoreValueError(
                "generations must have exactly the affected nodes as keys", field="generations"
            )
        object.__setattr__(self, "generations", MappingProxyType(copied))


# --- dagwerk extensions: run, task and delivery records ---------------------


@dataclass(frozen=True, slots=True)
class Delivery:
    """One queue/outbox row: a promise that an attempt will be offered to a worker."""

    delivery_id: str
    task_id: str
    attempt_id: str
    generation: int
    run_id: str
    node_index: int
    launch_id: str


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A read-only view of one run."""

    run_id: str
    status: RunStatus
    failure_policy: FailurePolicy
    retry_count: int
    error: str | None
    node_count: int
    settled_nodes: int
    created_at: float = 0.0
    finished_at: float | None = None
    pipeline: str | None = None
    """The name of the pipeline the run was submitted from (``None``: not told)."""


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A read-only view of one task and its current attempt."""

    task_id: str
    run_id: str
    node_index: int
    generation: int
    launch_id: str
    status: TaskStatus
    attempt_id: str
    plan: TaskInputPlan
    error: str | None
    resumed_from_wait_id: str | None
    active_wait_id: str | None
    invalidated: bool
    attempt_number: int = 1
    """1 for the first attempt; +1 for each replacement (retry, recovery,
    resume, re-injection)."""
    started_at: float | None = None
    """Store time (epoch seconds) the current attempt was claimed; ``None``
    until it is."""
    finished_at: float | None = None
    """Store time the current attempt settled (completed, failed, crashed,
    cancelled or waiting); ``None`` while it is queued or running."""


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt of a task, oldest first in :meth:`DagRunStore.list_attempts`.

    ``status`` is the attempt's outcome: the status its task had when the
    attempt was replaced, the task's terminal status for a current attempt
    that finished, and ``None`` while the current attempt is unfinished.
    ``worker_id`` is the worker that last leased a delivery of the attempt.
    ``started_at`` is the store time (epoch seconds) the attempt was claimed
    (``None``: never claimed); ``finished_at`` the time it settled, or was
    replaced unfinished (``None`` while it is queued or running). Attempts
    stored by a version without these times have ``None`` for both.
    ``traceback`` is the formatted exception the attempt's plugin raised
    (see :mod:`dagwerk.store_tracebacks`; ``None``: none was stored).
    """

    attempt_id: str
    number: int
    status: TaskStatus | None
    error: str | None
    worker_id: str | None
    resumed_from_wait_id: str | None
    started_at: float | None = None
    finished_at: float | None = None
    traceback: str | None = None
