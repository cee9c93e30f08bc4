"""Run budgets: byte and cost limits per run, and the arithmetic of admission.

A run may carry a :class:`Budget` (set at submission). Its *account* is the
run itself; a child run draws on every account of its ancestry that has a
budget (its root's, and its own when it was given a smaller one), so a
charge is admitted only when every account it touches has room.

- Input bytes: the canonical JSON bytes of an attempt's resolved inputs,
  admitted and charged in one store commit before the executor is entered,
  fenced by the attempt's ownership. Accepted input stays charged even if the
  attempt later fails.
- Output bytes: the canonical JSON bytes of the outputs a completion
  publishes, charged in the completion's own commit; a completion that does
  not fit is refused before anything is written.
- Cost: before executing, the attempt's estimate is *reserved* as a hold
  against the other holds and charges of the account. A hold is live only
  while its attempt is the task's current RUNNING attempt, so failure,
  cancellation, waiting and reclaim release it in the commit that ends the
  attempt; a completion converts it into a charge. Costs are kept in integer
  micro-units (:data:`COST_SCALE`) so sums never drift.

Exhaustion is a non-retryable task failure with code ``budget_exhausted``;
a stale or cancelled attempt's write is refused before it is charged, so it
consumes nothing. This module is pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, field_validator

from dagwerk.errors import DagwerkError
from dagwerk.json import canonical_json_bytes
from dagwerk.models import EmittedOutput, TaskInputs

__all__ = [
    "COST_SCALE",
    "AccountUsage",
    "Admission",
    "AdmissionStatus",
    "Budget",
    "BudgetExhaustedError",
    "CostEstimateError",
    "cost_to_units",
    "input_bytes",
    "output_bytes",
    "refuse_charge",
    "units_to_cost",
]

COST_SCALE = 1_000_000
"""Cost is stored in micro-units: 1 credit = 1,000,000 units."""


class BudgetExhaustedError(DagwerkError, ValueError):
    """A charge does not fit a run's budget; the task fails without retry."""

    code = "budget_exhausted"


class CostEstimateError(DagwerkError, ValueError):
    """A cost-limited run has a task whose plugin has no usable estimate."""

    code = "cost_estimate_missing"


def cost_to_units(cost: object) -> int:
    """A finite, non-negative cost in integer micro-units (rounded to nearest)."""
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        raise CostEstimateError("cost_estimate_missing: a cost must be a number", field="cost")
    if not math.isfinite(cost) or cost < 0:
        raise CostEstimateError(
            f"cost_estimate_missing: cost {cost!r} must be finite and >= 0", field="cost"
        )
    return round(cost * COST_SCALE)


def units_to_cost(units: int) -> float:
    """Micro-units back to credits."""
    return units / COST_SCALE


class Budget(BaseModel):
    """Per-run limits; ``None`` leaves a dimension unlimited."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    max_input_bytes: int | None = None
    max_output_bytes: int | None = None
    max_cost: float | int | None = None

    @field_validator("max_input_bytes", "max_output_bytes")
    @classmethod
    def _bytes(cls, value: int | None) -> int | None:
        if value is not None and value < 0:
            raise ValueError("byte limits must be >= 0")
        return value

    @field_validator("max_cost")
    @classmethod
    def _cost(cls, value: float | int | None) -> float | int | None:
        if value is not None:
            cost_to_units(value)
        return value

    @property
    def max_cost_units(self) -> int | None:
        return None if self.max_cost is None else cost_to_units(self.max_cost)

    def is_empty(self) -> bool:
        return (
            self.max_input_bytes is None
            and self.max_output_bytes is None
            and (self.max_cost is None)
        )

    def within(self, other: Budget) -> bool:
        """Every limit ``other`` sets is set here too, no larger."""
        pairs = (
            (self.max_input_bytes, other.max_input_bytes),
            (self.max_output_bytes, other.max_output_bytes),
            (self.max_cost_units, other.max_cost_units),
        )
        return all(outer is None or (mine is not None and mine <= outer) for mine, outer in pairs)


@dataclass(frozen=True, slots=True)
class AccountUsage:
    """One budget account (the run that owns the budget) and what it has used.

    ``reserved_units`` are live cost holds; ``charged_units`` settled cost.
    """

    account_run_id: str
    budget: Budget
    used_input_bytes: int = 0
    used_output_bytes: int = 0
    charged_units: int = 0
    reserved_units: int = 0

    @property
    def charged_cost(self) -> float:
        return units_to_cost(self.charged_units)

    @property
    def reserved_cost(self) -> float:
        return units_to_cost(self.reserved_units)

    def to_json(self) -> dict[str, object]:
        return {
            "account": self.account_run_id,
            "max_input_bytes": self.budget.max_input_bytes,
            "used_input_bytes": self.used_input_bytes,
            "max_output_bytes": self.budget.max_output_bytes,
            "used_output_bytes": self.used_output_bytes,
            "max_cost": self.budget.max_cost,
            "charged_cost": self.charged_cost,
            "reserved_cost": self.reserved_cost,
        }


class AdmissionStatus(StrEnum):
    ADMITTED = "admitted"
    EXHAUSTED = "exhausted"
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to an admission request: ``detail`` explains an exhaustion."""

    status: AdmissionStatus
    detail: str = ""
    reserved_units: int = 0


def refuse_charge(
    accounts: Iterable[AccountUsage],
    *,
    input_bytes: int = 0,
    output_bytes: int = 0,
    cost_units: int = 0,
) -> str | None:
    """Why the charge does not fit one of ``accounts``; ``None`` when it fits all."""
    for account in accounts:
        budget = account.budget
        name = account.account_run_id
        if (
            input_bytes
            and budget.max_input_bytes is not None
            and account.used_input_bytes + input_bytes > budget.max_input_bytes
        ):
            return (
                f"budget_exhausted: input of {input_bytes} bytes exceeds run {name!r}'s "
                f"max_input_bytes {budget.max_input_bytes} ({account.used_input_bytes} used)"
            )
        if (
            output_bytes
            and budget.max_output_bytes is not None
            and account.used_output_bytes + output_bytes > budget.max_output_bytes
        ):
            return (
                f"budget_exhausted: output of {output_bytes} bytes exceeds run {name!r}'s "
                f"max_output_bytes {budget.max_output_bytes} ({account.used_output_bytes} used)"
            )
        limit = budget.max_cost_units
        if (
            cost_units
            and limit is not None
            and account.charged_units + account.reserved_units + cost_units > limit
        ):
            return (
                f"budget_exhausted: cost estimate {units_to_cost(cost_units)} exceeds run "
                f"{name!r}'s max_cost {budget.max_cost} ({account.charged_cost} charged, "
                f"{account.reserved_cost} reserved)"
            )
    return None


def _output_payload(output: EmittedOutput) -> dict[str, object]:
    return {"data": output.data, "fields": output.fields, "id": output.id}


def output_bytes(outputs: Sequence[EmittedOutput]) -> int:
    """Canonical JSON bytes of the outputs a completion persists (BG-03: plain
    JSON values only; no ``toJSON``-style hooks are ever called)."""
    return sum(len(canonical_json_bytes(_output_payload(o))) for o in outputs)


def input_bytes(inputs: TaskInputs) -> int:
    """Canonical JSON bytes of an attempt's resolved inputs."""
    payload = {
        "edges": {
            name: [{"data": o.data, "fields": o.fields, "id": o.id} for o in outs]
            for name, outs in inputs.edges.items()
        },
        "parameters": inputs.parameters,
    }
    return len(canonical_json_bytes(payload))
