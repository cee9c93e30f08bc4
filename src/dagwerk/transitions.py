"""The allowed run and task transitions, as data.

Every backend moves runs and tasks only along these edges and checks each
write with :func:`check_run_transition` / :func:`check_task_transition`, so a
bug in one backend surfaces as :class:`InvalidTransitionError` instead of a
silently corrupted state. The contract suite checks every backend against the
same table.

Each edge is named after the operation that takes it (``claim``, ``wait``,
...), which keeps the table readable and lets error messages say what was
attempted.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeVar

from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.errors import DagwerkError

__all__ = [
    "RUN_TRANSITIONS",
    "RUN_TRANSITION_EVENTS",
    "TASK_TRANSITIONS",
    "TASK_TRANSITION_EVENTS",
    "InvalidTransitionError",
    "check_run_transition",
    "check_task_transition",
]


class InvalidTransitionError(DagwerkError, RuntimeError):
    """A store tried to move a run or task along an edge the table forbids."""

    code = "transition_invalid"


_R = RunStatus
_T = TaskStatus

RUN_TRANSITION_EVENTS: Final[Mapping[tuple[RunStatus, RunStatus], str]] = MappingProxyType(
    {
        (_R.PENDING, _R.RUNNING): "start",
        # A PENDING run may be aborted or cancelled before it ever starts.
        (_R.PENDING, _R.FAILED): "abort",
        (_R.PENDING, _R.CRASHED): "abort",
        (_R.PENDING, _R.CANCELLED): "cancel",
        (_R.RUNNING, _R.COMPLETED): "complete",
        (_R.RUNNING, _R.FAILED): "fail",
        (_R.RUNNING, _R.CRASHED): "crash",
        (_R.RUNNING, _R.CANCELLED): "cancel",
        # Run retry reopens every unsuccessful terminal status; COMPLETED is final.
        (_R.FAILED, _R.RUNNING): "reopen",
        (_R.CRASHED, _R.RUNNING): "reopen",
        (_R.CANCELLED, _R.RUNNING): "reopen",
        # A node re-run (gated dispatch reset) may reopen a COMPLETED run too.
        (_R.COMPLETED, _R.RUNNING): "rerun",
    }
)
"""Every allowed run edge, named by the operation that takes it."""

TASK_TRANSITION_EVENTS: Final[Mapping[tuple[TaskStatus, TaskStatus], str]] = MappingProxyType(
    {
        # Tasks are created QUEUED together with their outbox row; PENDING is
        # kept for stores that stage rows before publishing them.
        (_T.PENDING, _T.QUEUED): "enqueue",
        (_T.PENDING, _T.CANCELLED): "cancel",
        (_T.QUEUED, _T.RUNNING): "claim",
        (_T.QUEUED, _T.CANCELLED): "cancel",
        # The queue dead-letters a row whose deliveries ran out.
        (_T.QUEUED, _T.CRASHED): "dead_letter",
        (_T.RUNNING, _T.WAITING): "wait",
        (_T.RUNNING, _T.QUEUED): "recover",
        (_T.RUNNING, _T.COMPLETED): "complete",
        (_T.RUNNING, _T.FAILED): "fail",
        (_T.RUNNING, _T.CRASHED): "crash",
        (_T.RUNNING, _T.CANCELLED): "cancel",
        (_T.WAITING, _T.QUEUED): "resume",
        (_T.WAITING, _T.CANCELLED): "cancel",
        (_T.CRASHED, _T.QUEUED): "retry",
    }
)
"""Every allowed task edge, named by the operation that takes it."""


_S = TypeVar("_S", RunStatus, TaskStatus)


def _adjacency(
    events: Mapping[tuple[_S, _S], str], statuses: type[_S]
) -> Mapping[_S, frozenset[_S]]:
    table: dict[_S, set[_S]] = {status: set() for status in statuses}
    for old, new in events:
        table[old].add(new)
    return MappingProxyType({old: frozenset(news) for old, news in table.items()})


RUN_TRANSITIONS: Final[Mapping[RunStatus, frozenset[RunStatus]]] = _adjacency(
    RUN_TRANSITION_EVENTS, RunStatus
)
"""Run status -> the statuses it may move to."""

TASK_TRANSITIONS: Final[Mapping[TaskStatus, frozenset[TaskStatus]]] = _adjacency(
    TASK_TRANSITION_EVENTS, TaskStatus
)
"""Task status -> the statuses it may move to."""


def check_run_transition(old: RunStatus, new: RunStatus) -> str:
    """Return the name of the run edge ``old -> new``; raise if the table forbids it."""
    event = RUN_TRANSITION_EVENTS.get((RunStatus(old), RunStatus(new)))
    if event is None:
        raise InvalidTransitionError(
            f"run transition {RunStatus(old).value} -> {RunStatus(new).value} is not allowed",
            field="status",
        )
    return event


def check_task_transition(old: TaskStatus, new: TaskStatus) -> str:
    """Return the name of the task edge ``old -> new``; raise if the table forbids it."""
    event = TASK_TRANSITION_EVENTS.get((TaskStatus(old), TaskStatus(new)))
    if event is None:
        raise InvalidTransitionError(
            f"task transition {TaskStatus(old).value} -> {TaskStatus(new).value} is not allowed",
            field="status",
        )
    return event
