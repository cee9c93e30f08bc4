"""Hostile plugin outputs and run input through the in-memory store.

A plugin's outputs are built as ``EmittedOutput`` from arbitrary dicts (a
``pydantic.ValidationError`` there is the documented model validation), then
published with ``MemoryStore.try_complete_task`` and through the public
orchestration API. A rejected batch raises ``OutputPublicationError`` and
leaves the store's public state exactly as it was (compared by
``dagwerk.testing.helpers.fingerprint``); an accepted one completes the task.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import TaskStatus
from dagwerk.errors import DagwerkError
from dagwerk.limits import Limits
from dagwerk.models import EmittedOutput
from dagwerk.orchestrator import on_task_complete
from dagwerk.store import OutputPublicationError
from dagwerk.testing.helpers import CallbackLog, claim, fingerprint, new_run, only_task, root

from .conftest import (
    FUZZ,
    HUGE_INT,
    TEN_MB,
    Rejected,
    bounded,
    deep_dict,
    hostile_json,
    hostile_text,
)

_ID = st.sampled_from(["o1", "o1", "o2", "\x00", "a\x00b", "\ud800", "", "x" * 600]) | hostile_text
_OUTPUT_DICT = st.fixed_dictionaries(
    {"id": _ID},
    optional={
        "fields": st.dictionaries(hostile_text, hostile_json, max_size=3) | hostile_json,
        "data": st.dictionaries(hostile_text, hostile_json, max_size=3) | hostile_json,
        "extra": hostile_json,
    },
)


def _running_task(store: MemoryStore) -> tuple[str, str]:
    new_run(store, [root("a")], "run-1")
    record = only_task(store, "run-1", 0)
    claim(store, record)
    return record.task_id, record.attempt_id


def _emitted(raw: list[Any]) -> tuple[EmittedOutput, ...] | None:
    outputs = []
    for item in raw:
        built = bounded(partial(EmittedOutput.model_validate, item))
        if isinstance(built, Rejected):
            assert isinstance(built.error, pydantic.ValidationError)
            return None
        outputs.append(built)
    return tuple(outputs)


def _publish_and_check(store: MemoryStore, outputs: tuple[EmittedOutput, ...]) -> None:
    task_id, attempt_id = _running_task(store)
    before = fingerprint(store, "run-1")
    outcome = bounded(
        lambda: store.try_complete_task(task_id, outputs, expected_attempt_id=attempt_id)
    )
    if isinstance(outcome, Rejected):
        assert isinstance(outcome.error, OutputPublicationError)
        assert fingerprint(store, "run-1") == before, "a rejected batch wrote state"
        assert only_task(store, "run-1", 0).status is TaskStatus.RUNNING
    else:
        assert outcome is not None
        assert only_task(store, "run-1", 0).status is TaskStatus.COMPLETED


@FUZZ
@given(raw=st.lists(_OUTPUT_DICT | hostile_json, max_size=4))
def test_arbitrary_plugin_outputs_publish_or_write_nothing(raw: list[Any]) -> None:
    outputs = _emitted(raw)
    if outputs is not None:
        _publish_and_check(MemoryStore(), outputs)


@FUZZ
@given(raw=st.lists(_OUTPUT_DICT, max_size=4))
def test_orchestrated_completion_completes_or_fails_the_task(raw: list[Any]) -> None:
    """Through ``on_task_complete`` a rejected batch fails the task, nothing else."""
    outputs = _emitted(raw)
    if outputs is None:
        return
    store = MemoryStore()
    log = CallbackLog()
    task_id, attempt_id = _running_task(store)
    outcome = bounded(
        lambda: on_task_complete(
            store,
            task_id=task_id,
            expected_attempt_id=attempt_id,
            outputs=outputs,
            callbacks=log.callbacks,
        )
    )
    assert not isinstance(outcome, Rejected), outcome
    status = only_task(store, "run-1", 0).status
    assert status in (TaskStatus.COMPLETED, TaskStatus.FAILED)


@pytest.mark.parametrize(
    "raw",
    [
        [{"id": "o1"}, {"id": "o1"}],
        [{"id": "a\x00b", "fields": {"\x00": "\x00"}}],
        [{"id": "o1", "fields": {"k": "\ud800"}}],
        [{"id": "o1", "fields": {"k": TEN_MB}}],
        [{"id": "o1", "data": {"k": TEN_MB}}],
        [{"id": "o1", "fields": {"k": HUGE_INT}}],
        [{"id": "o1", "fields": {"k": 1e308 * 10}}],
        [{"id": "o1", "fields": deep_dict(100_000)}],
        [{"id": f"o{i}", "fields": {"pad": "x" * 60_000}} for i in range(5)],
    ],
    ids=[
        "duplicate-ids",
        "nul",
        "surrogate",
        "ten-mb-field",
        "ten-mb-data",
        "huge-int",
        "inf",
        "deep",
        "over-routing-limit",
    ],
)
def test_extreme_outputs_publish_or_write_nothing(raw: list[dict[str, Any]]) -> None:
    outputs = _emitted(raw)
    if outputs is not None:
        limits = Limits(max_task_completion_routing_bytes=200_000)
        _publish_and_check(MemoryStore(limits=limits), outputs)


def test_duplicate_output_ids_are_rejected_without_state() -> None:
    store = MemoryStore()
    task_id, attempt_id = _running_task(store)
    before = fingerprint(store, "run-1")
    outputs = (EmittedOutput(id="same"), EmittedOutput(id="same"))
    with pytest.raises(OutputPublicationError):
        store.try_complete_task(task_id, outputs, expected_attempt_id=attempt_id)
    assert fingerprint(store, "run-1") == before


@pytest.mark.parametrize(
    "run_input",
    [
        {"k": "\ud800"},
        {"k": TEN_MB},
        {"k": deep_dict(100_000)},
        {"k": float("nan")},
        {1: "int key"},
        {"k": b"bytes"},
    ],
    ids=["surrogate", "ten-mb", "deep", "nan", "int-key", "bytes"],
)
def test_hostile_run_input_is_refused_before_the_run_exists(run_input: dict[Any, Any]) -> None:
    store = MemoryStore()
    outcome = bounded(lambda: store.create_run("run-1", [root("a")], run_input=run_input))
    if isinstance(outcome, Rejected):
        assert isinstance(outcome.error, DagwerkError)
        assert store.get_run("run-1") is None
    else:
        # Accepted input is stored frozen and within the limits.
        assert outcome is True
