"""Run budgets of the SQL store (see :mod:`dagwerk.budgets`).

An account row per budgeted run; ``dagwerk_run_accounts`` lists the accounts
each run draws on. Cost holds are rows keyed by (task, attempt); a hold is
reserved while its attempt is the task's current RUNNING attempt, so every
commit that ends the attempt (failure, crash, cancellation, recovery, wait)
releases it without touching the hold, and a completion marks it charged.
On PostgreSQL ``budget_accounts_of`` locks the account rows, so runs sharing
an account admit one at a time.
"""

from __future__ import annotations

import json

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

from ._base import SqlStoreBase
from .gateway import Row, Tx


def _usage(row: Row) -> AccountUsage:
    max_cost = None if row["max_cost"] is None else json.loads(row["max_cost"])
    budget = Budget(
        max_input_bytes=row["max_input_bytes"],
        max_output_bytes=row["max_output_bytes"],
        max_cost=max_cost,
    )
    return AccountUsage(
        account_run_id=row["account_id"],
        budget=budget,
        used_input_bytes=int(row["used_input_bytes"]),
        used_output_bytes=int(row["used_output_bytes"]),
        charged_units=int(row["charged_units"]),
        reserved_units=int(row["reserved_units"]),
    )


class BudgetsMixin(SqlStoreBase):
    # -- accounts --------------------------------------------------------------

    def _accounts(self, tx: Tx, run_id: str) -> list[AccountUsage]:
        return [_usage(row) for row in tx.all("budget_accounts_of", {"run_id": run_id})]

    def _plan_accounts(
        self, tx: Tx, run_id: str, parent_run_id: str | None, budget: Budget | None
    ) -> list[str]:
        """The accounts a new run draws on; an own budget must fit inside every
        inherited one. Validation only: nothing is written."""
        inherited = self._accounts(tx, parent_run_id) if parent_run_id else []
        ids = [account.account_run_id for account in inherited]
        if budget is None or budget.is_empty():
            return ids
        for account in inherited:
            if not budget.within(account.budget):
                raise InvalidStoreValueError(
                    "a child budget must not exceed its ancestor "
                    f"{account.account_run_id!r}'s budget",
                    field="budget",
                )
        return [run_id, *ids]

    @staticmethod
    def _open_accounts(tx: Tx, run_id: str, accounts: list[str], budget: Budget | None) -> None:
        if accounts and accounts[0] == run_id and budget is not None:
            tx.run(
                "budget_insert",
                {
                    "account_id": run_id,
                    "max_input_bytes": budget.max_input_bytes,
                    "max_output_bytes": budget.max_output_bytes,
                    "max_cost_units": budget.max_cost_units,
                    "max_cost": None if budget.max_cost is None else json.dumps(budget.max_cost),
                },
            )
        for position, account_id in enumerate(accounts):
            tx.run(
                "budget_run_account_insert",
                {"run_id": run_id, "account_id": account_id, "position": position},
            )

    # -- protocol ----------------------------------------------------------------

    def try_set_run_budget(self, run_id: str, budget: Budget) -> bool:
        check_budget(budget, optional=False)
        if budget.is_empty():
            return False
        with self._gw.write() as tx:
            run = tx.one("run_status", {"run_id": run_id})
            if run is None or run["status"] != RunStatus.PENDING.value:
                return False
            if self._accounts(tx, run_id):
                return False
            self._open_accounts(tx, run_id, [run_id], budget)
            return True

    def get_run_budget(self, run_id: str) -> tuple[AccountUsage, ...]:
        if run_id in self._unbudgeted:
            return ()  # started without accounts: it never gets any
        with self._gw.read() as tx:
            return tuple(self._accounts(tx, run_id))

    def try_admit_task(
        self,
        task_id: str,
        *,
        expected_attempt_id: str,
        input_bytes: int,
        cost_units: int | None,
    ) -> Admission:
        check_admission(input_bytes, cost_units)
        with self._gw.write() as tx:
            task = self._current(tx, task_id, expected_attempt_id, TaskStatus.RUNNING, None)
            if task is None:
                # BG-04: a stale or cancelled attempt consumes nothing.
                return Admission(AdmissionStatus.STALE)
            key = {"task_id": task_id, "attempt_id": expected_attempt_id}
            hold = tx.one("budget_hold_get", key)
            if hold is not None:
                return Admission(AdmissionStatus.ADMITTED, reserved_units=int(hold["units"]))
            accounts = self._accounts(tx, task["run_id"])
            if not accounts:
                return Admission(AdmissionStatus.ADMITTED)
            units = cost_units or 0
            refusal = refuse_charge(accounts, input_bytes=input_bytes, cost_units=units)
            if refusal is not None:
                return Admission(AdmissionStatus.EXHAUSTED, refusal)
            for account in accounts:
                tx.run(
                    "budget_charge",
                    {
                        "account_id": account.account_run_id,
                        "input_bytes": input_bytes,
                        "output_bytes": 0,
                        "units": 0,
                    },
                )
            # The hold row also records the admission, so a repeat charges nothing.
            tx.run(
                "budget_hold_insert",
                {**key, "run_id": task["run_id"], "units": units, "input_bytes": input_bytes},
            )
            return Admission(AdmissionStatus.ADMITTED, reserved_units=units)

    # -- completion hook ---------------------------------------------------------

    def _charges_completions(self, tx: Tx, run_id: str, run_status: str) -> bool:
        return bool(self._completion_accounts(tx, run_id, run_status))

    def _completion_accounts(self, tx: Tx, run_id: str, run_status: str) -> list[AccountUsage]:
        """The run's accounts for a completion. A run gets its accounts while
        PENDING (or with its creation, a child) and never returns to PENDING,
        so a started run found without any is remembered (a completion of
        an unbudgeted run then reads no accounts)."""
        if run_id in self._unbudgeted:
            return []
        accounts = self._accounts(tx, run_id)
        if not accounts and run_status != RunStatus.PENDING.value:
            self._unbudgeted[run_id] = True
        return accounts

    def _charge_completion(self, tx: Tx, task: Row, outputs: tuple[EmittedOutput, ...]) -> None:
        accounts = self._completion_accounts(tx, task["run_id"], task["run_status"])
        if not accounts:
            return
        size = output_bytes(outputs)
        refusal = refuse_charge(accounts, output_bytes=size)
        if refusal is not None:
            raise BudgetExhaustedError(refusal, field="outputs")
        key = {"task_id": task["task_id"], "attempt_id": task["attempt_id"]}
        hold = tx.one("budget_hold_get", key)
        units = 0
        # Success converts the hold into a charge, in the completion's commit.
        if hold is not None and not hold["charged"]:
            tx.run("budget_hold_charge", key)
            units = int(hold["units"])
        for account in accounts:
            tx.run(
                "budget_charge",
                {
                    "account_id": account.account_run_id,
                    "input_bytes": 0,
                    "output_bytes": size,
                    "units": units,
                },
            )
