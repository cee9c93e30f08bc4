"""Schedules: definitions and triggers (pure), and the scheduler that fires them.

The scheduler (:mod:`dagwerk.scheduling.scheduler`) runs in every worker and
in ``dagwerk serve``; one process at a time holds the scheduling lease and
turns due ticks into runs. :func:`start_scheduler` starts one in a thread of
its own for any other long-lived process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dagwerk.scheduling.definitions import (
    SCHEDULED_FOR,
    CatchupPolicy,
    FireSource,
    OverlapPolicy,
    ScheduleDefinition,
    validate_schedule_name,
)
from dagwerk.scheduling.triggers import ScheduleValueError

if TYPE_CHECKING:
    from dagwerk.scheduling.scheduler import (
        SCHEDULER_LEASE,
        Scheduler,
        SchedulerReport,
        SchedulerThread,
        start_scheduler,
    )

__all__ = [
    "SCHEDULED_FOR",
    "SCHEDULER_LEASE",
    "CatchupPolicy",
    "FireSource",
    "OverlapPolicy",
    "ScheduleDefinition",
    "ScheduleValueError",
    "Scheduler",
    "SchedulerReport",
    "SchedulerThread",
    "start_scheduler",
    "validate_schedule_name",
]

_LAZY = {"SCHEDULER_LEASE", "Scheduler", "SchedulerReport", "SchedulerThread", "start_scheduler"}


def __getattr__(name: str) -> Any:
    # The scheduler imports the orchestrator; the pure parts stay importable
    # without it (the store protocols use the definitions).
    if name in _LAZY:
        from dagwerk.scheduling import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module 'dagwerk.scheduling' has no attribute {name!r}")
