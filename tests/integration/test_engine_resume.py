"""``Engine.resume`` and ``dagwerk resume`` repeated exactly, on memory, SQLite
and PostgreSQL: a repeat returns the first result and queues nothing, also
after the resumed attempt has completed; an invalidated wait is refused.

Work is done with ``worker.run_until_idle()`` in the test thread, so nothing
here sleeps.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dagwerk import DagNode, Engine, RunStatus, TaskContext, TaskInputs
from dagwerk.cli import cli
from dagwerk.constants import TaskStatus
from dagwerk.engine import ResumeRejectedError
from dagwerk.store import TaskRecord
from dagwerk.testing.postgres import fresh_schema_url

NODES = [DagNode(slug="ask", plugin="ask"), DagNode(slug="other", plugin="other")]


def _url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    if backend == "memory":
        yield "memory://"
    elif backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'resume.db'}"
    else:
        with fresh_schema_url(request.getfixturevalue("postgres_url"), "resume") as url:
            yield url


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from _url(request.param, tmp_path, request)


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database that the CLI's engine and the test's engine share."""
    yield from _url(request.param, tmp_path, request)


class Asker:
    """An engine whose ``ask`` plugin waits for approval on its first attempt
    and records the response each resumed attempt sees."""

    def __init__(self, url: str, tmp_path: Path, *, fail_other: bool = False) -> None:
        options: dict[str, Any] = {"pool_size": 2} if url.startswith("postgres") else {}
        self.engine = Engine(url, execution_root=tmp_path, **options)
        self.responses: list[object] = []

        @self.engine.plugin("ask")
        def ask(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            if ctx.resumed_from_wait_id is None:
                ctx.wait("approval")
            self.responses.append(ctx.wait_response)
            return {"answer": "approved"}

        @self.engine.plugin("other")
        def other(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            if fail_other:
                raise RuntimeError("other failed")
            return {"answer": "done"}

        self.worker = self.engine.worker(concurrency=1)

    def close(self) -> None:
        self.engine.close()

    def queued_rows(self, run_id: str, task_id: str) -> list[str]:
        rows = self.engine.store.list_deliveries(run_id)
        return [row.attempt_id for row in rows if row.task_id == task_id]


@pytest.fixture
def asker(url: str, tmp_path: Path) -> Iterator[Asker]:
    made = Asker(url, tmp_path)
    yield made
    made.close()


def _waiting_task(asker: Asker, status: TaskStatus = TaskStatus.WAITING) -> tuple[str, TaskRecord]:
    """The run and its ``ask`` task once that waits (its status: ``status``)."""
    run_id = asker.engine.submit(NODES)
    asker.worker.run_until_idle()
    (task,) = [t for t in asker.engine.list_tasks(run_id) if t.node_index == 0]
    assert task.status is status
    if status is TaskStatus.WAITING:
        assert task.active_wait_id == "approval"
    return run_id, task


def test_an_exact_repeat_of_resume_returns_the_first_result(asker: Asker) -> None:
    engine = asker.engine
    run_id, task = _waiting_task(asker)
    first = engine.resume(task.task_id, "approval", response={"ok": True})
    assert first.waiting_attempt_id == task.attempt_id
    assert first.resumed_attempt_id != task.attempt_id
    # The task row now names the resumed attempt; the repeat still matches
    # the attempt that entered the wait. Its own response is ignored.
    again = engine.resume(task.task_id, "approval", response={"ok": False})
    assert again == first
    assert [a.attempt_id for a in engine.list_attempts(task.task_id)] == [
        task.attempt_id,
        first.resumed_attempt_id,
    ]
    assert asker.queued_rows(run_id, task.task_id) == [first.resumed_attempt_id]

    asker.worker.run_until_idle()
    assert engine.result(run_id).status is RunStatus.COMPLETED
    assert asker.responses == [{"ok": True}]
    # After the resumed attempt has completed, the repeat replays again.
    assert engine.resume(task.task_id, "approval") == first
    assert len(engine.list_attempts(task.task_id)) == 2
    assert asker.queued_rows(run_id, task.task_id) == []
    asker.worker.run_until_idle()
    assert asker.responses == [{"ok": True}]
    (finished,) = [t for t in engine.list_tasks(run_id) if t.node_index == 0]
    assert (finished.status, finished.attempt_id) == (
        TaskStatus.COMPLETED,
        first.resumed_attempt_id,
    )


def test_a_wait_the_task_never_entered_is_refused(asker: Asker) -> None:
    _, task = _waiting_task(asker)
    with pytest.raises(
        ResumeRejectedError, match=re.escape("never waited on it (waiting on 'approval')")
    ):
        asker.engine.resume(task.task_id, "other")
    with pytest.raises(ResumeRejectedError, match="does not exist"):
        asker.engine.resume("no-such-task", "approval")


@pytest.mark.parametrize("how", ["cancelled", "failed_and_retried", "rerun"])
def test_a_wait_invalidated_before_it_was_resumed_is_refused(
    url: str, tmp_path: Path, how: str
) -> None:
    asker = Asker(url, tmp_path, fail_other=how == "failed_and_retried")
    try:
        engine = asker.engine
        if how == "cancelled":
            run_id, task = _waiting_task(asker)
            assert engine.cancel(run_id)
        elif how == "rerun":
            # Re-running the waiting node replans it as a new generation.
            run_id, task = _waiting_task(asker)
            engine.rerun(run_id, ["ask"])
        else:
            # fail_fast: the other root's failure fails the run and invalidates
            # the wait; the retry replans the waiting node as a new generation.
            run_id, task = _waiting_task(asker, TaskStatus.CANCELLED)
            assert engine.store.get_wait(task.task_id, "approval") is not None
            assert engine.result(run_id).status is RunStatus.FAILED
            engine.retry(run_id)
        rows = engine.store.list_deliveries(run_id)
        with pytest.raises(ResumeRejectedError, match="the wait was invalidated"):
            engine.resume(task.task_id, "approval")
        assert [a.attempt_id for a in engine.list_attempts(task.task_id)] == [task.attempt_id]
        assert engine.store.list_deliveries(run_id) == rows
    finally:
        asker.close()


def _cli_resume(url: str, task_id: str, *extra: str) -> str:
    result = CliRunner().invoke(
        cli, ["resume", task_id, "approval", "--db", url, *extra], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return result.output


def test_dagwerk_resume_repeated_prints_the_first_result(shared_url: str, tmp_path: Path) -> None:
    asker = Asker(shared_url, tmp_path)
    try:
        run_id, task = _waiting_task(asker)
        first = _cli_resume(shared_url, task.task_id, "--json", "--response", '{"ok": true}')
        again = _cli_resume(shared_url, task.task_id, "--json", "--response", '{"ok": false}')
        assert again == first
        document = json.loads(first)
        assert document["task_id"] == task.task_id
        assert document["wait_id"] == "approval"
        assert document["waiting_attempt_id"] == task.attempt_id
        resumed = document["resumed_attempt_id"]
        assert asker.queued_rows(run_id, task.task_id) == [resumed]

        asker.worker.run_until_idle()
        assert asker.engine.result(run_id).status is RunStatus.COMPLETED
        assert _cli_resume(shared_url, task.task_id, "--json") == first
        plain = _cli_resume(shared_url, task.task_id)
        assert plain == f"task {task.task_id}: resumed from approval as attempt {resumed}\n"
        assert len(asker.engine.list_attempts(task.task_id)) == 2
        assert asker.responses == [{"ok": True}]
    finally:
        asker.close()
