"""Stored waits and their responses (dagwerk extensions of the seed's
``DagWaitStore``): a resume stores the application's answer with the wait,
and a caller that knows only the task and the wait ID reads the wait back.

Re-exported by :mod:`dagwerk.store`; import the names from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dagwerk._store_types import (
    TaskResumeResult,
)
from dagwerk.json import JsonValue


@runtime_checkable
class WaitResponseStore(Protocol):
    """Wait responses: a resume stores the application's answer with the wait,
    and the resumed attempt reads it back (dagwerk extension of
    ``DagWaitStore``).

    Without it ``resume_task`` accepts no response and a resumed attempt gets
    none (``ctx.wait_response`` is ``None``), as in the seed.
    """

    def try_resume_task(
        self,
        task_id: str,
        wait_id: str,
        *,
        expected_attempt_id: str,
        expected_generation: int,
        response: object = None,
    ) -> TaskResumeResult | None:
        """``DagWaitStore.try_resume_task``, storing ``response`` (JSON,
        frozen) with the resolved wait in the same commit. An exact repeat
        returns the first result and keeps the first response."""
        ...

    def get_wait_response(self, task_id: str, wait_id: str) -> JsonValue | None:
        """The response stored when the wait was resolved; ``None`` for an
        unknown or unresolved wait, or a resume without a response. Read-only."""
        ...


@dataclass(frozen=True, slots=True)
class WaitRecord:
    """One wait of a task as the store keeps it: written by ``try_wait_task``
    and kept after the wait is resolved or invalidated (WT-16)."""

    task_id: str
    wait_id: str
    attempt_id: str
    """The attempt that entered the wait: the ``expected_attempt_id`` that
    resumes it and that an exact repeat of the resume passes again."""
    generation: int
    resumed_attempt_id: str | None
    """The attempt the resume created; ``None`` while the wait is unresolved."""
    invalidated: bool
    """The wait was invalidated before it was resolved (its run was cancelled
    or failed, or its node's generation was replaced): it cannot be resumed."""


@runtime_checkable
class WaitRecordStore(Protocol):
    """Reads the stored waits of a task (dagwerk extension).

    Lets a caller that knows only the task and the wait ID (``Engine.resume``,
    ``dagwerk resume``) repeat a resume exactly: the attempt that entered the
    wait stays in the record, while the task row moves on to later attempts.
    """

    def get_wait(self, task_id: str, wait_id: str) -> WaitRecord | None:
        """The task's wait ``wait_id``, resolved and invalidated ones included;
        ``None`` for an unknown task or a wait ID the task never waited on.
        Read-only."""
        ...
