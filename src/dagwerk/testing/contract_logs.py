"""Contract tests: stored task log lines (:class:`~dagwerk.store.TaskLogStore`)
and the runs' trace contexts (:class:`~dagwerk.store.RunTraceStore`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dagwerk.store import (
    MAX_TASK_LOG_BATCH,
    MAX_TASK_LOG_READ,
    RunTraceStore,
    TaskLogError,
    TaskLogLine,
    TaskLogQuery,
    TaskLogStore,
)
from dagwerk.testing.helpers import new_run, root

__all__ = [
    "test_task_logs_append_and_read_in_stored_order",
    "test_task_logs_filter_by_task_node_and_attempt",
    "test_task_logs_follow_after_a_line_with_a_limit",
    "test_task_logs_keep_every_field",
    "test_task_logs_refuse_malformed_requests",
    "test_trace_context_is_stored_once_per_run",
]


def _logs(store: Any) -> TaskLogStore:
    assert isinstance(store, TaskLogStore)
    return store


def _line(
    message: str,
    *,
    run_id: str = "run-1",
    task_id: str = "run-1:0:0:0",
    node_index: int = 0,
    attempt: int = 1,
) -> TaskLogLine:
    return TaskLogLine(
        run_id=run_id,
        task_id=task_id,
        node_index=node_index,
        attempt=attempt,
        at=1_700_000_000.25,
        level="INFO",
        logger="dagwerk.task.p",
        message=message,
    )


def _read(store: TaskLogStore, run_id: str = "run-1", **where: Any) -> list[TaskLogLine]:
    return store.read_task_logs(TaskLogQuery(run_id=run_id, **where))


def test_task_logs_append_and_read_in_stored_order(store: Any) -> None:
    logs = _logs(store)
    assert _read(logs) == []
    logs.append_task_logs([_line("a"), _line("b")])
    logs.append_task_logs([])
    logs.append_task_logs([_line("c"), _line("x", run_id="run-2", task_id="run-2:0:0:0")])
    lines = _read(logs)
    assert [line.message for line in lines] == ["a", "b", "c"]
    ids = [line.line_id for line in lines]
    assert ids == sorted(ids) and len(set(ids)) == 3 and ids[0] > 0
    assert [line.message for line in _read(logs, "run-2")] == ["x"]
    assert _read(logs, "run-unknown") == []
    # Lines are only ever added: an exact repeat is stored again.
    logs.append_task_logs([_line("a")])
    assert [line.message for line in _read(logs)] == ["a", "b", "c", "a"]


def test_task_logs_keep_every_field(store: Any) -> None:
    logs = _logs(store)
    line = replace(
        _line("héllo\nsecond line ✓"),
        level="ERROR",
        logger="stderr",
        traceback='Traceback (most recent call last):\n  File "x.py"\nValueError: bad',
        node_index=3,
        attempt=2,
    )
    logs.append_task_logs([line])
    (stored,) = _read(logs)
    assert stored == replace(line, line_id=stored.line_id)


def test_task_logs_filter_by_task_node_and_attempt(store: Any) -> None:
    logs = _logs(store)
    logs.append_task_logs(
        [
            _line("t0a1"),
            _line("t1a1", task_id="run-1:1:0:0", node_index=1),
            _line("t0a2", attempt=2),
            _line("t2a1", task_id="run-1:1:0:1", node_index=1),
        ]
    )

    def messages(**where: Any) -> list[str]:
        return [line.message for line in _read(logs, **where)]

    assert messages(task_id="run-1:0:0:0") == ["t0a1", "t0a2"]
    assert messages(task_id="run-1:0:0:0", attempt=2) == ["t0a2"]
    assert messages(node_index=1) == ["t1a1", "t2a1"]
    assert messages(node_index=1, attempt=1) == ["t1a1", "t2a1"]
    assert messages(attempt=1) == ["t0a1", "t1a1", "t2a1"]
    assert messages(node_index=2) == []


def test_task_logs_follow_after_a_line_with_a_limit(store: Any) -> None:
    logs = _logs(store)
    logs.append_task_logs([_line(str(i)) for i in range(5)])
    first = _read(logs, limit=2)
    assert [line.message for line in first] == ["0", "1"]
    rest = _read(logs, after_line_id=first[-1].line_id)
    assert [line.message for line in rest] == ["2", "3", "4"]
    assert _read(logs, after_line_id=rest[-1].line_id) == []
    logs.append_task_logs([_line("5")])
    assert [line.message for line in _read(logs, after_line_id=rest[-1].line_id)] == ["5"]


@pytest.mark.parametrize(
    ("where", "field"),
    [
        ({"run_id": ""}, "run_id"),
        ({"task_id": ""}, "task_id"),
        ({"node_index": -1}, "node_index"),
        ({"attempt": 0}, "attempt"),
        ({"after_line_id": -1}, "after_line_id"),
        ({"limit": 0}, "limit"),
        ({"limit": MAX_TASK_LOG_READ + 1}, "limit"),
    ],
)
def test_task_logs_refuse_malformed_requests(store: Any, where: dict[str, Any], field: str) -> None:
    logs = _logs(store)
    query = replace(TaskLogQuery(run_id="run-1"), **where)
    with pytest.raises(TaskLogError) as raised:
        logs.read_task_logs(query)
    assert raised.value.field == field
    bad_lines = {
        "run_id": replace(_line("a"), run_id=""),
        "task_id": replace(_line("a"), task_id=""),
        "node_index": replace(_line("a"), node_index=-1),
        "attempt": replace(_line("a"), attempt=0),
    }
    if field in bad_lines:
        with pytest.raises(TaskLogError) as refused:
            logs.append_task_logs([_line("kept?"), bad_lines[field]])
        assert refused.value.field == field
        # A refused batch stores nothing.
        assert _read(logs) == []
    if field == "limit":
        with pytest.raises(TaskLogError) as too_many:
            logs.append_task_logs([_line("a")] * (MAX_TASK_LOG_BATCH + 1))
        assert too_many.value.field == "lines" and too_many.value.limit == MAX_TASK_LOG_BATCH
        assert _read(logs) == []


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_trace_context_is_stored_once_per_run(store: Any) -> None:
    traces = store
    assert isinstance(traces, RunTraceStore)
    assert traces.get_run_traceparent("run-1") is None
    assert traces.set_run_traceparent("run-1", TRACEPARENT) is False  # no such run
    new_run(store, [root("a")])
    assert traces.get_run_traceparent("run-1") is None
    assert traces.set_run_traceparent("run-1", TRACEPARENT) is True
    assert traces.get_run_traceparent("run-1") == TRACEPARENT
    other = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
    assert traces.set_run_traceparent("run-1", other) is False
    assert traces.get_run_traceparent("run-1") == TRACEPARENT
    bad_values: list[Any] = ["", "00-xyz", TRACEPARENT.upper(), None]
    for bad in bad_values:
        with pytest.raises(TaskLogError) as raised:
            traces.set_run_traceparent("run-1", bad)
        assert raised.value.field == "traceparent"
