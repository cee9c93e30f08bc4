"""Budget admission in the worker (see :mod:`dagwerk.budgets`).

The worker's own byte limits (:class:`ByteLimits`) are copied at
construction and handed to every task's context; nothing in the queue, the
run or the pipeline can raise them (BG-01). When the run draws on budget
accounts, the attempt's input bytes and cost estimate are admitted in one
store commit fenced by its ownership before the executor is entered; output
bytes are charged by the completion's own commit (BG-02). A cost-limited
run whose plugin has no estimate fails without executing (BG-05). Without
accounts no store accounting happens (BG-06).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dagwerk.budgets import (
    AccountUsage,
    AdmissionStatus,
    BudgetExhaustedError,
    CostEstimateError,
    cost_to_units,
    input_bytes,
    output_bytes,
)
from dagwerk.errors import DagwerkError
from dagwerk.models import EmittedOutput, TaskInputs
from dagwerk.store import DagBudgetStore

if TYPE_CHECKING:
    from dagwerk.runtime.roles import DeliverySettler
    from dagwerk.store import LeasedDelivery

__all__ = ["BudgetGuard", "ByteLimits", "CostEstimate"]

CostEstimate = float | int | Callable[[TaskInputs], float | int]
"""A plugin's cost estimate: a number, or a function of the task's inputs."""


@dataclass(frozen=True, slots=True)
class ByteLimits:
    """Per-task byte limits of one worker (``None``: unlimited)."""

    max_input_bytes: int | None = None
    max_output_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_input_bytes", "max_output_bytes"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 0):
                raise DagwerkError(f"{name} must be an int >= 0", field=name)


def _estimate(plugin: str, estimate: object, inputs: TaskInputs) -> int:
    if estimate is None:
        raise CostEstimateError(
            f"cost_estimate_missing: plugin {plugin!r} has no cost estimate and the run is "
            "cost-limited; it fails without executing",
            field="cost",
        )
    value = estimate(inputs) if callable(estimate) else estimate
    return cost_to_units(value)


class BudgetGuard:
    """A worker's budget checks: ``byte_limits`` and the run's budget accounts
    in ``store`` (``None``: a store without budgets). A refusal is settled
    through the ``settler`` each check is handed."""

    def __init__(self, byte_limits: ByteLimits, store: DagBudgetStore | None) -> None:
        self.byte_limits = byte_limits
        self.store = store

    def admit(
        self,
        settler: DeliverySettler,
        delivery: LeasedDelivery,
        plugin: str,
        estimate: object,
        inputs: TaskInputs,
        *,
        accounts_of: Callable[[str], tuple[AccountUsage, ...]] | None = None,
    ) -> bool:
        """True: execute. False: the guard settled the delivery (failed the task
        with ``budget_exhausted``/``cost_estimate_missing``, or acked a stale one).
        ``accounts_of`` reads the run's budget instead of the store (a batch
        reads each run's budget once)."""
        try:
            # Sized only when something limits it: sizing walks every input.
            size: int | None = None
            limit = self.byte_limits.max_input_bytes
            if limit is not None:
                size = input_bytes(inputs)
            if limit is not None and size is not None and size > limit:
                raise BudgetExhaustedError(
                    f"budget_exhausted: input of {size} bytes exceeds the worker's "
                    f"max_input_bytes {limit}",
                    field="max_input_bytes",
                    limit=limit,
                )
            store = self.store
            if store is None:
                return True
            accounts = (accounts_of or store.get_run_budget)(delivery.run_id)
            if not accounts:
                return True
            if size is None:
                size = input_bytes(inputs)
            cost_limited = any(a.budget.max_cost is not None for a in accounts)
            units = _estimate(plugin, estimate, inputs) if cost_limited else None
            admission = store.try_admit_task(
                delivery.task_id,
                expected_attempt_id=delivery.attempt_id,
                input_bytes=size,
                cost_units=units,
            )
        except DagwerkError as exc:
            settler.fail(delivery, exc)
            return False
        except Exception as exc:  # a failing estimate function is a task failure
            settler.fail(delivery, CostEstimateError(f"cost_estimate_missing: {exc}", field="cost"))
            return False
        if admission.status is AdmissionStatus.STALE:
            settler.ack(delivery, "stale", "admission refused")
            return False
        if admission.status is AdmissionStatus.EXHAUSTED:
            settler.fail(delivery, BudgetExhaustedError(admission.detail))
            return False
        return True

    def check_output(
        self, settler: DeliverySettler, delivery: LeasedDelivery, outputs: Sequence[EmittedOutput]
    ) -> bool:
        """The worker's own output byte limit; False when it failed the task."""
        limit = self.byte_limits.max_output_bytes
        if limit is None:
            return True
        size = output_bytes(outputs)
        if size <= limit:
            return True
        settler.fail(
            delivery,
            BudgetExhaustedError(
                f"budget_exhausted: output of {size} bytes exceeds the worker's "
                f"max_output_bytes {limit}",
                field="max_output_bytes",
                limit=limit,
            ),
        )
        return False
