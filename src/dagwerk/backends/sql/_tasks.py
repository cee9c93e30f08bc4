"""Attempt fencing of the SQL store: claim, complete, fail, crash, recover and
task retry, plus the task and outbox views."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping

from dagwerk.backends.requests import check_string
from dagwerk.constants import TaskStatus
from dagwerk.errors import DagwerkError, PlanningError
from dagwerk.json import bounded_json_size
from dagwerk.models import EmittedOutput
from dagwerk.planning import correlation_id_for_output
from dagwerk.store import (
    AttemptRecord,
    Delivery,
    OutputPublicationError,
    TaskClaimResult,
    TaskCompletionResult,
    TaskFailureResult,
    TaskRecord,
    TaskRecoveryResult,
    validate_output_batch_routing_size,
    validate_output_batch_size,
    validate_seconds,
)
from dagwerk.transitions import check_task_transition

from ._base import COMPACT_ASCII_JSON, TEXT_JSON, SqlStoreBase, dumps
from ._plans import parse_plan
from .gateway import Row, Tx


def task_record(row: Row, status: TaskStatus | None = None) -> TaskRecord:
    """The task of ``row``; with ``status``, as a transition to it just left it."""
    return TaskRecord(
        task_id=row["task_id"],
        run_id=row["run_id"],
        node_index=row["node_index"],
        generation=row["generation"],
        launch_id=row["launch_id"],
        status=TaskStatus(row["status"]) if status is None else status,
        attempt_id=row["attempt_id"],
        plan=parse_plan(row["plan"]),
        error=row["error"],
        resumed_from_wait_id=row["resumed_from_wait_id"],
        active_wait_id=row["active_wait_id"],
        invalidated=bool(row["invalidated"]),
        attempt_number=row["attempt_number"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
    )


_OUTCOMES = frozenset(
    {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CRASHED, TaskStatus.CANCELLED}
)
LOST_ATTEMPT_ERROR = "attempt lost: its worker stopped renewing the lease"


def _attempt(row: Row, number: int, status: TaskStatus | None) -> AttemptRecord:
    return AttemptRecord(
        attempt_id=row["attempt_id"],
        number=number,
        status=status,
        error=row["error"],
        worker_id=row["worker_id"],
        resumed_from_wait_id=row["resumed_from_wait_id"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
    )


def delivery_record(row: Row) -> Delivery:
    return Delivery(
        delivery_id=row["delivery_id"],
        task_id=row["task_id"],
        attempt_id=row["attempt_id"],
        generation=row["generation"],
        run_id=row["run_id"],
        node_index=row["node_index"],
        launch_id=row["launch_id"],
    )


_ROUTING_FRAME = len('{"correlation_id":,"fields":,"id":}')


class OutputTexts:
    """The texts an output's completion writes, computed before the write
    transaction (they do not depend on stored state): the compact fields and
    data, and the routing size without the correlation ID's part."""

    __slots__ = ("data", "fields", "partial_size")

    def __init__(self, output: EmittedOutput) -> None:
        self.fields = dumps(output.fields)
        tail = TEXT_JSON.encode(output.id)
        self.partial_size = (
            _ROUTING_FRAME + len(self.fields.encode("utf-8")) + len(tail.encode("utf-8"))
        )
        self.data = _data_text(output)


def output_texts(outputs: Iterable[object]) -> dict[int, OutputTexts]:
    """``OutputTexts`` by ``id()`` of each output that has them; an output
    whose texts fail is left out, and its completion reports the error."""
    found: dict[int, OutputTexts] = {}
    for output in outputs:
        if isinstance(output, EmittedOutput):
            try:
                found[id(output)] = OutputTexts(output)
            except (TypeError, ValueError, DagwerkError):
                continue
    return found


def _routing_size(output: EmittedOutput, correlation: str | None, limit: int) -> tuple[int, str]:
    """The canonical JSON size of ``{"correlation_id", "fields", "id"}``, and
    the compact text of the fields.

    JSON size does not depend on key order, and the compact text of the
    fields (already bounded by the output's own validation) has the
    canonical size, so the size is measured on the text the completion writes
    anyway instead of walking the value again. A value with no JSON text
    takes the bounded walk, which raises the typed error.
    """
    wire = {"correlation_id": correlation, "fields": output.fields, "id": output.id}
    try:
        fields = dumps(output.fields)
        head = TEXT_JSON.encode(correlation)
        tail = TEXT_JSON.encode(output.id)
        text = f'{{"correlation_id":{head},"fields":{fields},"id":{tail}}}'
        return len(text.encode("utf-8")), fields
    except (TypeError, ValueError):
        bounded_json_size(wire, limit + 1)
        raise


def _data_text(output: EmittedOutput) -> str:
    try:
        return COMPACT_ASCII_JSON.encode(dict(output.data))
    except (TypeError, ValueError) as exc:
        # A durable store keeps only JSON; the reference store keeps objects.
        raise OutputPublicationError(
            f"output {output.id!r} data is not JSON-serialisable: {exc}", field="outputs"
        ) from None


class TasksMixin(SqlStoreBase):
    # -- views ---------------------------------------------------------------------

    def get_task(self, task_id: str) -> TaskRecord | None:
        with self._gw.read() as tx:
            row = self._task(tx, task_id)
            return None if row is None else task_record(row)

    def list_tasks(self, run_id: str, *, include_invalidated: bool = False) -> list[TaskRecord]:
        with self._gw.read() as tx:
            rows = tx.all("tasks_of_run", {"run_id": run_id, "all": int(include_invalidated)})
            return [task_record(row) for row in rows]

    def list_attempts(self, task_id: str) -> list[AttemptRecord]:
        with self._gw.read() as tx:
            task = self._task(tx, task_id)
            if task is None:
                return []
            past = [
                _attempt(row, row["number"], TaskStatus(row["status"]))
                for row in tx.all("attempts_of_task", {"task_id": task_id})
            ]
            status = TaskStatus(task["status"])
            outcome = status if status in _OUTCOMES else None
            attempts = [*past, _attempt(task, task["attempt_number"], outcome)]
            tracebacks = {
                row["attempt_id"]: row["traceback"]
                for row in tx.all("attempt_tracebacks_of_task", {"task_id": task_id})
            }
            if not tracebacks:
                return attempts
            return [
                dataclasses.replace(a, traceback=tracebacks.get(a.attempt_id)) for a in attempts
            ]

    def list_deliveries(self, run_id: str | None = None) -> list[Delivery]:
        with self._gw.read() as tx:
            return [delivery_record(row) for row in tx.all("deliveries_list", {"run_id": run_id})]

    def ack_delivery(self, delivery_id: str) -> bool:
        with self._gw.write() as tx:
            return tx.run("delivery_delete", {"delivery_id": delivery_id}) == 1

    # -- claim and recovery ----------------------------------------------------------

    def try_claim_task(
        self, task_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskClaimResult | None:
        with self._gw.write() as tx:
            task = self._current(
                tx, task_id, expected_attempt_id, TaskStatus.QUEUED, expected_generation
            )
            if task is None:
                return None
            self._set_status(tx, task, TaskStatus.RUNNING)
            return TaskClaimResult(
                task_id=task["task_id"],
                attempt_id=task["attempt_id"],
                run_id=task["run_id"],
                node_index=task["node_index"],
                generation=task["generation"],
                resumed_from_wait_id=task["resumed_from_wait_id"],
            )

    def try_recover_task(
        self, task_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskRecoveryResult | None:
        with self._gw.write() as tx:
            key = {
                "task_id": task_id,
                "abandoned": expected_attempt_id,
                "generation": expected_generation,
            }
            stored = tx.one("recovery_get", key)
            if stored is not None:
                return _recovery(stored)
            task = self._current(
                tx, task_id, expected_attempt_id, TaskStatus.RUNNING, expected_generation
            )
            if task is None:
                return None
            lost = task["lost_deliveries"] + 1
            new_attempt = self._replace_attempt(
                tx,
                task,
                outcome=TaskStatus.CRASHED,
                error=LOST_ATTEMPT_ERROR,
                delivery_count=min(lost, self.max_deliveries),
                lost_deliveries=lost,
            )
            tx.run("recovery_insert", {**key, "recovered": new_attempt})
            stored = tx.one("recovery_get", key)
            assert stored is not None
            return _recovery(stored)

    # -- completion ------------------------------------------------------------------

    def try_complete_task(
        self, task_id: str, outputs: tuple[EmittedOutput, ...], *, expected_attempt_id: str
    ) -> TaskCompletionResult | None:
        with self._gw.write() as tx:
            return self._complete(tx, task_id, tuple(outputs), expected_attempt_id)

    def _complete(
        self, tx: Tx, task_id: str, outputs: tuple[EmittedOutput, ...], expected_attempt_id: str
    ) -> TaskCompletionResult | None:
        """``try_complete_task`` in the caller's transaction. A refusal raises
        before this completion wrote anything."""
        task = self._task(tx, task_id, completing=True)
        if task is None:
            return None
        if task["completed_attempt_id"] is not None:
            # FN-06: an exact repeat returns the first result; its outputs
            # are ignored.
            if task["completed_attempt_id"] != expected_attempt_id:
                return None
            return completion_result(task, bool(task["completed_launch_complete"]))
        # FN-05: ownership before any look at the outputs.
        if not self._matches(task, expected_attempt_id, TaskStatus.RUNNING, None):
            return None
        prepared = self._prepare_outputs(tx, task, tuple(outputs))
        self._charge_completion(tx, task, tuple(outputs))
        if prepared:
            tx.many("output_insert", prepared)
        check_task_transition(TaskStatus.RUNNING, TaskStatus.COMPLETED)
        # The counter was read with the task, under the lock every write of
        # it takes (see _write_completions): no answer needed.
        tx.many("launch_count_completion", [{"launch_id": task["launch_id"]}])
        complete = task["launch_completed"] + 1 == task["launch_task_count"]
        tx.run(
            "task_complete",
            {
                "task_id": task_id,
                "attempt_id": expected_attempt_id,
                "launch_complete": int(complete),
                "now": self._now(),
            },
        )
        self._bump(tx, task["run_id"], task["node_index"])
        return completion_result(task, complete)

    def _prepare_outputs(
        self,
        tx: Tx,
        task: Row,
        outputs: tuple[EmittedOutput, ...],
        reserved: set[str] | None = None,
        texts: Mapping[int, OutputTexts] | None = None,
    ) -> list[dict[str, object]]:
        """FN-07: validate the whole first batch before anything is written.
        ``reserved`` holds the run's taken output IDs among those a batch
        asked about (otherwise they are read here)."""
        # The count is checked before any routing size is computed.
        validate_output_batch_size(len(outputs), limit=self.limits.max_outputs_per_task_completion)
        for output in outputs:
            if not isinstance(output, EmittedOutput):
                raise OutputPublicationError(
                    "task completion outputs must be EmittedOutput values", field="outputs"
                )
        ids = [output.id for output in outputs]
        if len(set(ids)) != len(ids):
            raise OutputPublicationError(
                "a task completion contains duplicate output IDs", field="outputs"
            )
        if not outputs:
            return []
        run_id = task["run_id"]
        if reserved is None:
            reserved = {
                row["output_id"]
                for row in tx.all("outputs_reserved", {"run_id": run_id, "ids": json.dumps(ids)})
            }
        taken = [output_id for output_id in ids if output_id in reserved]
        if taken:
            raise OutputPublicationError(
                f"output IDs already exist in this run: {taken[:5]!r}", field="outputs"
            )
        # The task's read locked the run already (no prelude here: a
        # completion must not ask for a stronger lock); the topology is cached.
        topology = self._topologies.get(run_id)
        if topology is None:
            run = tx.one("run_get_locked", {"run_id": run_id})
            assert run is not None
            topology = self._topology(run)
        node = topology.nodes[task["node_index"]]
        is_root = not topology.dependencies[task["node_index"]]
        plan_correlation = parse_plan(task["plan"]).correlation_id
        limit = self.limits.max_task_completion_routing_bytes
        total = 0
        prepared: list[dict[str, object]] = []
        for output in outputs:
            try:
                correlation = correlation_id_for_output(
                    node,
                    is_root=is_root,
                    task_correlation_id=plan_correlation,
                    output_id=output.id,
                )
            except PlanningError as exc:
                raise OutputPublicationError(
                    f"cannot derive the correlation of output {output.id!r}: {exc}",
                    field="outputs",
                ) from exc
            known = None if texts is None else texts.get(id(output))
            if known is not None:
                head = TEXT_JSON.encode(correlation)
                size, fields, data = (
                    known.partial_size + len(head.encode()),
                    known.fields,
                    known.data,
                )
            else:
                size, fields = _routing_size(output, correlation, limit)
                data = _data_text(output)
            total += size
            if total > limit:
                validate_output_batch_routing_size(total, limit=limit)
            prepared.append(
                {
                    "run_id": run_id,
                    "output_id": output.id,
                    "node_index": task["node_index"],
                    "fields": fields,
                    "data": data,
                    "correlation_id": correlation,
                    "routing_size": size,
                }
            )
        return prepared

    # -- failure and crash -------------------------------------------------------------

    def _mark(
        self, task_id: str, error: str, expected_attempt_id: str, status: TaskStatus
    ) -> TaskFailureResult | None:
        check_string(error, "error")
        with self._gw.write() as tx:
            task = self._task(tx, task_id)
            if task is None:
                return None
            if task["failure_attempt_id"] is not None:
                # FN-10: a repeat by the same attempt replays the first result
                # (and its first error) while the task still holds it.
                if (
                    task["failure_attempt_id"] == expected_attempt_id == task["attempt_id"]
                    and task["failure_status"] == status.value
                    and task["status"] == status.value
                ):
                    return _failure(task, status)
                return None
            task = self._current(tx, task_id, expected_attempt_id, TaskStatus.RUNNING, None)
            if task is None:
                return None
            check_task_transition(TaskStatus.RUNNING, status)
            tx.run(
                "task_mark_failure",
                {
                    "task_id": task_id,
                    "attempt_id": expected_attempt_id,
                    "status": status.value,
                    "error": error,
                    "now": self._now(),
                },
            )
            self._bump(tx, task["run_id"], task["node_index"])
            return _failure(task, status)

    def mark_task_failed(
        self, task_id: str, error: str, *, expected_attempt_id: str
    ) -> TaskFailureResult | None:
        return self._mark(task_id, error, expected_attempt_id, TaskStatus.FAILED)

    def mark_task_crashed(
        self, task_id: str, error: str, *, expected_attempt_id: str
    ) -> TaskFailureResult | None:
        return self._mark(task_id, error, expected_attempt_id, TaskStatus.CRASHED)

    def try_create_task_retry(self, task_id: str, *, expected_attempt_id: str) -> str | None:
        with self._gw.write() as tx:
            task = self._current(tx, task_id, expected_attempt_id, TaskStatus.CRASHED, None)
            if task is None:
                return None
            # The plan, generation and resumed_from_wait_id stay (WT-15).
            new_attempt = self._replace_attempt(tx, task)
            self._bump(tx, task["run_id"], task["node_index"])
            return new_attempt

    def try_fail_task_with_retry(
        self, task_id: str, error: str, *, expected_attempt_id: str, available_at: float
    ) -> str | None:
        check_string(error, "error")
        when = validate_seconds(available_at, "available_at", positive=False)
        with self._gw.write() as tx:
            task = self._current(tx, task_id, expected_attempt_id, TaskStatus.RUNNING, None)
            if task is None:
                return None
            # The failure and the reservation are one commit: the task goes
            # RUNNING -> QUEUED directly, so no finaliser ever sees it FAILED.
            new_attempt = self._replace_attempt(
                tx, task, outcome=TaskStatus.FAILED, error=error, available_at=when
            )
            self._bump(tx, task["run_id"], task["node_index"])
            return new_attempt


def completion_result(task: Row, launch_complete: bool) -> TaskCompletionResult:
    return TaskCompletionResult(
        task_id=task["task_id"],
        attempt_id=task["attempt_id"],
        run_id=task["run_id"],
        node_index=task["node_index"],
        generation=task["generation"],
        launch_complete=launch_complete,
    )


def _failure(task: Row, status: TaskStatus) -> TaskFailureResult:
    return TaskFailureResult(
        task_id=task["task_id"],
        attempt_id=task["attempt_id"],
        run_id=task["run_id"],
        node_index=task["node_index"],
        generation=task["generation"],
        status=status,
    )


def _recovery(row: Row) -> TaskRecoveryResult:
    return TaskRecoveryResult(
        task_id=row["task_id"],
        abandoned_attempt_id=row["abandoned_attempt_id"],
        recovered_attempt_id=row["recovered_attempt_id"],
        run_id=row["run_id"],
        node_index=row["node_index"],
        generation=row["generation"],
        resumed_from_wait_id=row["resumed_from_wait_id"],
    )
