"""A failed attempt's traceback is stored with the attempt: the plugin's
frames and causes, on the thread and process executors, secrets masked,
bounded, and shown by ``dagwerk show --json``."""

from __future__ import annotations

from pathlib import Path

import pytest
import task_log_plugins as plugins

from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.models import DagNode, RetryPolicySpec
from dagwerk.store_tracebacks import MAX_ATTEMPT_TRACEBACK_BYTES
from dagwerk.testing.cli import DagwerkCli

SECRET = "s3cr3t-tb-value-9"


def _failed_run(engine: Engine, node: DagNode, executor: str) -> str:
    worker = engine.worker(
        concurrency=1,
        executor=executor,
        secret_resolver=lambda run_id, plugin: {"token": SECRET},
    )
    worker.start()
    try:
        run_id = engine.submit([node])
        assert engine.wait(run_id, timeout=120).status is RunStatus.FAILED
    finally:
        worker.stop()
    return run_id


@pytest.mark.parametrize("executor", ["thread", "process"])
@pytest.mark.parametrize("url", ["sqlite", "memory"])
def test_every_failed_attempt_keeps_its_traceback_with_secrets_masked(
    tmp_path: Path, executor: str, url: str
) -> None:
    db = f"sqlite:///{tmp_path / 'tb.db'}" if url == "sqlite" else "memory://"
    retry = RetryPolicySpec(max_attempts=2, backoff_base=0.0, backoff_max=0.0)
    with Engine(db, execution_root=tmp_path) as engine:
        engine.plugin("raises_chained")(plugins.raises_chained)
        node = DagNode(slug="c", plugin="raises_chained", retry=retry)
        run_id = _failed_run(engine, node, executor)
        attempts = engine.list_attempts(engine.list_tasks(run_id)[0].task_id)
        (task,) = engine.list_tasks(run_id)
    assert [a.number for a in attempts] == [1, 2]
    for attempt in attempts:
        text = attempt.traceback
        assert text is not None
        assert text.startswith("Traceback (most recent call last):")
        assert "KeyError: 'missing'" in text
        assert "The above exception was the direct cause of the following exception" in text
        assert "in raises_chained" in text and "in _deep_raise" in text
        assert text.endswith("ValueError: bad value ***")
        assert SECRET not in text
        # The error text, of each attempt and of the task, is masked too.
        assert attempt.error == "ValueError: bad value ***"
    assert task.error == "ValueError: bad value ***"


def test_a_huge_traceback_keeps_its_end_within_the_bound(tmp_path: Path) -> None:
    with Engine(f"sqlite:///{tmp_path / 'tb.db'}", execution_root=tmp_path) as engine:
        engine.plugin("raises_huge")(plugins.raises_huge)
        run_id = _failed_run(engine, DagNode(slug="h", plugin="raises_huge"), "thread")
        (task,) = engine.list_tasks(run_id)
        (attempt,) = engine.list_attempts(task.task_id)
    text = attempt.traceback
    assert text is not None
    assert len(text.encode("utf-8")) <= MAX_ATTEMPT_TRACEBACK_BYTES
    first, _, rest = text.partition("\n")
    assert first.startswith("[... ") and "bytes of this traceback were dropped" in first
    assert str(MAX_ATTEMPT_TRACEBACK_BYTES) in first
    assert rest.endswith("x the end")


def test_show_json_lists_each_attempts_traceback(tmp_path: Path) -> None:
    cli = DagwerkCli(tmp_path, "shown.db")
    with Engine(cli.db, execution_root=tmp_path) as engine:
        engine.plugin("raises_chained")(plugins.raises_chained)
        run_id = _failed_run(engine, DagNode(slug="c", plugin="raises_chained"), "thread")
    described = cli.json("show", run_id)
    (task,) = described["tasks"]
    (attempt,) = task["attempts"]
    assert attempt["traceback"].endswith("ValueError: bad value ***")
