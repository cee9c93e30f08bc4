"""What ``dagwerk show`` adds from the tasks' durable records: each task's
recorded steps (``ctx.step``) and its waits with their state and response."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from dagwerk.cli.commands_common import render_table
from dagwerk.json import thaw_json

if TYPE_CHECKING:
    from dagwerk.engine import Engine
    from dagwerk.store import TaskJournal

__all__ = ["MAX_RECORD_ROWS", "add_journals", "render_journals"]

MAX_RECORD_ROWS = 20
"""The summary of ``show`` lists at most this many recorded steps and waits."""

_SHORT = 60


def _journal_json(journal: TaskJournal) -> dict[str, Any]:
    return {
        "steps": [
            {
                "name": step.name,
                "attempt_id": step.attempt_id,
                "recorded_at": step.recorded_at,
                "result": thaw_json(step.result),
            }
            for step in journal.steps
        ],
        "wait_history": [
            {
                "wait_id": wait.wait_id,
                "state": wait.state,
                "attempt_id": wait.attempt_id,
                "resumed_attempt_id": wait.resumed_attempt_id,
                "waited_at": wait.waited_at,
                "response": thaw_json(wait.response),
            }
            for wait in journal.waits
        ],
    }


def add_journals(engine: Engine, run_id: str, tasks: list[dict[str, Any]]) -> None:
    """Give each described task its ``steps`` and ``wait_history`` (empty
    lists on a store that keeps no such records)."""
    journals = engine.task_journals(run_id)
    for task in tasks:
        journal = journals.get(task["task_id"])
        empty: dict[str, Any] = {"steps": [], "wait_history": []}
        task.update(empty if journal is None else _journal_json(journal))


def _short(value: object) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= _SHORT else text[: _SHORT - 3] + "..."


def render_journals(tasks: list[dict[str, Any]]) -> int:
    """Print the recorded steps and waits of ``tasks`` (at most
    :data:`MAX_RECORD_ROWS` rows); returns how many were left out."""
    rows: list[tuple[object, ...]] = []
    for task in tasks:
        for step in task.get("steps", ()):
            rows.append(
                (
                    task["task_id"],
                    task["node"],
                    "step",
                    step["name"],
                    "recorded",
                    _short(step["result"]),
                )
            )
        for wait in task.get("wait_history", ()):
            rows.append(
                (
                    task["task_id"],
                    task["node"],
                    "wait",
                    wait["wait_id"],
                    wait["state"],
                    _short(wait["response"]) if wait["state"] == "resolved" else None,
                )
            )
    if rows:
        render_table(
            "recorded steps and waits",
            ("task", "node", "kind", "name", "state", "result / response"),
            rows[:MAX_RECORD_ROWS],
        )
    return max(0, len(rows) - MAX_RECORD_ROWS)
