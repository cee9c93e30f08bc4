"""Durable task records: what a task already did, for its later attempts.

A plugin re-runs from the top on every attempt (a retry, a recovery, a
resume after a wait). The records here let it replay instead of repeating
itself (see :mod:`dagwerk.runtime.durable`):

- *steps* (``ctx.step``): the JSON result of a named piece of work, written
  once per task by the attempt that ran it, fenced by that attempt;
- *waits*: every wait the task entered, with its state and response;
- *children*: the child runs the task started, with their pipeline
  identity (inside the lineage) and input.

A task ID names one node generation, so a replanned node (``retry --from``,
``rerun``) starts with new tasks and no records: its steps go with its
generation, as its outputs do. Re-exported from :mod:`dagwerk.store`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dagwerk._store_types import InvalidStoreValueError
from dagwerk.constants import RunStatus
from dagwerk.json import JsonValue

__all__ = [
    "MAX_STEP_NAME_LENGTH",
    "DurableTaskStore",
    "StepRecord",
    "TaskChildRecord",
    "TaskJournal",
    "TaskWaitEntry",
    "validate_step_name",
]

MAX_STEP_NAME_LENGTH = 512
"""The longest step name, in characters (as for wait IDs)."""


def validate_step_name(name: object) -> str:
    """A step name is a non-empty ``str`` of at most
    :data:`MAX_STEP_NAME_LENGTH` characters without NUL."""
    if not isinstance(name, str):
        raise InvalidStoreValueError("step name must be a string", field="name")
    if not name:
        raise InvalidStoreValueError("step name must not be empty", field="name")
    if len(name) > MAX_STEP_NAME_LENGTH:
        raise InvalidStoreValueError(
            f"step name is {len(name)} characters; maximum is {MAX_STEP_NAME_LENGTH}",
            field="name",
            limit=MAX_STEP_NAME_LENGTH,
        )
    if "\x00" in name:
        raise InvalidStoreValueError("step name must not contain NUL", field="name")
    return name


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One recorded step of a task: its name, the attempt that ran it and
    its JSON result (frozen). ``position`` orders a task's steps (0, 1, ...)."""

    task_id: str
    name: str
    generation: int
    attempt_id: str
    result: JsonValue
    position: int
    recorded_at: float


@dataclass(frozen=True, slots=True)
class TaskWaitEntry:
    """One wait of a task with its response: ``resumed_attempt_id`` is set
    once the wait is resolved, ``invalidated`` when it can no longer be."""

    wait_id: str
    attempt_id: str
    generation: int
    resumed_attempt_id: str | None
    invalidated: bool
    response: JsonValue | None
    waited_at: float | None

    @property
    def state(self) -> str:
        """``"resolved"``, ``"invalidated"`` or ``"active"``."""
        if self.resumed_attempt_id is not None:
            return "resolved"
        return "invalidated" if self.invalidated else "active"


@dataclass(frozen=True, slots=True)
class TaskChildRecord:
    """A child run the task started: its stored lineage text (the pipeline
    identity is in it), its frozen run input and its status."""

    run_id: str
    lineage: str
    run_input: JsonValue
    status: RunStatus


@dataclass(frozen=True, slots=True)
class TaskJournal:
    """Everything a task recorded, each kind in the order it was recorded."""

    task_id: str
    generation: int
    steps: tuple[StepRecord, ...] = ()
    waits: tuple[TaskWaitEntry, ...] = ()
    children: tuple[TaskChildRecord, ...] = ()


@runtime_checkable
class DurableTaskStore(Protocol):
    """Steps, and reads of a task's records (dagwerk extension).

    Without it ``ctx.step`` raises and a later attempt replays only the wait
    it was resumed from (``ctx.resumed_from_wait_id``).
    """

    def try_record_step(
        self,
        task_id: str,
        name: str,
        result: object,
        *,
        expected_attempt_id: str,
        expected_generation: int,
    ) -> StepRecord | None:
        """One transaction: record step ``name`` of the task with the JSON
        ``result`` when ``expected_attempt_id`` is the task's current RUNNING
        attempt of ``expected_generation`` in a RUNNING run. A step already
        recorded under ``name`` is returned unchanged (the first result
        stays). ``None`` (nothing written): a stale, finished or waiting
        attempt. A malformed name or a result that is not JSON raises
        :class:`~dagwerk.store.InvalidStoreValueError` or
        :class:`~dagwerk.errors.JsonLimitError` before any write."""
        ...

    def get_task_journal(self, task_id: str) -> TaskJournal | None:
        """The task's steps, waits (resolved and invalidated ones included)
        and child runs, read in one snapshot; ``None`` for an unknown task.
        Read-only."""
        ...

    def list_run_journals(self, run_id: str) -> Mapping[str, TaskJournal]:
        """The journals of the run's tasks that recorded a step or a wait,
        keyed by task ID (invalidated tasks included). Read-only."""
        ...
