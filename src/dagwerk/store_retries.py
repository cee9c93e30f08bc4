"""Delayed task retries and node re-runs (dagwerk extensions of the seed's
``DagRetryStore``).

Re-exported by :mod:`dagwerk.store`; import the names from there.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from dagwerk._store_types import (
    RunReopenResult,
)


@runtime_checkable
class DelayedRetryStore(Protocol):
    """A failure and its retry in one commit (dagwerk extension of
    ``DagRetryStore``), for the worker's retry policies.

    Without it the worker records a failure the policy would retry as the
    task's final failure (``on_task_failed``), as in the seed.
    """

    def try_fail_task_with_retry(
        self, task_id: str, error: str, *, expected_attempt_id: str, available_at: float
    ) -> str | None:
        """One transaction: record ``error`` as the FAILED outcome of the current
        RUNNING attempt and replace it with a new QUEUED attempt (same plan,
        generation and wait correlation) whose delivery becomes available at
        ``available_at`` (store clock seconds). The run never sees the task
        FAILED, so no finaliser can close it in between. Returns the new
        attempt ID; ``None`` (nothing changed) when the attempt is not the
        current RUNNING one of an active task in a RUNNING run.
        """
        ...


@runtime_checkable
class NodeRerunStore(Protocol):
    """Re-running nodes of any run, a COMPLETED one included (dagwerk
    extension of ``DagRetryStore``; ``retry.rerun_nodes`` and
    ``Engine.rerun`` need it)."""

    def try_rerun_nodes(self, run_id: str, node_indices: tuple[int, ...]) -> RunReopenResult | None:
        """One transaction under the run lock: the named nodes and all their
        descendants become a new generation (launches, tasks and outputs
        invalidated as a unit; output IDs stay reserved) and the run is
        RUNNING again, from RUNNING or any terminal status (COMPLETED
        included); the retry count increments.

        Raises :class:`~dagwerk.store.RerunRefusedError` (nothing changed) if
        an affected task is RUNNING. ``None``: missing or PENDING run, empty
        or out-of-range indices.
        """
        ...
