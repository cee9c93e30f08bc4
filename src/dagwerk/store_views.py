"""Read-only views for the dashboard and the HTTP API (dagwerk extension).

:class:`RunViewStore` answers the questions a page of a run or of the run
list asks, each in one read that stays fast for a million runs or a
100,000-task run: a keyset page of runs with filters, task counts per run
and per node, a page of a run's tasks, a task's waits and outputs, a run's
input. Requests are checked once here (:class:`RunQuery`,
:class:`TaskQuery`), so every backend accepts and refuses the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from dagwerk._store_types import InvalidStoreValueError, RunRecord, TaskRecord
from dagwerk.constants import NodeDisposition, RunStatus, TaskStatus
from dagwerk.json import JsonValue, ReadOnlyDict
from dagwerk.models import ResolvedOutput

__all__ = [
    "MAX_PAGE_SIZE",
    "MAX_RUN_IDS_PER_COUNT",
    "NodeTaskStats",
    "RunCursor",
    "RunPage",
    "RunQuery",
    "RunViewStore",
    "TaskQuery",
    "TaskWait",
    "check_run_ids",
    "check_since",
]

MAX_PAGE_SIZE = 500
"""The most runs or tasks one page returns."""

MAX_RUN_IDS_PER_COUNT = 500
"""The most runs one :meth:`RunViewStore.run_task_counts` call counts."""

MAX_FILTER_LENGTH = 200
"""The longest pipeline name or task ID a filter or cursor accepts."""


def _check_limit(limit: object) -> None:
    if type(limit) is not int or not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidStoreValueError(
            f"limit must be an int from 1 to {MAX_PAGE_SIZE}", field="limit"
        )


def _check_text(value: object, name: str) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value or len(value) > MAX_FILTER_LENGTH:
        raise InvalidStoreValueError(
            f"{name} must be a non-empty string of at most {MAX_FILTER_LENGTH} characters",
            field=name,
        )


def _check_time(value: object, name: str) -> None:
    if value is None:
        return
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        raise InvalidStoreValueError(f"{name} must be a finite number (epoch seconds)", field=name)


@dataclass(frozen=True, slots=True)
class RunCursor:
    """Where a page of runs ends: the last run's creation time and ID.

    Runs are ordered newest first by ``(created_at, run_id)``, so the next
    page starts strictly after this pair whatever is inserted meanwhile."""

    created_at: float
    run_id: str

    def __post_init__(self) -> None:
        _check_time(self.created_at, "after.created_at")
        _check_text(self.run_id, "after.run_id")

    def encode(self) -> str:
        """The cursor as one URL-safe token (``created_at~run_id``)."""
        return f"{self.created_at!r}~{self.run_id}"

    @classmethod
    def decode(cls, token: str) -> RunCursor:
        """The cursor :meth:`encode` wrote; :class:`InvalidStoreValueError`
        (field ``after``) for anything else."""
        at, sep, run_id = token.partition("~")
        try:
            created_at = float(at)
        except ValueError:
            created_at = math.nan
        if not sep or not run_id or not math.isfinite(created_at):
            raise InvalidStoreValueError(
                "after must be a cursor returned as next by an earlier page", field="after"
            )
        return cls(created_at, run_id)


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Which runs to list: all filters optional, newest first.

    ``created_after`` is inclusive, ``created_before`` exclusive (epoch
    seconds); ``after`` continues from an earlier page's ``next``."""

    status: RunStatus | None = None
    pipeline: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    after: RunCursor | None = None
    limit: int = 50

    def __post_init__(self) -> None:
        if self.status is not None and not isinstance(self.status, RunStatus):
            try:
                object.__setattr__(self, "status", RunStatus(self.status))
            except ValueError as exc:
                names = ", ".join(s.value for s in RunStatus)
                raise InvalidStoreValueError(
                    f"status must be one of {names}", field="status"
                ) from exc
        _check_text(self.pipeline, "pipeline")
        _check_time(self.created_after, "created_after")
        _check_time(self.created_before, "created_before")
        if self.after is not None and not isinstance(self.after, RunCursor):
            raise InvalidStoreValueError("after must be a RunCursor", field="after")
        _check_limit(self.limit)


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of runs; ``next`` continues it (``None``: this was the last)."""

    runs: tuple[RunRecord, ...]
    next: RunCursor | None


@dataclass(frozen=True, slots=True)
class TaskQuery:
    """Which tasks of a run's active generation to list, in creation order:
    of one node and/or one status when given, after the task ``after``."""

    node_index: int | None = None
    status: TaskStatus | None = None
    after: str | None = None
    limit: int = 50

    def __post_init__(self) -> None:
        if self.node_index is not None and (
            type(self.node_index) is not int or self.node_index < 0
        ):
            raise InvalidStoreValueError("node_index must be an int >= 0", field="node_index")
        if self.status is not None and not isinstance(self.status, TaskStatus):
            try:
                object.__setattr__(self, "status", TaskStatus(self.status))
            except ValueError as exc:
                names = ", ".join(s.value for s in TaskStatus)
                raise InvalidStoreValueError(
                    f"status must be one of {names}", field="status"
                ) from exc
        _check_text(self.after, "after")
        _check_limit(self.limit)


@dataclass(frozen=True, slots=True)
class NodeTaskStats:
    """One launched node of a run's active generation: its launch and its
    tasks, counted.

    ``disposition``, ``complete`` and ``error`` are the active launch's
    (``error`` ``None`` unless planning failed); ``counts`` holds only the
    task statuses that occur; ``attempts`` sums the tasks' attempt numbers
    (retries, recoveries and resumes included); ``first_started_at`` /
    ``last_finished_at`` bound the current attempts' store times (``None``
    while none started / finished)."""

    node_index: int
    disposition: NodeDisposition
    complete: bool
    error: str | None = None
    counts: Mapping[TaskStatus, int] = field(default_factory=ReadOnlyDict)
    attempts: int = 0
    first_started_at: float | None = None
    last_finished_at: float | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True)
class TaskWait:
    """One wait of a task: ``state`` is ``active``, ``resolved`` or
    ``invalidated``; ``response`` is what the resume stored (``None``
    before)."""

    wait_id: str
    state: str
    attempt_id: str
    waited_at: float | None
    resumed_attempt_id: str | None
    response: JsonValue | None


def check_since(since: object) -> float:
    """``since`` as a float, or :class:`InvalidStoreValueError` (field ``since``)."""
    _check_time(since, "since")
    if since is None:
        raise InvalidStoreValueError("since must be a finite number (epoch seconds)", field="since")
    return float(since)  # type: ignore[arg-type]


def check_run_ids(run_ids: object) -> tuple[str, ...]:
    """``run_ids`` as a tuple, or :class:`InvalidStoreValueError` (field
    ``run_ids``) for a non-sequence, a non-string or more than
    :data:`MAX_RUN_IDS_PER_COUNT`."""
    if isinstance(run_ids, (str, bytes)) or not isinstance(run_ids, Sequence):
        raise InvalidStoreValueError("run_ids must be a sequence of run IDs", field="run_ids")
    found = tuple(run_ids)
    if len(found) > MAX_RUN_IDS_PER_COUNT:
        raise InvalidStoreValueError(
            f"run_ids holds {len(found)} IDs; at most {MAX_RUN_IDS_PER_COUNT}", field="run_ids"
        )
    if not all(isinstance(run_id, str) and run_id for run_id in found):
        raise InvalidStoreValueError("run_ids must be non-empty strings", field="run_ids")
    return found


@runtime_checkable
class RunViewStore(Protocol):
    """Read-only views of runs and tasks (dagwerk extension). Each method
    runs in one read transaction and changes nothing. Without it the
    dashboard cannot be served (``dagwerk serve`` says so)."""

    def list_runs_page(self, query: RunQuery) -> RunPage:
        """Up to ``query.limit`` runs matching ``query``, newest first by
        ``(created_at, run_id)``; ``next`` is set when more may follow."""
        ...

    def run_status_counts_since(self, since: float) -> Mapping[RunStatus, int]:
        """How many runs created at or after ``since`` (epoch seconds) are in
        each status that occurs."""
        ...

    def run_task_counts(self, run_ids: Sequence[str]) -> Mapping[str, Mapping[TaskStatus, int]]:
        """Per run of ``run_ids`` (checked by :func:`check_run_ids`), the
        count of its active generation's tasks in each status that occurs;
        unknown runs are absent."""
        ...

    def node_task_stats(self, run_id: str) -> list[NodeTaskStats] | None:
        """One entry per node of the run with an active launch, by node
        index; ``None`` if the run does not exist."""
        ...

    def list_tasks_page(self, run_id: str, query: TaskQuery) -> list[TaskRecord]:
        """Up to ``query.limit`` tasks of the run's active generation
        matching ``query``, in creation order, strictly after the task
        ``query.after`` (an unknown ``after`` or run: empty)."""
        ...

    def list_task_waits(self, task_id: str) -> list[TaskWait]:
        """Every wait the task entered, oldest first (empty for an unknown task)."""
        ...

    def list_task_outputs(self, task_id: str) -> list[ResolvedOutput]:
        """The outputs the task's current generation published under the
        runtime's IDs for it (``TASK_ID/N``), in publication order; outputs
        a plugin named itself are listed with the node, not here."""
        ...

    def get_run_input(self, run_id: str) -> JsonValue | None:
        """The run's stored input (an object); ``None`` if the run does not exist."""
        ...
