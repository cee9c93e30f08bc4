"""Run lifecycle of the SQL store: create, read, start, finalise, cancel, reopen."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from dagwerk.backends.requests import (
    check_limit,
    check_rerun_indices,
    check_run_definition,
    check_string,
    check_terminal_request,
)
from dagwerk.constants import (
    RUN_RETRYABLE_STATUSES,
    RUN_TERMINAL_STATUSES,
    FailurePolicy,
    NodeDisposition,
    RunStatus,
    TaskStatus,
)
from dagwerk.models import DagNode
from dagwerk.store import (
    NodeLaunchRef,
    RerunRefusedError,
    RunActivity,
    RunRecord,
    RunReopenResult,
    TaskAttemptRef,
)
from dagwerk.topology import RunTopology
from dagwerk.transitions import check_run_transition, check_task_transition

from ._base import UNFINISHED, SqlStoreBase, dumps
from .gateway import Row, Tx

_FAILED_RUN_TASK = {RunStatus.FAILED: TaskStatus.FAILED, RunStatus.CRASHED: TaskStatus.CRASHED}
_UNFINISHED_VALUES = json.dumps([status.value for status in UNFINISHED])
# Cancelling unfinished work is done in bulk; the table must allow each edge.
for _status in UNFINISHED:
    check_task_transition(_status, TaskStatus.CANCELLED)


class RunsMixin(SqlStoreBase):
    def create_run(
        self,
        run_id: str,
        nodes: Sequence[DagNode],
        *,
        run_input: Mapping[str, object] | None = None,
        failure_policy: FailurePolicy | str = FailurePolicy.FAIL_FAST,
        pipeline: str | None = None,
    ) -> bool:
        """Store a PENDING run with validated copies of its nodes and frozen input.

        False (no change) if the id exists. The graph itself is validated by
        ``start_run`` (OR-01), so an invalid graph can be stored but never starts.
        """
        rows = self.run_rows(
            run_id, nodes, run_input=run_input, failure_policy=failure_policy, pipeline=pipeline
        )
        with self._gw.write() as tx:
            return self.insert_run(tx, rows)

    def run_rows(
        self,
        run_id: str,
        nodes: Sequence[DagNode],
        *,
        run_input: Mapping[str, object] | None,
        failure_policy: FailurePolicy | str,
        pipeline: str | None,
    ) -> dict[str, object]:
        """``create_run``'s checks; the parameters of its ``run_insert`` (but ``now``)."""
        definition = check_run_definition(
            run_id,
            nodes,
            run_input=run_input,
            failure_policy=failure_policy,
            pipeline=pipeline,
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
            "pipeline": pipeline,
        }

    def insert_run(self, tx: Tx, rows: Mapping[str, object]) -> bool:
        """Insert a PENDING run from :meth:`run_rows` in ``tx``; False (nothing
        written) if its ID exists."""
        if tx.run("run_insert", {**rows, "now": self._now()}) != 1:
            return False
        count = rows["node_count"]
        assert isinstance(count, int)
        tx.many("node_insert", ({"run_id": rows["run_id"], "node_index": i} for i in range(count)))
        return True

    def get_run_status(self, run_id: str) -> RunStatus | None:
        row = self._read_one("run_status", {"run_id": run_id})
        return None if row is None else RunStatus(row["status"])

    def get_run_nodes(self, run_id: str) -> list[DagNode] | None:
        with self._gw.read() as tx:
            row = tx.one("run_get", {"run_id": run_id})
            if row is None:
                return None
            return [node.model_copy() for node in self._nodes(row)]

    def get_run_topology(self, run_id: str) -> RunTopology | None:
        # Runs are never deleted and their nodes never change, so a cached
        # topology needs no read at all.
        topology = self._topologies.get(run_id)
        if topology is not None:
            return topology
        with self._gw.read() as tx:
            row = tx.one("run_get", {"run_id": run_id})
            return None if row is None else self._topology(row)

    def get_run_node(self, run_id: str, node_index: int) -> DagNode | None:
        nodes = self._nodes_cache.get(run_id)
        if nodes is None:
            with self._gw.read() as tx:
                row = tx.one("run_get", {"run_id": run_id})
                if row is None:
                    return None
                nodes = self._nodes(row)
        if type(node_index) is not int or not 0 <= node_index < len(nodes):
            return None
        return nodes[node_index].model_copy()

    def get_run_failure_policy(self, run_id: str) -> FailurePolicy | None:
        # Written once by create_run and never updated, so it is cached.
        policy = self._policies.get(run_id)
        if policy is None:
            record = self.get_run(run_id)
            if record is None:
                return None
            policy = self._policies[run_id] = FailurePolicy(record.failure_policy)
        return policy

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._gw.read() as tx:
            row = tx.one("run_record", {"run_id": run_id})
            return None if row is None else run_record(row)

    def list_runs(self, *, status: RunStatus | None = None, limit: int = 50) -> list[RunRecord]:
        check_limit(limit)
        wanted = None if status is None else RunStatus(status).value
        with self._gw.read() as tx:
            rows = tx.all("runs_list", {"status": wanted, "limit": limit})
            return [run_record(row) for row in rows]

    def get_run_activity(self, run_id: str) -> RunActivity | None:
        with self._gw.read() as tx:
            if tx.one("run_status", {"run_id": run_id}) is None:
                return None
            counts = {
                row["status"]: row["n"] for row in tx.all("task_status_counts", {"run_id": run_id})
            }
            # Failed launches and failed tasks in one query (the nodes of
            # both are the failed nodes): launches by node, tasks by creation.
            rows = tx.all("run_failures", {"run_id": run_id})
            failed_launches = tuple(
                NodeLaunchRef(row["id"], row["node_index"], row["generation"])
                for row in sorted(
                    (row for row in rows if row["kind"] == "launch"),
                    key=lambda row: row["node_index"],
                )
            )
            failed: list[TaskAttemptRef] = []
            crashed: list[TaskAttemptRef] = []
            for row in sorted((row for row in rows if row["kind"] == "task"), key=_seq):
                ref = TaskAttemptRef(row["id"], row["attempt_id"])
                (failed if row["status"] == TaskStatus.FAILED.value else crashed).append(ref)
            return RunActivity(
                queued=counts.get(TaskStatus.QUEUED.value, 0),
                running=counts.get(TaskStatus.RUNNING.value, 0),
                waiting=counts.get(TaskStatus.WAITING.value, 0),
                failed_nodes=frozenset(row["node_index"] for row in rows),
                failed_launches=failed_launches,
                failed_tasks=tuple(failed),
                crashed_tasks=tuple(crashed),
            )

    def try_start_run(self, run_id: str) -> bool:
        with self._gw.write() as tx:
            row = tx.one("run_status", {"run_id": run_id})
            if row is None:
                return False
            status = RunStatus(row["status"])
            if status is RunStatus.RUNNING:
                return True
            if status is not RunStatus.PENDING:
                return False
            check_run_transition(status, RunStatus.RUNNING)
            tx.run("run_set_status", {"run_id": run_id, "old": status.value, "new": "running"})
            return True

    # -- terminal transitions ------------------------------------------------------

    def try_finalize_run(
        self,
        run_id: str,
        status: RunStatus,
        *,
        cause: TaskAttemptRef | NodeLaunchRef | None = None,
        reason: str | None = None,
    ) -> bool:
        status = check_terminal_request(status, cause, reason)
        with self._gw.write() as tx:
            run = tx.one("run_get", {"run_id": run_id})
            if run is None or RunStatus(run["status"]) in RUN_TERMINAL_STATUSES:
                return False
            if status is RunStatus.COMPLETED:
                if run["status"] != RunStatus.RUNNING.value or not self._can_complete(tx, run):
                    return False
                error = None
            elif cause is not None:
                found = self._cause_error(tx, run, status, cause)
                if found is None:
                    return False
                error = found
            else:
                error = reason
            self._terminate(tx, run, status, error)
            return True

    def try_cancel_run(self, run_id: str, reason: str | None = None) -> bool:
        if reason is not None:
            check_string(reason, "reason")
        with self._gw.write() as tx:
            run = tx.one("run_get", {"run_id": run_id})
            if run is None or run["status"] not in ("pending", "running"):
                return False
            self._terminate(tx, run, RunStatus.CANCELLED, reason)
            return True

    @staticmethod
    def _can_complete(tx: Tx, run: Row) -> bool:
        # OR-09: an active launch for exactly every stored node, all complete,
        # none failed.
        row = tx.one("launch_completion_summary", {"run_id": run["run_id"]})
        assert row is not None  # an aggregate always returns one row
        return bool(row["active"] == run["node_count"] == row["good"])

    def _cause_error(
        self, tx: Tx, run: Row, status: RunStatus, cause: TaskAttemptRef | NodeLaunchRef
    ) -> str | None:
        """The persisted error of a still-current cause, else ``None`` (OR-10, OR-11)."""
        if isinstance(cause, NodeLaunchRef):
            launch = tx.one(
                "launch_active", {"run_id": run["run_id"], "node_index": cause.node_index}
            )
            if (
                status is not RunStatus.FAILED
                or launch is None
                or launch["launch_id"] != cause.launch_id
                or launch["generation"] != cause.generation
                or launch["disposition"] != NodeDisposition.FAILED.value
            ):
                return None
            error: str = launch["error"]
            return error
        task = self._task(tx, cause.task_id)
        if task is None or task["run_id"] != run["run_id"] or not task["owned"]:
            return None
        if (
            task["attempt_id"] != cause.attempt_id
            or task["status"] != _FAILED_RUN_TASK[status].value
        ):
            return None
        return task["error"] if task["error"] is not None else ""

    def _stop_active_tasks(self, tx: Tx, run_id: str, node_index: int | None) -> None:
        """Invalidate active waits, cancel unfinished tasks and drop the outbox
        rows of the run's active tasks (of one node when ``node_index`` is set)."""
        params = {
            "run_id": run_id,
            "node_index": node_index,
            "unfinished": _UNFINISHED_VALUES,
            "now": self._now(),
        }
        tx.run("waits_invalidate_active", params)
        tx.run("tasks_clear_active_wait", params)
        tx.run("tasks_cancel_unfinished", params)
        tx.run("deliveries_drop_active", params)

    def _terminate(self, tx: Tx, run: Row, status: RunStatus, error: str | None) -> None:
        old = RunStatus(run["status"])
        check_run_transition(old, status)
        # Waits are invalidated and unfinished work cancelled in the same
        # commit as the terminal status, so nothing is stranded (OR-12).
        self._stop_active_tasks(tx, run["run_id"], None)
        tx.run(
            "run_terminate",
            {
                "run_id": run["run_id"],
                "old": old.value,
                "new": status.value,
                "error": error,
                "now": self._now(),
            },
        )
        # Resume a waiting parent and cancel descendants in this same commit.
        self._after_terminate(tx, run, status, error)

    # -- run retry -------------------------------------------------------------------

    def try_reopen_run(
        self, run_id: str, boundary_indices: tuple[int, ...] | None
    ) -> RunReopenResult | None:
        with self._gw.write() as tx:
            run = tx.one("run_get", {"run_id": run_id})
            if run is None:
                return None
            old = RunStatus(run["status"])
            if old not in RUN_RETRYABLE_STATUSES:
                return None
            count = run["node_count"]
            launches = {
                row["node_index"]: row for row in tx.all("launches_active", {"run_id": run_id})
            }
            if boundary_indices is not None:
                if old not in (RunStatus.FAILED, RunStatus.CRASHED):
                    return None
                boundary = tuple(boundary_indices)
                if not boundary:
                    return None
                failed_nodes = self._failed_nodes(tx, run_id)
                for index in boundary:
                    if type(index) is not int or not 0 <= index < count:
                        return None
                    if index not in launches or index not in failed_nodes:
                        return None
            topology = self._topology(run)
            # RT-05: the store derives the affected set from every unsuccessful
            # active launch; the boundary above is only an assertion.
            roots = [
                index
                for index, launch in launches.items()
                if not _complete(launch)
                or launch["disposition"]
                in (NodeDisposition.FAILED.value, NodeDisposition.UPSTREAM_FAILED.value)
            ]
            affected = sorted(topology.downstream_closure(roots)) if roots else []
            for index in affected:
                self._invalidate_node(tx, run_id, index)
            check_run_transition(old, RunStatus.RUNNING)
            tx.run("run_reopen", {"run_id": run_id, "old": old.value})
            rows = tx.all("nodes_of_run", {"run_id": run_id})
            generations = {row["node_index"]: row["generation"] for row in rows}
            return RunReopenResult(
                affected_nodes=tuple(affected),
                retry_count=run["retry_count"] + 1,
                generations={index: generations[index] for index in affected},
            )

    def try_rerun_nodes(self, run_id: str, node_indices: tuple[int, ...]) -> RunReopenResult | None:
        with self._gw.write() as tx:
            run = tx.one("run_get", {"run_id": run_id})
            if run is None or run["status"] == RunStatus.PENDING.value:
                return None
            indices = check_rerun_indices(node_indices, run["node_count"])
            if indices is None:
                return None
            affected = sorted(self._topology(run).downstream_closure(list(indices)))
            running = tx.all(
                "tasks_running_in_nodes", {"run_id": run_id, "nodes": json.dumps(affected)}
            )
            if running:
                raise RerunRefusedError(
                    f"node {running[0]['node_index']} has a running task "
                    f"{running[0]['task_id']!r}; stop it before re-running",
                    field="node_indices",
                )
            for index in affected:
                self._invalidate_node(tx, run_id, index)
            old = RunStatus(run["status"])
            if old is not RunStatus.RUNNING:
                check_run_transition(old, RunStatus.RUNNING)
            tx.run("run_rerun", {"run_id": run_id})
            rows = tx.all("nodes_of_run", {"run_id": run_id})
            generations = {row["node_index"]: row["generation"] for row in rows}
            return RunReopenResult(
                affected_nodes=tuple(affected),
                retry_count=run["retry_count"] + 1,
                generations={index: generations[index] for index in affected},
            )

    def _invalidate_node(self, tx: Tx, run_id: str, index: int) -> None:
        """Retire the node's active generation as a unit (RT-06)."""
        self._stop_active_tasks(tx, run_id, index)
        params = {"run_id": run_id, "node_index": index}
        tx.run("tasks_invalidate_node", params)
        tx.run("launch_deactivate", params)
        # The IDs stay reserved; the outputs stop resolving (TI-03).
        tx.run("outputs_invalidate_node", params)
        tx.run("node_advance_generation", params)


def run_record(row: Row) -> RunRecord:
    return RunRecord(
        run_id=row["run_id"],
        status=RunStatus(row["status"]),
        failure_policy=FailurePolicy(row["failure_policy"]),
        retry_count=row["retry_count"],
        error=row["error"],
        node_count=row["node_count"],
        settled_nodes=row["settled_nodes"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        pipeline=row["pipeline"],
    )


def _seq(row: Row) -> int:
    seq: int = row["seq"]
    return seq


def _complete(launch: Row) -> bool:
    return bool(
        launch["disposition"] != NodeDisposition.LAUNCHED.value
        or launch["completed"] == launch["task_count"]
    )
