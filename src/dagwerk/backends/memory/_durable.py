"""Durable task records of the in-memory store: steps, and the journal of a
task's steps, waits and child runs (see :mod:`dagwerk.store_durable`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagwerk.constants import TaskStatus
from dagwerk.json import freeze_json
from dagwerk.store import (
    StepRecord,
    TaskChildRecord,
    TaskJournal,
    TaskWaitEntry,
    validate_step_name,
)

from ._children import ChildrenMixin
from ._state import TaskState, WaitEntry, WaitState
from ._tasks import TasksMixin


def _wait_entry(entry: WaitEntry) -> TaskWaitEntry:
    resume = entry.resume
    return TaskWaitEntry(
        wait_id=entry.wait_id,
        attempt_id=entry.attempt_id,
        generation=entry.generation,
        resumed_attempt_id=None if resume is None else resume.resumed_attempt_id,
        invalidated=entry.state is WaitState.INVALIDATED,
        response=entry.response,
        waited_at=entry.waited_at,
    )


class DurableMixin(ChildrenMixin, TasksMixin):
    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        # task_id -> its steps by name, in the order they were recorded.
        self._steps: dict[str, dict[str, StepRecord]] = {}

    def try_record_step(
        self,
        task_id: str,
        name: str,
        result: object,
        *,
        expected_attempt_id: str,
        expected_generation: int,
    ) -> StepRecord | None:
        validate_step_name(name)
        frozen = freeze_json(result)
        with self._lock:
            found = self._current_in_generation(
                task_id, expected_attempt_id, expected_generation, TaskStatus.RUNNING
            )
            if found is None:
                return None
            steps = self._steps.setdefault(task_id, {})
            record = steps.get(name)
            if record is None:
                record = steps[name] = StepRecord(
                    task_id=task_id,
                    name=name,
                    generation=expected_generation,
                    attempt_id=expected_attempt_id,
                    result=frozen,
                    position=len(steps),
                    recorded_at=float(self._clock()),
                )
            return record

    def get_task_journal(self, task_id: str) -> TaskJournal | None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return None
            waits = [entry for key, entry in self._waits.items() if key[0] == task_id]
            return self._journal(task, waits)

    def list_run_journals(self, run_id: str) -> Mapping[str, TaskJournal]:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return {}
            waits: dict[str, list[WaitEntry]] = {}
            for (task_id, _), entry in self._waits.items():
                waits.setdefault(task_id, []).append(entry)
            return {
                task_id: self._journal(self._tasks[task_id], waits.get(task_id, []))
                for task_id in run.task_ids
                if task_id in self._steps or task_id in waits
            }

    def _journal(self, task: TaskState, waits: list[WaitEntry]) -> TaskJournal:
        # Stable: waits entered at the same store time keep their order.
        waits = sorted(waits, key=lambda entry: entry.waited_at)
        children = []
        for child_id in self._children.get(task.run_id, ()):
            link = self._links[child_id]
            if link.parent_task_id != task.task_id:
                continue
            child = self._runs[child_id]
            children.append(
                TaskChildRecord(
                    run_id=child_id,
                    lineage=link.lineage,
                    run_input=child.run_input,
                    status=child.status,
                )
            )
        return TaskJournal(
            task_id=task.task_id,
            generation=task.generation,
            steps=tuple(self._steps.get(task.task_id, {}).values()),
            waits=tuple(_wait_entry(entry) for entry in waits),
            children=tuple(children),
        )
