"""Composite child runs of the in-memory store (see :mod:`dagwerk.lineage`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagwerk.backends.requests import (
    check_budget,
    check_child_link,
    check_wait_link,
)
from dagwerk.budgets import Budget
from dagwerk.constants import FailurePolicy, RunStatus, TaskStatus
from dagwerk.errors import DagwerkError
from dagwerk.lineage import RunLink, child_result_payload, sink_indices
from dagwerk.models import DagNode
from dagwerk.store import TaskWaitResult

from ._budgets import BudgetsMixin
from ._state import RunState


class ChildrenMixin(BudgetsMixin):
    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self._links: dict[str, RunLink] = {}
        self._children: dict[str, list[str]] = {}

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
        check_child_link(link, run_id)
        check_budget(budget, optional=True)
        with self._lock:
            if run_id in self._runs:
                return False
            accounts = self._plan_accounts(run_id, link.parent_run_id, budget)
            self._create_child(run_id, nodes, link, run_input, failure_policy, budget, accounts)
            return True

    def _create_child(  # noqa: PLR0917 (private; mirrors the public arguments)
        self,
        run_id: str,
        nodes: Sequence[DagNode],
        link: RunLink,
        run_input: Mapping[str, object] | None,
        failure_policy: FailurePolicy | str,
        budget: Budget | None,
        accounts: tuple[str, ...],
    ) -> None:
        # create_run validates everything before it writes (re-entrant lock).
        created = self.create_run(  # type: ignore[attr-defined]
            run_id, nodes, run_input=run_input, failure_policy=failure_policy
        )
        assert created
        self._links[run_id] = link
        self._children.setdefault(link.parent_run_id, []).append(run_id)
        self._open_accounts(run_id, accounts, budget)

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
        check_wait_link(link)
        check_budget(budget, optional=True)
        with self._lock:
            task = self._tasks.get(task_id)
            if (
                task is None
                or link.parent_task_id != task_id
                or link.parent_run_id != task.run_id
                or link.run_id in self._runs
                or self._current_running(task_id, expected_attempt_id) is None
                or task.generation != expected_generation
                or task.active_wait_id is not None
                or link.wait_id in task.wait_ids
            ):
                return None
            accounts = self._plan_accounts(link.run_id, link.parent_run_id, budget)
            self._create_child(
                link.run_id, nodes, link, run_input, failure_policy, budget, accounts
            )
            # RUNNING in the same commit as the wait, so a crash before the
            # roots are launched is repaired by the backstop's reconcile.
            self._runs[link.run_id].status = RunStatus.RUNNING
            waited: TaskWaitResult | None = self.try_wait_task(  # type: ignore[attr-defined]
                task_id,
                link.wait_id,
                expected_attempt_id=expected_attempt_id,
                expected_generation=expected_generation,
            )
            assert waited is not None  # every precondition was checked above
            return waited

    def get_run_link(self, run_id: str) -> RunLink | None:
        with self._lock:
            return self._links.get(run_id)

    def list_child_runs(self, run_id: str) -> list[str]:
        with self._lock:
            return list(self._children.get(run_id, ()))

    # -- terminal hook -----------------------------------------------------------

    def _after_terminate(self, run: RunState, status: RunStatus, error: str | None) -> None:
        link = self._links.get(run.run_id)
        if link is not None and link.wait_id is not None:
            self._resume_parent(run, link, status, error)
        if status is not RunStatus.COMPLETED:
            reason = f"parent run {run.run_id!r} is {status.value}"
            for child_id in self._children.get(run.run_id, ()):
                child = self._runs[child_id]
                if child.status in (RunStatus.PENDING, RunStatus.RUNNING):
                    self._terminate(child, RunStatus.CANCELLED, reason)  # type: ignore[attr-defined]

    def _resume_parent(
        self, run: RunState, link: RunLink, status: RunStatus, error: str | None
    ) -> None:
        assert link.wait_id is not None
        task = self._tasks.get(link.parent_task_id)
        if task is None or task.status is not TaskStatus.WAITING:
            return
        if task.active_wait_id != link.wait_id:
            return
        record = self._waits[(task.task_id, link.wait_id)]
        payload = child_result_payload(run.run_id, status.value, error, self._sink_outputs(run))
        # try_resume_task re-checks the parent's run and attempt (re-entrant lock).
        self.try_resume_task(  # type: ignore[attr-defined]
            task.task_id,
            link.wait_id,
            expected_attempt_id=record.attempt_id,
            expected_generation=record.generation,
            response=payload,
        )

    def _sink_outputs(self, run: RunState) -> dict[str, list[dict[str, object]]]:
        try:
            topology = self._topology(run)
        except (DagwerkError, ValueError):
            return {}  # a graph that never validated published nothing
        found: dict[str, list[dict[str, object]]] = {}
        for index in sink_indices(topology.dependencies):
            outputs = [run.outputs[o].resolved for o in run.node_outputs.get(index, ())]
            found[run.nodes[index].slug] = [
                {"id": o.id, "fields": o.fields, "data": o.data} for o in outputs
            ]
        return found
