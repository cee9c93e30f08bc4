"""Attempt fencing of the in-memory store: claim, complete, fail, crash, wait,
resume, recover and task retry, plus the task and outbox views."""

from __future__ import annotations

import dataclasses

from dagwerk.backends.requests import check_string
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.errors import PlanningError
from dagwerk.json import JsonValue, bounded_json_size, freeze_json
from dagwerk.models import EmittedOutput, OutputRef, ResolvedOutput
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
    TaskResumeResult,
    TaskWaitResult,
    WaitRecord,
    validate_output_batch_routing_size,
    validate_output_batch_size,
    validate_seconds,
    validate_wait_id,
)

from ._base import MemoryStoreBase
from ._state import OutputState, RunState, TaskState, WaitEntry, WaitState


def task_record(task: TaskState) -> TaskRecord:
    return TaskRecord(
        task_id=task.task_id,
        run_id=task.run_id,
        node_index=task.node_index,
        generation=task.generation,
        launch_id=task.launch_id,
        status=task.status,
        attempt_id=task.attempt_id,
        plan=task.plan,
        error=task.error,
        resumed_from_wait_id=task.resumed_from_wait_id,
        active_wait_id=task.active_wait_id,
        invalidated=task.invalidated,
        attempt_number=task.attempt_number,
        started_at=task.started_at,
        finished_at=task.finished_at,
    )


_OUTCOMES = frozenset(
    {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CRASHED, TaskStatus.CANCELLED}
)
LOST_ATTEMPT_ERROR = "attempt lost: its worker stopped renewing the lease"


def current_attempt(task: TaskState) -> AttemptRecord:
    return AttemptRecord(
        attempt_id=task.attempt_id,
        number=task.attempt_number,
        status=task.status if task.status in _OUTCOMES else None,
        error=task.error,
        worker_id=task.worker_id,
        resumed_from_wait_id=task.resumed_from_wait_id,
        started_at=task.started_at,
        finished_at=task.finished_at,
    )


class TasksMixin(MemoryStoreBase):
    # -- views ---------------------------------------------------------------------

    def get_task(self, task_id: str) -> TaskRecord | None:
        with self._lock:
            task = self._tasks.get(task_id)
            return None if task is None else task_record(task)

    def list_tasks(self, run_id: str, *, include_invalidated: bool = False) -> list[TaskRecord]:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return []
            tasks = (self._tasks[task_id] for task_id in run.task_ids)
            return [task_record(t) for t in tasks if include_invalidated or not t.invalidated]

    def list_attempts(self, task_id: str) -> list[AttemptRecord]:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return []
            attempts = [*task.past_attempts, current_attempt(task)]
            if not task.tracebacks:
                return attempts
            return [
                dataclasses.replace(a, traceback=task.tracebacks.get(a.attempt_id))
                for a in attempts
            ]

    def list_deliveries(self, run_id: str | None = None) -> list[Delivery]:
        with self._lock:
            return [d for d in self._deliveries.values() if run_id is None or d.run_id == run_id]

    def ack_delivery(self, delivery_id: str) -> bool:
        with self._lock:
            return self._remove_row(delivery_id) is not None

    # -- claim and recovery ----------------------------------------------------------

    def _current_in_generation(
        self, task_id: str, attempt_id: str, generation: int, status: TaskStatus
    ) -> tuple[RunState, TaskState] | None:
        task = self._tasks.get(task_id)
        if task is None or task.generation != generation:
            return None
        run = self._owned(task)
        if (
            run is None
            or run.status is not RunStatus.RUNNING
            or task.status is not status
            or task.attempt_id != attempt_id
        ):
            return None
        return run, task

    def try_claim_task(
        self, task_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskClaimResult | None:
        with self._lock:
            found = self._current_in_generation(
                task_id, expected_attempt_id, expected_generation, TaskStatus.QUEUED
            )
            if found is None:
                return None
            run, task = found
            self._set_status(run, task, TaskStatus.RUNNING)
            return TaskClaimResult(
                task_id=task.task_id,
                attempt_id=task.attempt_id,
                run_id=run.run_id,
                node_index=task.node_index,
                generation=task.generation,
                resumed_from_wait_id=task.resumed_from_wait_id,
            )

    def try_recover_task(
        self, task_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskRecoveryResult | None:
        with self._lock:
            key = (task_id, expected_attempt_id, expected_generation)
            stored = self._recoveries.get(key)
            if stored is not None:
                return stored
            found = self._current_in_generation(
                task_id, expected_attempt_id, expected_generation, TaskStatus.RUNNING
            )
            if found is None:
                return None
            run, task = found
            task.lost_deliveries += 1
            new_attempt = self._replace_attempt(
                run,
                task,
                outcome=TaskStatus.CRASHED,
                error=LOST_ATTEMPT_ERROR,
                delivery_count=min(task.lost_deliveries, self.max_deliveries),
            )
            result = TaskRecoveryResult(
                task_id=task.task_id,
                abandoned_attempt_id=expected_attempt_id,
                recovered_attempt_id=new_attempt,
                run_id=run.run_id,
                node_index=task.node_index,
                generation=task.generation,
                resumed_from_wait_id=task.resumed_from_wait_id,
            )
            self._recoveries[key] = result
            return result

    # -- completion ------------------------------------------------------------------

    def try_complete_task(
        self, task_id: str, outputs: tuple[EmittedOutput, ...], *, expected_attempt_id: str
    ) -> TaskCompletionResult | None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return None
            if task.completion is not None:
                # FN-06: an exact repeat returns the first result; its outputs
                # are ignored.
                return (
                    task.completion if task.completion.attempt_id == expected_attempt_id else None
                )
            # FN-05: ownership before any look at the outputs.
            found = self._current_running(task_id, expected_attempt_id)
            if found is None:
                return None
            run, task = found
            prepared = self._prepare_outputs(run, task, outputs)
            self._charge_completion(run, task, tuple(outputs))
            for output in prepared:
                run.reserved_ids.add(output.ref.id)
                run.outputs[output.ref.id] = output
            run.node_outputs.setdefault(task.node_index, []).extend(o.ref.id for o in prepared)
            self._set_status(run, task, TaskStatus.COMPLETED)
            launch = run.launches[task.node_index]
            launch.completed += 1
            self._bump(run, task.node_index)
            task.completion = TaskCompletionResult(
                task_id=task.task_id,
                attempt_id=task.attempt_id,
                run_id=run.run_id,
                node_index=task.node_index,
                generation=task.generation,
                launch_complete=launch.complete,
            )
            return task.completion

    def _prepare_outputs(
        self, run: RunState, task: TaskState, outputs: tuple[EmittedOutput, ...]
    ) -> list[OutputState]:
        """FN-07: validate the whole first batch before anything is written."""
        outputs = tuple(outputs)
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
        taken = [output_id for output_id in ids if output_id in run.reserved_ids]
        if taken:
            raise OutputPublicationError(
                f"output IDs already exist in this run: {taken[:5]!r}", field="outputs"
            )
        node = self._topology(run).nodes[task.node_index]
        is_root = self._task_is_root(run, task)
        limit = self.limits.max_task_completion_routing_bytes
        total = 0
        prepared: list[OutputState] = []
        for output in outputs:
            try:
                correlation = correlation_id_for_output(
                    node,
                    is_root=is_root,
                    task_correlation_id=task.plan.correlation_id,
                    output_id=output.id,
                )
            except PlanningError as exc:
                raise OutputPublicationError(
                    f"cannot derive the correlation of output {output.id!r}: {exc}",
                    field="outputs",
                ) from exc
            size = bounded_json_size(
                {"correlation_id": correlation, "fields": output.fields, "id": output.id},
                limit + 1,
            )
            total += size
            if total > limit:
                validate_output_batch_routing_size(total, limit=limit)
            prepared.append(
                OutputState(
                    ref=OutputRef.model_construct(
                        id=output.id, fields=output.fields, correlation_id=correlation
                    ),
                    resolved=ResolvedOutput.model_construct(
                        id=output.id, fields=output.fields, data=output.data
                    ),
                    node_index=task.node_index,
                    routing_size=size,
                )
            )
        return prepared

    def _task_is_root(self, run: RunState, task: TaskState) -> bool:
        return not self._topology(run).dependencies[task.node_index]

    # -- failure and crash -------------------------------------------------------------

    def _mark(
        self, task_id: str, error: str, expected_attempt_id: str, status: TaskStatus
    ) -> TaskFailureResult | None:
        with self._lock:
            check_string(error, "error")
            task = self._tasks.get(task_id)
            if task is None:
                return None
            stored = task.failure
            if stored is not None:
                # FN-10: a repeat by the same attempt replays the first result
                # (and its first error) while the task still holds it.
                if (
                    stored.attempt_id == expected_attempt_id == task.attempt_id
                    and stored.status is status
                    and task.status is status
                ):
                    return stored
                return None
            found = self._current_running(task_id, expected_attempt_id)
            if found is None:
                return None
            run, task = found
            task.error = error
            self._set_status(run, task, status)
            self._bump(run, task.node_index)
            task.failure = TaskFailureResult(
                task_id=task.task_id,
                attempt_id=task.attempt_id,
                run_id=run.run_id,
                node_index=task.node_index,
                generation=task.generation,
                status=status,
            )
            return task.failure

    def mark_task_failed(
        self, task_id: str, error: str, *, expected_attempt_id: str
    ) -> TaskFailureResult | None:
        return self._mark(task_id, error, expected_attempt_id, TaskStatus.FAILED)

    def mark_task_crashed(
        self, task_id: str, error: str, *, expected_attempt_id: str
    ) -> TaskFailureResult | None:
        return self._mark(task_id, error, expected_attempt_id, TaskStatus.CRASHED)

    def try_create_task_retry(self, task_id: str, *, expected_attempt_id: str) -> str | None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return None
            run = self._owned(task)
            if (
                run is None
                or run.status is not RunStatus.RUNNING
                or task.status is not TaskStatus.CRASHED
                or task.attempt_id != expected_attempt_id
            ):
                return None
            # The plan, generation and resumed_from_wait_id stay (WT-15).
            new_attempt = self._replace_attempt(run, task)
            self._bump(run, task.node_index)
            return new_attempt

    def try_fail_task_with_retry(
        self, task_id: str, error: str, *, expected_attempt_id: str, available_at: float
    ) -> str | None:
        check_string(error, "error")
        when = validate_seconds(available_at, "available_at", positive=False)
        with self._lock:
            found = self._current_running(task_id, expected_attempt_id)
            if found is None:
                return None
            run, task = found
            # The failure and the reservation are one commit: the task goes
            # RUNNING -> QUEUED directly, so no finaliser ever sees it FAILED.
            new_attempt = self._replace_attempt(
                run, task, outcome=TaskStatus.FAILED, error=error, available_at=when
            )
            self._bump(run, task.node_index)
            return new_attempt

    # -- waiting -------------------------------------------------------------------------

    def try_wait_task(
        self, task_id: str, wait_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskWaitResult | None:
        with self._lock:
            validate_wait_id(wait_id)
            record = self._waits.get((task_id, wait_id))
            if record is not None:
                # WT-03: an exact repeat replays; a task never reuses a wait ID.
                if (
                    record.attempt_id == expected_attempt_id
                    and record.generation == expected_generation
                ):
                    return record.result
                return None
            found = self._current_in_generation(
                task_id, expected_attempt_id, expected_generation, TaskStatus.RUNNING
            )
            if found is None:
                return None
            run, task = found
            if task.active_wait_id is not None:
                return None
            result = TaskWaitResult(
                task_id=task.task_id,
                attempt_id=task.attempt_id,
                run_id=run.run_id,
                node_index=task.node_index,
                generation=task.generation,
                wait_id=wait_id,
            )
            self._set_status(run, task, TaskStatus.WAITING)
            task.active_wait_id = wait_id
            task.wait_ids.add(wait_id)
            self._waits[(task_id, wait_id)] = WaitEntry(
                task_id=task_id,
                wait_id=wait_id,
                attempt_id=expected_attempt_id,
                generation=expected_generation,
                state=WaitState.ACTIVE,
                result=result,
                waited_at=float(self._clock()),
            )
            return result

    def get_wait_response(self, task_id: str, wait_id: str) -> JsonValue | None:
        with self._lock:
            record = self._waits.get((task_id, wait_id))
            return None if record is None else record.response

    def get_wait(self, task_id: str, wait_id: str) -> WaitRecord | None:
        with self._lock:
            entry = self._waits.get((task_id, wait_id))
            if entry is None:
                return None
            resume = entry.resume
            return WaitRecord(
                task_id=entry.task_id,
                wait_id=entry.wait_id,
                attempt_id=entry.attempt_id,
                generation=entry.generation,
                resumed_attempt_id=None if resume is None else resume.resumed_attempt_id,
                invalidated=entry.state is WaitState.INVALIDATED,
            )

    def try_resume_task(
        self,
        task_id: str,
        wait_id: str,
        *,
        expected_attempt_id: str,
        expected_generation: int,
        response: object = None,
    ) -> TaskResumeResult | None:
        frozen = freeze_json(response)
        with self._lock:
            validate_wait_id(wait_id)
            record = self._waits.get((task_id, wait_id))
            if (
                record is None
                or record.attempt_id != expected_attempt_id
                or record.generation != expected_generation
            ):
                return None
            if record.resume is not None:
                return record.resume
            if record.state is not WaitState.ACTIVE:
                # WT-07: invalidated before it was resolved.
                return None
            task = self._tasks[task_id]
            run = self._owned(task)
            if (
                run is None
                or run.status is not RunStatus.RUNNING
                or task.status is not TaskStatus.WAITING
                or task.active_wait_id != wait_id
                or task.attempt_id != expected_attempt_id
            ):
                return None
            task.active_wait_id = None
            new_attempt = self._replace_attempt(run, task, resumed_from=wait_id)
            record.state = WaitState.RESOLVED
            record.response = frozen
            record.resume = TaskResumeResult(
                task_id=task_id,
                waiting_attempt_id=expected_attempt_id,
                resumed_attempt_id=new_attempt,
                run_id=run.run_id,
                node_index=task.node_index,
                generation=task.generation,
                wait_id=wait_id,
            )
            return record.resume
