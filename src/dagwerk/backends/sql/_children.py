"""Composite child runs of the SQL store (see :mod:`dagwerk.lineage`).

A child run is an ordinary run plus a ``dagwerk_run_links`` row. Its
terminal transition (in ``_terminate``) resumes the waiting parent task with
the child's result and, unless it completed, cancels its unfinished
children, all in the transition's own transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from dagwerk.backends.requests import (
    check_budget,
    check_child_link,
    check_run_definition,
    check_wait_link,
)
from dagwerk.budgets import Budget
from dagwerk.constants import FailurePolicy, RunStatus, TaskStatus
from dagwerk.errors import DagwerkError
from dagwerk.json import freeze_json
from dagwerk.lineage import RunLink, child_result_payload, sink_indices
from dagwerk.models import DagNode
from dagwerk.store import InvalidStoreValueError, TaskWaitResult, validate_wait_id

from ._base import dumps, loads_value
from ._budgets import BudgetsMixin
from .gateway import Row, Tx


def _link(row: Row) -> RunLink:
    return RunLink(
        run_id=row["run_id"],
        parent_run_id=row["parent_run_id"],
        parent_task_id=row["parent_task_id"],
        root_run_id=row["root_run_id"],
        lineage=row["lineage"],
        wait_id=row["wait_id"],
    )


class ChildrenMixin(BudgetsMixin):
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
        dumped = self._child_definition(run_id, nodes, run_input, failure_policy)
        with self._gw.write() as tx:
            if tx.one("run_status", {"run_id": run_id}) is not None:
                return False
            accounts = self._plan_accounts(tx, run_id, link.parent_run_id, budget)
            self._insert_child(tx, link, dumped)
            self._open_accounts(tx, run_id, accounts, budget)
            return True

    def _child_definition(
        self,
        run_id: str,
        nodes: Sequence[DagNode],
        run_input: Mapping[str, object] | None,
        failure_policy: FailurePolicy | str,
    ) -> dict[str, object]:
        """Validate the definition exactly like ``create_run`` does; the insert
        parameters of the run row."""
        definition = check_run_definition(
            run_id,
            nodes,
            run_input=run_input,
            failure_policy=failure_policy,
            pipeline=None,
            limits=self.limits,
        )
        dumped = [node.model_dump(mode="json") for node in definition.nodes]
        return {
            "run_id": run_id,
            "nodes": json.dumps(dumped, separators=(",", ":")),
            "run_input": dumps(definition.run_input),
            "failure_policy": definition.failure_policy.value,
            "node_count": len(dumped),
            "queue": self.default_queue,
            "priority": self.default_priority,
        }

    def _insert_child(self, tx: Tx, link: RunLink, prepared: Mapping[str, object]) -> None:
        # A child run records no pipeline name: its parent's run has it.
        inserted = tx.run("run_insert", {**prepared, "now": self._now(), "pipeline": None})
        if inserted != 1:
            raise InvalidStoreValueError(f"run {link.run_id!r} exists", field="run_id")
        tx.many(
            "node_insert",
            (
                {"run_id": link.run_id, "node_index": index}
                for index in range(int(str(prepared["node_count"])))
            ),
        )
        tx.run(
            "child_link_insert",
            {
                "run_id": link.run_id,
                "parent_run_id": link.parent_run_id,
                "parent_task_id": link.parent_task_id,
                "root_run_id": link.root_run_id,
                "wait_id": link.wait_id,
                "lineage": link.lineage,
            },
        )

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
        wait_id = check_wait_link(link)
        validate_wait_id(wait_id)
        check_budget(budget, optional=True)
        prepared = self._child_definition(link.run_id, nodes, run_input, failure_policy)
        with self._gw.write() as tx:
            task = self._current(
                tx, task_id, expected_attempt_id, TaskStatus.RUNNING, expected_generation
            )
            if (
                task is None
                or link.parent_task_id != task_id
                or link.parent_run_id != task["run_id"]
                or task["active_wait_id"] is not None
                or tx.one("child_wait_used", {"task_id": task_id, "wait_id": link.wait_id})
                or tx.one("run_status", {"run_id": link.run_id}) is not None
            ):
                return None
            accounts = self._plan_accounts(tx, link.run_id, link.parent_run_id, budget)
            self._insert_child(tx, link, prepared)
            self._open_accounts(tx, link.run_id, accounts, budget)
            # The child is RUNNING from this commit on: a worker that dies
            # before launching its roots leaves a RUNNING run, which every
            # backstop pass reconciles, never a PENDING child nobody starts.
            tx.run("run_set_status", {"run_id": link.run_id, "old": "pending", "new": "running"})
            self._set_status(tx, task, TaskStatus.WAITING)
            tx.run("task_set_active_wait", {"task_id": task_id, "wait_id": link.wait_id})
            tx.run(
                "wait_insert",
                {
                    # The wait's start, committed with it (the wait timeout's origin).
                    "waited_at": self._now(),
                    "task_id": task_id,
                    "wait_id": link.wait_id,
                    "attempt_id": expected_attempt_id,
                    "generation": expected_generation,
                },
            )
            return TaskWaitResult(
                task_id=task_id,
                attempt_id=expected_attempt_id,
                run_id=task["run_id"],
                node_index=task["node_index"],
                generation=expected_generation,
                wait_id=wait_id,
            )

    def get_run_link(self, run_id: str) -> RunLink | None:
        with self._gw.read() as tx:
            row = tx.one("child_link_get", {"run_id": run_id})
            return None if row is None else _link(row)

    def list_child_runs(self, run_id: str) -> list[str]:
        with self._gw.read() as tx:
            return [row["run_id"] for row in tx.all("child_runs_of", {"run_id": run_id})]

    # -- terminal hook -----------------------------------------------------------

    def _after_terminate(self, tx: Tx, run: Row, status: RunStatus, error: str | None) -> None:
        row = tx.one("child_link_get", {"run_id": run["run_id"]})
        if row is not None and row["wait_id"] is not None:
            self._resume_parent(tx, run, _link(row), status, error)
        if status is RunStatus.COMPLETED:
            return
        reason = f"parent run {run['run_id']!r} is {status.value}"
        for child in tx.all("child_runs_of", {"run_id": run["run_id"]}):
            if child["status"] not in (RunStatus.PENDING.value, RunStatus.RUNNING.value):
                continue
            child_run = tx.one("run_get", {"run_id": child["run_id"]})
            if child_run is not None and child_run["status"] in ("pending", "running"):
                self._terminate(tx, child_run, RunStatus.CANCELLED, reason)  # type: ignore[attr-defined]

    def _resume_parent(
        self, tx: Tx, run: Row, link: RunLink, status: RunStatus, error: str | None
    ) -> None:
        assert link.wait_id is not None
        record = tx.one("wait_get", {"task_id": link.parent_task_id, "wait_id": link.wait_id})
        if record is None or record["state"] != "active":
            return
        task = self._current(
            tx,
            link.parent_task_id,
            record["attempt_id"],
            TaskStatus.WAITING,
            record["generation"],
        )
        if task is None or task["active_wait_id"] != link.wait_id:
            return
        payload = child_result_payload(
            run["run_id"], status.value, error, self._sink_outputs(tx, run)
        )
        new_attempt = self._replace_attempt(
            tx, task, resumed_from=link.wait_id, outcome=TaskStatus.WAITING
        )
        tx.run(
            "wait_resolve",
            {
                "task_id": link.parent_task_id,
                "wait_id": link.wait_id,
                "resumed_attempt_id": new_attempt,
                "response": dumps(freeze_json(payload)),
            },
        )

    def _sink_outputs(self, tx: Tx, run: Row) -> dict[str, list[dict[str, object]]]:
        try:
            topology = self._topology(run)
        except (DagwerkError, ValueError):
            return {}  # a graph that never validated published nothing
        nodes = self._nodes(run)
        found: dict[str, list[dict[str, object]]] = {}
        for index in sink_indices(topology.dependencies):
            rows = tx.all("child_outputs_of_node", {"run_id": run["run_id"], "node_index": index})
            found[nodes[index].slug] = [
                {
                    "id": row["output_id"],
                    "fields": json.loads(row["fields"]),
                    "data": loads_value(row["data"]),
                }
                for row in rows
            ]
        return found
