"""Waiting and resuming in the SQL store."""

from __future__ import annotations

from dagwerk.constants import TaskStatus
from dagwerk.json import JsonValue, freeze_json
from dagwerk.store import TaskResumeResult, TaskWaitResult, WaitRecord, validate_wait_id

from ._base import SqlStoreBase, dumps, loads_value
from .gateway import Row


class WaitsMixin(SqlStoreBase):
    def try_wait_task(
        self, task_id: str, wait_id: str, *, expected_attempt_id: str, expected_generation: int
    ) -> TaskWaitResult | None:
        validate_wait_id(wait_id)
        with self._gw.write() as tx:
            record = tx.one("wait_get", {"task_id": task_id, "wait_id": wait_id})
            if record is not None:
                # WT-03: an exact repeat replays; a task never reuses a wait ID.
                if (
                    record["attempt_id"] == expected_attempt_id
                    and record["generation"] == expected_generation
                ):
                    return _wait_result(record)
                return None
            task = self._current(
                tx, task_id, expected_attempt_id, TaskStatus.RUNNING, expected_generation
            )
            if task is None or task["active_wait_id"] is not None:
                return None
            self._set_status(tx, task, TaskStatus.WAITING)
            tx.run("task_set_active_wait", {"task_id": task_id, "wait_id": wait_id})
            tx.run(
                "wait_insert",
                {
                    # The wait's start, committed with it (the wait timeout's origin).
                    "waited_at": self._now(),
                    "task_id": task_id,
                    "wait_id": wait_id,
                    "attempt_id": expected_attempt_id,
                    "generation": expected_generation,
                },
            )
            record = tx.one("wait_get", {"task_id": task_id, "wait_id": wait_id})
            assert record is not None
            return _wait_result(record)

    def get_wait_response(self, task_id: str, wait_id: str) -> JsonValue | None:
        with self._gw.read() as tx:
            row = tx.one("wait_response", {"task_id": task_id, "wait_id": wait_id})
            if row is None or row["response"] is None:
                return None
            return loads_value(row["response"])

    def get_wait(self, task_id: str, wait_id: str) -> WaitRecord | None:
        with self._gw.read() as tx:
            record = tx.one("wait_get", {"task_id": task_id, "wait_id": wait_id})
        if record is None:
            return None
        return WaitRecord(
            task_id=record["task_id"],
            wait_id=record["wait_id"],
            attempt_id=record["attempt_id"],
            generation=record["generation"],
            resumed_attempt_id=record["resumed_attempt_id"],
            invalidated=record["state"] == "invalidated",
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
        validate_wait_id(wait_id)
        frozen = freeze_json(response)
        response_text = None if frozen is None else dumps(frozen)
        with self._gw.write() as tx:
            record = tx.one("wait_get", {"task_id": task_id, "wait_id": wait_id})
            if (
                record is None
                or record["attempt_id"] != expected_attempt_id
                or record["generation"] != expected_generation
            ):
                return None
            if record["resumed_attempt_id"] is not None:
                return _resume_result(record)
            if record["state"] != "active":
                # WT-07: invalidated before it was resolved.
                return None
            task = self._current(
                tx, task_id, expected_attempt_id, TaskStatus.WAITING, expected_generation
            )
            if task is None or task["active_wait_id"] != wait_id:
                return None
            new_attempt = self._replace_attempt(
                tx, task, resumed_from=wait_id, outcome=TaskStatus.WAITING
            )
            tx.run(
                "wait_resolve",
                {
                    "task_id": task_id,
                    "wait_id": wait_id,
                    "resumed_attempt_id": new_attempt,
                    "response": response_text,
                },
            )
            record = tx.one("wait_get", {"task_id": task_id, "wait_id": wait_id})
            assert record is not None
            return _resume_result(record)


def _wait_result(record: Row) -> TaskWaitResult:
    return TaskWaitResult(
        task_id=record["task_id"],
        attempt_id=record["attempt_id"],
        run_id=record["run_id"],
        node_index=record["node_index"],
        generation=record["generation"],
        wait_id=record["wait_id"],
    )


def _resume_result(record: Row) -> TaskResumeResult:
    return TaskResumeResult(
        task_id=record["task_id"],
        waiting_attempt_id=record["attempt_id"],
        resumed_attempt_id=record["resumed_attempt_id"],
        run_id=record["run_id"],
        node_index=record["node_index"],
        generation=record["generation"],
        wait_id=record["wait_id"],
    )
