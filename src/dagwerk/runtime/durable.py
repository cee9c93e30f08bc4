"""Durable tasks in the worker: what an attempt replays from its task's records.

A plugin runs from the top on every attempt of its task (a retry, a
recovery after a lost worker, a resume after a wait). When an attempt
starts, the worker reads the task's journal once
(:meth:`~dagwerk.store.DurableTaskStore.get_task_journal`; a first
attempt has none to read) into an :class:`AttemptJournal`, which the
context consults:

- ``ctx.step(name, fn)`` returns a recorded result without calling ``fn``;
  otherwise it calls ``fn`` and records the result, fenced by the attempt
  (a stale attempt records nothing and stops with :class:`TaskCancelled`);
- ``ctx.wait(wait_id)`` returns the response of a wait resolved in this
  generation instead of parking again;
- the k-th ``ctx.start_child`` of the task gets the run ID
  :func:`derived_child_run_id` and returns the child that exists; one that
  asks for another pipeline or input fails the task
  (:class:`ChildRunNondeterministicError`, never retried).

Under the process executor the journal travels to the plugin's process as
part of the context, without its recorder: the plugin process records a
step by asking the worker over its pipe (``runtime/_plugin_process.py``).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dagwerk.json import JsonValue
from dagwerk.lineage import LineageInvalidError, decode_lineage
from dagwerk.runtime.errors import NonRetryableError, TaskCancelled
from dagwerk.store import DurableTaskStore, LeasedDelivery, TaskJournal

__all__ = [
    "AttemptJournal",
    "ChildRunNondeterministicError",
    "RecordedChild",
    "StepError",
    "StepRecorder",
    "derived_child_run_id",
    "open_journal",
]

StepRecorder = Callable[[str, JsonValue], JsonValue]
"""``(name, result) -> the recorded result``: records a step of the attempt."""


class StepError(NonRetryableError, ValueError):
    """A step cannot be run or recorded: a malformed or reused name, a result
    that is not JSON or is over the byte limit, or a store without steps.
    Never retried: the next attempt would fail the same way."""

    code = "step_invalid"


class ChildRunNondeterministicError(NonRetryableError):
    """A later attempt's ``start_child`` call asks for another pipeline or
    input than the child that call started before. Never retried."""

    code = "child_run_nondeterministic"


def derived_child_run_id(task_id: str, generation: int, index: int) -> str:
    """The run ID of the ``index``-th (0-based) ``start_child`` call of a task
    generation: the same on every attempt, different for every other call."""
    digest = hashlib.sha256(f"{task_id}\x00{generation}\x00{index}".encode()).hexdigest()
    return f"child-{digest[:32]}"


@dataclass(frozen=True, slots=True)
class RecordedChild:
    """A child run the task started: its pipeline identity (``None`` when its
    stored lineage does not decode) and its run input."""

    run_id: str
    pipeline_id: str | None
    run_input: JsonValue


@dataclass(eq=False)
class AttemptJournal:
    """What the attempt's task recorded before this attempt, and what the
    attempt has used of it.

    ``steps``: recorded step results by name; ``waits``: the responses of
    the waits resolved in this generation, by wait ID; ``children``: the
    task's child runs by run ID. ``recorder`` records a new step (``None``:
    the store keeps no steps); it does not travel to a plugin process,
    where ``remote`` says whether the worker's journal has one.
    """

    steps: dict[str, JsonValue] = field(default_factory=dict)
    waits: dict[str, JsonValue | None] = field(default_factory=dict)
    children: dict[str, RecordedChild] = field(default_factory=dict)
    recorder: StepRecorder | None = None
    used_steps: set[str] = field(default_factory=set)
    child_calls: int = 0
    remote: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["remote"] = self.recorder is not None
        state["recorder"] = None
        del state["lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()

    def claim_step(self, name: str) -> None:
        """Mark ``name`` used by this attempt; a second use raises."""
        with self.lock:
            if name in self.used_steps:
                raise StepError(
                    f"step_name_reused: step {name!r} already ran in this task; "
                    "step names are unique within a task",
                    code="step_name_reused",
                    field="name",
                )
            self.used_steps.add(name)

    def next_child_index(self) -> int:
        """The 0-based index of this ``start_child`` call."""
        with self.lock:
            index = self.child_calls
            self.child_calls += 1
            return index


def _recorded_child(run_id: str, lineage: str, run_input: JsonValue) -> RecordedChild:
    try:
        pipeline_id: str | None = decode_lineage(lineage).pipeline_id
    except LineageInvalidError:
        pipeline_id = None
    return RecordedChild(run_id, pipeline_id, run_input)


def _fill(journal: AttemptJournal, record: TaskJournal, generation: int) -> None:
    for step in record.steps:
        if step.generation == generation:
            journal.steps[step.name] = step.result
    for wait in record.waits:
        if wait.generation == generation and wait.resumed_attempt_id is not None:
            journal.waits[wait.wait_id] = wait.response
    for child in record.children:
        journal.children[child.run_id] = _recorded_child(
            child.run_id, child.lineage, child.run_input
        )


def open_journal(
    store: DurableTaskStore | None,
    delivery: LeasedDelivery,
    *,
    attempt: int,
    resumed_from: str | None,
    wait_response: JsonValue | None,
) -> AttemptJournal:
    """The journal of attempt number ``attempt`` of the delivery's task.

    The wait the attempt resumed from answers with ``wait_response`` on any
    store; a :class:`~dagwerk.store.DurableTaskStore` adds the rest of the
    task's records (read once, and only for a second or later attempt: a
    first attempt's task has recorded nothing) and records steps.
    """
    journal = AttemptJournal()
    if resumed_from is not None:
        journal.waits[resumed_from] = wait_response
    if store is None:
        return journal
    journal.recorder = _store_recorder(store, delivery)
    if attempt > 1:
        record = store.get_task_journal(delivery.task_id)
        if record is not None:
            _fill(journal, record, delivery.generation)
    return journal


def _store_recorder(store: DurableTaskStore, delivery: LeasedDelivery) -> StepRecorder:
    def record(name: str, result: JsonValue) -> JsonValue:
        recorded = store.try_record_step(
            delivery.task_id,
            name,
            result,
            expected_attempt_id=delivery.attempt_id,
            expected_generation=delivery.generation,
        )
        if recorded is None:
            raise TaskCancelled(
                f"step {name!r} was not recorded: attempt {delivery.attempt_id!r} of task "
                f"{delivery.task_id!r} is no longer the task's running attempt"
            )
        return recorded.result

    return record
