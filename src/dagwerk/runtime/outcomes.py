"""What an attempt's plugin call comes to: an :class:`ExecutionOutcome`.

Shared by every executor and by the process executor's plugin processes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dagwerk.models import EmittedOutput
from dagwerk.runtime.errors import TaskCancelled, WaitRequested
from dagwerk.runtime.plugins import normalize_outputs

__all__ = ["ExecutionOutcome", "OutcomeKind", "as_coroutine", "outcome_of_call"]


class OutcomeKind(StrEnum):
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class ExecutionOutcome:
    """The settled result of one attempt.

    ``outputs`` for OK; ``error`` for ERROR; ``wait_id`` for WAIT.
    ``retryable`` is False when an isolation stop failed (WK-16): the winning
    outcome is kept but must not be retried. ``traceback`` is ``error``'s
    formatted traceback when it was raised in a plugin process (an error
    that crossed a pipe has none of its own).
    """

    kind: OutcomeKind
    outputs: tuple[EmittedOutput, ...] = ()
    error: BaseException | None = None
    wait_id: str | None = None
    retryable: bool = True
    detail: str = ""
    traceback: str | None = None


def outcome_of_call(fn: Callable[[], Any], task_id: str) -> ExecutionOutcome:
    """Call ``fn`` (a plugin call) and classify how it ended."""
    try:
        result = fn()
        return ExecutionOutcome(OutcomeKind.OK, outputs=normalize_outputs(result, task_id))
    except WaitRequested as wait:
        return ExecutionOutcome(OutcomeKind.WAIT, wait_id=wait.wait_id)
    except TaskCancelled as exc:
        return ExecutionOutcome(OutcomeKind.CANCELLED, error=exc)
    except BaseException as exc:
        # A plugin error is a task failure, never a worker error; SystemExit
        # too: it would end the plugin's thread with the attempt unsettled.
        return ExecutionOutcome(OutcomeKind.ERROR, error=exc)


async def as_coroutine(awaitable: Any) -> Any:
    """``awaitable`` as a coroutine, for ``asyncio.run``."""
    return await awaitable
