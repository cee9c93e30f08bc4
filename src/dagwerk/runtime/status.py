"""The worker's reads of a run's durable status.

Every part of the worker that asks whether a run is still RUNNING (the
delivery paths before and after a claim, the attempt monitor, the actor's
``wait_for_run``) asks one :class:`RunStatusReader`, so the read is one
seam of the worker.
"""

from __future__ import annotations

import logging

from dagwerk.constants import RunStatus
from dagwerk.runtime.faults import FaultGate, log_failure
from dagwerk.store import DagStore

__all__ = ["RunStatusReader"]

_LOG = logging.getLogger("dagwerk.runtime.worker")


class RunStatusReader:
    """Reads run statuses from ``store``; a store fault of a :meth:`safe`
    read goes to ``faults``."""

    def __init__(self, store: DagStore, *, faults: FaultGate | None = None) -> None:
        self._store = store
        self._faults = faults

    def read(self, run_id: str) -> RunStatus | None:
        """The run's status (``None``: no such run); a failing read raises."""
        return self._store.get_run_status(run_id)

    def safe(self, run_id: str) -> RunStatus | None:
        """:meth:`read`, with a failing read logged and answered ``None``:
        an unreadable run never authorises anything."""
        try:
            return self.read(run_id)
        except Exception as exc:
            log_failure(self._faults, _LOG, exc, f"reading run {run_id}")
            return None
