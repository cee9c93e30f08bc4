"""Run budgets of the in-memory store (see :mod:`dagwerk.budgets`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dagwerk.backends.requests import check_admission, check_budget
from dagwerk.budgets import (
    AccountUsage,
    Admission,
    AdmissionStatus,
    Budget,
    BudgetExhaustedError,
    output_bytes,
    refuse_charge,
)
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.models import EmittedOutput
from dagwerk.store import InvalidStoreValueError

from ._base import MemoryStoreBase
from ._state import RunState, TaskState


@dataclass(slots=True)
class _Account:
    budget: Budget
    used_input_bytes: int = 0
    used_output_bytes: int = 0
    charged_units: int = 0


@dataclass(slots=True)
class _Hold:
    run_id: str
    units: int
    charged: bool = False


class BudgetsMixin(MemoryStoreBase):
    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self._accounts: dict[str, _Account] = {}
        # run -> the accounts it draws on (own first, then its ancestors').
        self._run_accounts: dict[str, tuple[str, ...]] = {}
        self._holds: dict[tuple[str, str], _Hold] = {}
        self._input_charges: dict[tuple[str, str], int] = {}

    # -- accounts --------------------------------------------------------------

    def _plan_accounts(
        self, run_id: str, parent_run_id: str | None, budget: Budget | None
    ) -> tuple[str, ...]:
        """The accounts a new run draws on; an own budget must fit inside every
        inherited one. Validation only: nothing is written."""
        inherited = self._run_accounts.get(parent_run_id, ()) if parent_run_id else ()
        if budget is None or budget.is_empty():
            return inherited
        for account_id in inherited:
            outer = self._accounts[account_id].budget
            if not budget.within(outer):
                raise InvalidStoreValueError(
                    f"a child budget must not exceed its ancestor {account_id!r}'s budget",
                    field="budget",
                )
        return (run_id, *inherited)

    def _open_accounts(self, run_id: str, accounts: tuple[str, ...], budget: Budget | None) -> None:
        if accounts and accounts[0] == run_id and budget is not None:
            self._accounts[run_id] = _Account(budget)
        if accounts:
            self._run_accounts[run_id] = accounts

    def _usage(self, account_id: str) -> AccountUsage:
        account = self._accounts[account_id]
        reserved = 0
        for (task_id, attempt_id), hold in list(self._holds.items()):
            if hold.charged or account_id not in self._run_accounts.get(hold.run_id, ()):
                continue
            if self._hold_live(task_id, attempt_id):
                reserved += hold.units
        return AccountUsage(
            account_run_id=account_id,
            budget=account.budget,
            used_input_bytes=account.used_input_bytes,
            used_output_bytes=account.used_output_bytes,
            charged_units=account.charged_units,
            reserved_units=reserved,
        )

    def _hold_live(self, task_id: str, attempt_id: str) -> bool:
        """A hold counts while its attempt is the task's current RUNNING one, so
        every commit that ends the attempt releases it (BG-05)."""
        task = self._tasks.get(task_id)
        return (
            task is not None
            and not task.invalidated
            and task.attempt_id == attempt_id
            and task.status is TaskStatus.RUNNING
        )

    # -- protocol ----------------------------------------------------------------

    def try_set_run_budget(self, run_id: str, budget: Budget) -> bool:
        check_budget(budget, optional=False)
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.status is not RunStatus.PENDING or run_id in self._run_accounts:
                return False
            if budget.is_empty():
                return False
            self._open_accounts(run_id, (run_id,), budget)
            return True

    def get_run_budget(self, run_id: str) -> tuple[AccountUsage, ...]:
        with self._lock:
            return tuple(self._usage(a) for a in self._run_accounts.get(run_id, ()))

    def try_admit_task(
        self,
        task_id: str,
        *,
        expected_attempt_id: str,
        input_bytes: int,
        cost_units: int | None,
    ) -> Admission:
        check_admission(input_bytes, cost_units)
        with self._lock:
            found = self._current_running(task_id, expected_attempt_id)
            if found is None:
                # BG-04: a stale or cancelled attempt consumes nothing.
                return Admission(AdmissionStatus.STALE)
            run, _ = found
            key = (task_id, expected_attempt_id)
            if key in self._input_charges:
                hold = self._holds.get(key)
                return Admission(AdmissionStatus.ADMITTED, reserved_units=hold.units if hold else 0)
            accounts = self._run_accounts.get(run.run_id, ())
            usages = [self._usage(a) for a in accounts]
            refusal = refuse_charge(usages, input_bytes=input_bytes, cost_units=cost_units or 0)
            if refusal is not None:
                return Admission(AdmissionStatus.EXHAUSTED, refusal)
            for account_id in accounts:
                self._accounts[account_id].used_input_bytes += input_bytes
            self._input_charges[key] = input_bytes
            if cost_units is not None and accounts:
                self._holds[key] = _Hold(run.run_id, cost_units)
            return Admission(AdmissionStatus.ADMITTED, reserved_units=cost_units or 0)

    # -- completion hook ---------------------------------------------------------

    def _charge_completion(
        self, run: RunState, task: TaskState, outputs: tuple[EmittedOutput, ...]
    ) -> None:
        accounts = self._run_accounts.get(run.run_id, ())
        if not accounts:
            return
        size = output_bytes(outputs)
        refusal = refuse_charge([self._usage(a) for a in accounts], output_bytes=size)
        if refusal is not None:
            raise BudgetExhaustedError(refusal, field="outputs")
        hold = self._holds.get((task.task_id, task.attempt_id))
        # Success converts the hold into a charge, in the completion's commit.
        units = 0
        if hold is not None and not hold.charged:
            hold.charged = True
            units = hold.units
        for account_id in accounts:
            account = self._accounts[account_id]
            account.used_output_bytes += size
            account.charged_units += units
