"""Composite child runs and per-run budgets (dagwerk extensions; see
:mod:`dagwerk.lineage` and :mod:`dagwerk.budgets`).

Re-exported by :mod:`dagwerk.store`; import the names from there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from dagwerk._store_types import (
    TaskWaitResult,
)
from dagwerk.budgets import AccountUsage, Admission, Budget
from dagwerk.constants import (
    FailurePolicy,
)
from dagwerk.lineage import RunLink
from dagwerk.models import (
    DagNode,
)


@runtime_checkable
class DagChildStore(Protocol):
    """Child runs with persisted lineage (see :mod:`dagwerk.lineage`).

    A child run's terminal transition resumes its waiting parent task in the
    same commit, with :func:`~dagwerk.lineage.child_result_payload` as the
    wait response; a run's FAILED, CRASHED or CANCELLED transition cancels
    its unfinished descendants in the same commit.
    """

    def create_child_run(
        self,
        run_id: str,
        nodes: Sequence[DagNode],
        *,
        link: RunLink,
        run_input: Mapping[str, object] | None = None,
        failure_policy: FailurePolicy | str = FailurePolicy.FAIL_FAST,
        budget: Budget | None = None,
    ) -> bool:
        """As ``create_run``, storing ``link`` (its ``wait_id`` must be ``None``)
        and an optional own budget; the run also draws on its parent's budget
        accounts. False (no change) if the run exists."""
        ...

    def try_wait_for_child(
        self,
        task_id: str,
        *,
        expected_attempt_id: str,
        expected_generation: int,
        nodes: Sequence[DagNode],
        link: RunLink,
        run_input: Mapping[str, object] | None = None,
        failure_policy: FailurePolicy | str = FailurePolicy.FAIL_FAST,
        budget: Budget | None = None,
    ) -> TaskWaitResult | None:
        """One transaction: create the child ``link.run_id`` already RUNNING
        (its roots are launched by the next reconcile, the caller's or a
        backstop pass's, so a crash in between strands nothing) and move the
        current RUNNING attempt to WAITING under ``link.wait_id``. ``None``
        (nothing changed): not the current RUNNING attempt, a wait already
        active, the wait ID used before, or the child run exists."""
        ...

    def get_run_link(self, run_id: str) -> RunLink | None:
        """The child record of a run; ``None`` for a root or unknown run."""
        ...

    def list_child_runs(self, run_id: str) -> list[str]:
        """IDs of the runs started by tasks of ``run_id``, oldest first."""
        ...


@runtime_checkable
class DagBudgetStore(Protocol):
    """Per-run budgets (see :mod:`dagwerk.budgets`)."""

    def try_set_run_budget(self, run_id: str, budget: Budget) -> bool:
        """Give a PENDING run without budget accounts its own budget. False
        (no change) otherwise."""
        ...

    def get_run_budget(self, run_id: str) -> tuple[AccountUsage, ...]:
        """Usage of every account the run draws on (own first, then its
        ancestors'); empty without budgets. Read-only."""
        ...

    def try_admit_task(
        self,
        task_id: str,
        *,
        expected_attempt_id: str,
        input_bytes: int,
        cost_units: int | None,
    ) -> Admission:
        """One transaction fenced by the current RUNNING attempt: charge
        ``input_bytes`` and hold ``cost_units`` on every account of the run,
        or nothing. STALE: not the current RUNNING attempt (nothing consumed);
        EXHAUSTED: an account has no room (nothing consumed); an exact repeat
        is ADMITTED again without a second charge.

        ``try_complete_task`` of a run with accounts charges the canonical
        bytes of its outputs and converts the attempt's hold into a charge in
        its own commit, or raises :class:`~dagwerk.budgets.BudgetExhaustedError`
        before any write.
        """
        ...
