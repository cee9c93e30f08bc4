"""Task logs as a user sees them: what plugins log during an attempt is stored
per attempt and read back through ``Engine.logs``, on every executor."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import task_log_plugins as plugins

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.models import DagNode, RetryPolicySpec
from dagwerk.runtime.task_logs import TaskLogLimits
from dagwerk.runtime.worker import Worker
from dagwerk.store import TaskLogLine

SECRET = "s3cr3t-value-42"


@pytest.fixture(params=["sqlite", "memory"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'logs.db'}" if request.param == "sqlite" else "memory://"
    with Engine(url, execution_root=tmp_path) as opened:
        for name in (
            "chatty",
            "printer",
            "silent",
            "many",
            "failing",
            "flaky",
            "async_chatty",
            "slow",
            "other_thread_logs",
        ):
            opened.plugin(name)(getattr(plugins, name))
        yield opened


@pytest.fixture(autouse=True)
def _task_loggers_at_info() -> Iterator[None]:
    # As `dagwerk worker` does by default (--log-level info).
    logger = logging.getLogger("dagwerk.task")
    saved = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(saved)


def _run(
    engine: Engine,
    nodes: Sequence[DagNode],
    *,
    executor: str = "thread",
    input: dict[str, object] | None = None,
    **options: Any,
) -> str:
    worker = engine.worker(concurrency=2, executor=executor, **options)
    worker.start()
    try:
        run_id = engine.submit(list(nodes), input)
        engine.wait(run_id, timeout=120)
    finally:
        worker.stop()
    return run_id


def _secrets(run_id: str, plugin: str) -> dict[str, str]:
    return {"token": SECRET}


def _messages(lines: Sequence[TaskLogLine]) -> list[str]:
    return [line.message for line in lines]


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_records_of_ctx_logger_and_stdlib_loggers_are_stored_with_secrets_masked(
    engine: Engine, executor: str
) -> None:
    before = time.time()
    run_id = _run(
        engine,
        [DagNode(slug="a", plugin="chatty")],
        executor=executor,
        secret_resolver=_secrets,
    )
    lines = engine.logs(run_id)
    assert _messages(lines) == [
        "hello from attempt 1 with ***",
        "a library speaks",
        "caught it",
    ]
    hello, library, caught = lines
    assert (hello.level, hello.logger) == ("INFO", "dagwerk.task.chatty")
    assert (library.level, library.logger) == ("WARNING", "thirdparty.lib")
    assert caught.level == "ERROR"
    assert caught.traceback is not None
    assert "ValueError: bad value ***" in caught.traceback
    assert "Traceback (most recent call last)" in caught.traceback
    assert all(SECRET not in (line.message + (line.traceback or "")) for line in lines)
    assert all(before <= line.at <= time.time() for line in lines)
    task = engine.list_tasks(run_id)[0]
    assert {(line.task_id, line.node_index, line.attempt) for line in lines} == {
        (task.task_id, 0, 1)
    }


def test_process_executor_keeps_what_the_plugin_prints(engine: Engine) -> None:
    run_id = _run(engine, [DagNode(slug="p", plugin="printer")], executor="process")
    got = [(line.logger, line.level, line.message) for line in engine.logs(run_id)]
    assert got == [
        ("stdout", "INFO", "to stdout"),
        ("stderr", "WARNING", "to stderr"),
        ("dagwerk.task.printer", "WARNING", "a record"),
        ("stdout", "INFO", "no newline at the end"),
    ]


def test_async_executor_keeps_records_of_tasks_the_plugin_starts(engine: Engine) -> None:
    run_id = _run(engine, [DagNode(slug="a", plugin="async_chatty")], executor="async")
    assert _messages(engine.logs(run_id)) == [
        "from a task the plugin started",
        "async plugin done",
    ]


def test_records_of_other_threads_and_the_worker_are_not_kept(engine: Engine) -> None:
    run_id = _run(
        engine,
        [DagNode(slug="a", plugin="other_thread_logs"), DagNode(slug="b", plugin="silent")],
    )
    assert _messages(engine.logs(run_id)) == ["mine"]


def test_a_silent_plugin_stores_nothing_and_starts_no_writer(engine: Engine) -> None:
    writers_before = {t for t in threading.enumerate() if t.name == "dagwerk-task-logs"}
    run_id = _run(engine, [DagNode(slug=f"s{i}", plugin="silent") for i in range(5)])
    assert engine.get_run(run_id).status is RunStatus.COMPLETED  # type: ignore[union-attr]
    assert engine.logs(run_id) == []
    writers_after = {t for t in threading.enumerate() if t.name == "dagwerk-task-logs"}
    assert writers_after <= writers_before


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_past_the_line_bound_the_rest_is_dropped_and_counted(engine: Engine, executor: str) -> None:
    run_id = _run(
        engine,
        [DagNode(slug="m", plugin="many")],
        executor=executor,
        input={"lines": 30},
        task_log_limits=TaskLogLimits(max_lines=10),
    )
    lines = engine.logs(run_id)
    assert _messages(lines[:10]) == [f"line {i}" for i in range(10)]
    assert len(lines) == 11
    assert lines[-1].logger == "dagwerk.task_logs"
    assert lines[-1].message.startswith("20 more lines (140 bytes) were dropped")


def test_past_the_byte_bound_the_rest_is_dropped(engine: Engine) -> None:
    # Each message is 6 or 7 bytes: 20 bytes keep three lines.
    run_id = _run(
        engine,
        [DagNode(slug="m", plugin="many")],
        input={"lines": 12},
        task_log_limits=TaskLogLimits(max_bytes=20),
    )
    lines = engine.logs(run_id)
    assert _messages(lines[:3]) == ["line 0", "line 1", "line 2"]
    assert lines[3].message.startswith("9 more lines (")
    assert len(lines) == 4


def test_zero_limits_store_nothing(engine: Engine) -> None:
    run_id = _run(
        engine, [DagNode(slug="a", plugin="chatty")], task_log_limits=TaskLogLimits(max_lines=0)
    )
    assert engine.logs(run_id) == []


def test_bad_limits_are_refused_naming_the_field() -> None:
    from dagwerk.errors import DagwerkError

    with pytest.raises(DagwerkError) as raised:
        TaskLogLimits(max_bytes=-1)
    assert raised.value.field == "task_log_max_bytes"
    with pytest.raises(DagwerkError) as raised:
        TaskLogLimits(max_lines=1.5)  # type: ignore[arg-type]
    assert raised.value.field == "task_log_max_lines"


def test_logs_are_kept_per_attempt_and_filtered_by_node_task_and_attempt(
    engine: Engine,
) -> None:
    retry = RetryPolicySpec(max_attempts=2, backoff_base=0.0, backoff_max=0.0)
    run_id = _run(
        engine,
        [
            DagNode(slug="flaky", plugin="flaky", retry=retry),
            DagNode(slug="chat", plugin="chatty"),
        ],
    )
    assert _messages(engine.logs(run_id, node="flaky")) == ["attempt 1 starts", "attempt 2 starts"]
    assert _messages(engine.logs(run_id, node="flaky", attempt=2)) == ["attempt 2 starts"]
    chat_task = next(t for t in engine.list_tasks(run_id) if t.node_index == 1)
    assert len(engine.logs(run_id, task_id=chat_task.task_id)) == 3
    everything = engine.logs(run_id)
    assert len(everything) == 5
    after = everything[1].line_id
    assert engine.logs(run_id, after=after) == everything[2:]
    assert engine.logs(run_id, limit=2) == everything[:2]


def test_a_running_tasks_lines_are_readable_before_it_ends(engine: Engine, tmp_path: Path) -> None:
    worker = engine.worker(concurrency=1)
    worker.start()
    try:
        run_id = engine.submit([DagNode(slug="slow", plugin="slow")])
        deadline = time.monotonic() + 30
        while not engine.logs(run_id):
            assert time.monotonic() < deadline, "the running task's line was never stored"
            time.sleep(0.02)
        assert engine.get_run(run_id).status is RunStatus.RUNNING  # type: ignore[union-attr]
        assert _messages(engine.logs(run_id)) == ["started, waiting"]
        (tmp_path / "release").write_text("go")
        engine.wait(run_id, timeout=60)
    finally:
        worker.stop()
    assert _messages(engine.logs(run_id)) == ["started, waiting", "released"]


class _CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.appends = 0

    def append_task_logs(self, lines: Sequence[TaskLogLine]) -> None:
        self.appends += 1
        super().append_task_logs(lines)


def test_lines_are_written_in_batches_not_one_commit_per_line(tmp_path: Path) -> None:
    store = _CountingStore()
    worker = Worker(store, {"many": plugins.many}, concurrency=4, execution_root=tmp_path)
    from dagwerk.orchestrator import OrchestratorCallbacks, start_run

    def noop(run_id: str) -> None:
        return None

    nodes = [DagNode(slug=f"m{i}", plugin="many") for i in range(4)]
    store.create_run("run-1", nodes, run_input={"lines": 200})
    start_run(store, "run-1", callbacks=OrchestratorCallbacks(noop, noop, noop, noop))
    try:
        worker.run_until_idle()
    finally:
        worker.stop()
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert len(store.read_task_logs(_query("run-1"))) == 800
    assert store.appends <= 8


def _query(run_id: str) -> Any:
    from dagwerk.store import TaskLogQuery

    return TaskLogQuery(run_id=run_id)


def test_engine_logs_names_an_unknown_node_and_run(engine: Engine) -> None:
    from dagwerk.engine import RunNotFoundError, UnknownNodeError

    run_id = _run(engine, [DagNode(slug="a", plugin="silent")])
    with pytest.raises(UnknownNodeError) as raised:
        engine.logs(run_id, node="nope")
    assert raised.value.field == "nodes"
    with pytest.raises(RunNotFoundError):
        engine.logs("run-missing")
