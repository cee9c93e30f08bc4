"""Durable task records in the SQL store: steps, and the journal of a task's
steps, waits and child runs (see :mod:`dagwerk.store_durable`)."""

from __future__ import annotations

from collections.abc import Mapping

from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.json import freeze_json
from dagwerk.store import (
    StepRecord,
    TaskChildRecord,
    TaskJournal,
    TaskWaitEntry,
    validate_step_name,
)

from ._base import SqlStoreBase, dumps, loads_value
from .gateway import Row, Tx


def _step(row: Row) -> StepRecord:
    return StepRecord(
        task_id=row["task_id"],
        name=row["name"],
        generation=row["generation"],
        attempt_id=row["attempt_id"],
        result=loads_value(row["result"]),
        position=row["position"],
        recorded_at=row["recorded_at"],
    )


def _wait(row: Row) -> TaskWaitEntry:
    return TaskWaitEntry(
        wait_id=row["wait_id"],
        attempt_id=row["attempt_id"],
        generation=row["generation"],
        resumed_attempt_id=row["resumed_attempt_id"],
        invalidated=row["state"] == "invalidated",
        response=None if row["response"] is None else loads_value(row["response"]),
        waited_at=row["waited_at"],
    )


def _journal(tx: Tx, task: Row) -> TaskJournal:
    keys = {"task_id": task["task_id"], "run_id": task["run_id"]}
    return TaskJournal(
        task_id=task["task_id"],
        generation=task["generation"],
        steps=tuple(_step(row) for row in tx.all("journal_steps", keys)),
        waits=tuple(_wait(row) for row in tx.all("journal_waits", keys)),
        children=tuple(
            TaskChildRecord(
                run_id=row["run_id"],
                lineage=row["lineage"],
                run_input=loads_value(row["run_input"]),
                status=RunStatus(row["status"]),
            )
            for row in tx.all("journal_children", keys)
        ),
    )


class DurableMixin(SqlStoreBase):
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
        text = dumps(freeze_json(result))
        with self._gw.write() as tx:
            # Completion mode on PostgreSQL: a step writes nothing a claim reads.
            task = self._task(tx, task_id, completing=True)
            if task is None or not self._matches(
                task, expected_attempt_id, TaskStatus.RUNNING, expected_generation
            ):
                return None
            keys = {"task_id": task_id, "name": name}
            tx.run(
                "step_insert",
                {
                    **keys,
                    "generation": expected_generation,
                    "attempt_id": expected_attempt_id,
                    "result": text,
                    "now": self._now(),
                },
            )
            row = tx.one("step_get", keys)
            assert row is not None
            return _step(row)

    def get_task_journal(self, task_id: str) -> TaskJournal | None:
        with self._gw.read() as tx:
            task = tx.one("journal_task", {"task_id": task_id})
            return None if task is None else _journal(tx, task)

    def list_run_journals(self, run_id: str) -> Mapping[str, TaskJournal]:
        with self._gw.read() as tx:
            return {
                row["task_id"]: _journal(tx, row)
                for row in tx.all("run_journal_tasks", {"run_id": run_id})
            }
