"""Observers of a worker: what metrics (or tests) hear about its work.

A worker calls every observer it was given at a few points: an attempt is
about to run, a delivery was handled (with the action the worker took), the
idle sweep finished, a backstop pass finished. Observers must be quick and
must not raise; a raising observer is logged and ignored, so observation can
never change what the worker does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dagwerk.models import DagNode
from dagwerk.store import LeasedDelivery

if TYPE_CHECKING:
    from dagwerk.runtime.backstop import BackstopReport
    from dagwerk.runtime.sweep import SweepReport

__all__ = ["DeliveryReport", "WorkerObserver", "notify"]

_LOG = logging.getLogger("dagwerk.runtime.observer")


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """What the worker did with one delivery (for tests and logs)."""

    delivery_id: str
    task_id: str
    action: str  # completed, failed, retried, recovered, dead_lettered, waited, cancelled, ...
    detail: str = ""


class WorkerObserver:
    """Base class with no-op hooks; override the ones you need."""

    def task_started(self, delivery: LeasedDelivery, node: DagNode) -> None:
        """The attempt of ``delivery`` (of ``node``) is claimed and about to run."""

    def delivery_handled(self, report: DeliveryReport, delivery: LeasedDelivery | None) -> None:
        """The worker finished with a delivery (``None`` for a task its dequeue
        dead-lettered); ``report.action`` says what it did."""

    def swept(self, reports: Sequence[SweepReport]) -> None:
        """An idle sweep ran (possibly finding nothing)."""

    def step_finished(self) -> None:
        """A step of the worker's background loop ended without an error."""

    def backstop_finished(self, report: BackstopReport) -> None:
        """A backstop pass ran or was skipped (another holder had the lease)."""


def notify(observers: Sequence[WorkerObserver], hook: str, *args: object) -> None:
    """Call ``hook`` on every observer; an observer's exception is logged only."""
    for observer in observers:
        try:
            getattr(observer, hook)(*args)
        except Exception:
            _LOG.exception("worker observer %r failed in %s", observer, hook)
