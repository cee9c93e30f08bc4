"""``ctx.logger`` keeps INFO records in the task log whatever the
application's logging configuration shows, through the Python API (a worker
the application starts, with the root logger at its default WARNING), and
the application's handlers see what they saw without dagwerk."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import task_log_plugins as plugins

from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.models import DagNode

SECRET = "s3cr3t-value-42"


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def app_handler() -> Iterator[_Recorder]:
    """The application's configuration: a root handler, the root at WARNING,
    dagwerk's task loggers left as they are (NOTSET)."""
    root, task = logging.getLogger(), logging.getLogger("dagwerk.task")
    saved = root.level, task.level
    root.setLevel(logging.WARNING)
    task.setLevel(logging.NOTSET)
    handler = _Recorder()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)
    root.setLevel(saved[0])
    task.setLevel(saved[1])


@pytest.mark.parametrize("executor", ["thread", "process"])
@pytest.mark.parametrize("url", ["sqlite", "memory"])
def test_info_records_are_kept_though_the_root_logger_drops_them(
    app_handler: _Recorder, tmp_path: Path, executor: str, url: str
) -> None:
    db = f"sqlite:///{tmp_path / 'levels.db'}" if url == "sqlite" else "memory://"
    with Engine(db, execution_root=tmp_path) as engine:
        engine.plugin("informs")(plugins.informs)
        worker = engine.worker(
            executor=executor, secret_resolver=lambda run_id, plugin: {"token": SECRET}
        )
        worker.start()
        try:
            run_id = engine.submit([DagNode(slug="i", plugin="informs")])
            assert engine.wait(run_id, timeout=120).status is RunStatus.COMPLETED
        finally:
            worker.stop()
        lines = engine.logs(run_id)
    assert [(line.level, line.message) for line in lines] == [
        ("INFO", "an info line with ***"),
        ("INFO", "an info line with its exception"),
        ("INFO", "an info line with its stack"),
        ("WARNING", "a warning line"),
    ]
    assert all(line.logger == "dagwerk.task.informs" for line in lines)
    assert lines[0].traceback is None
    assert lines[1].traceback is not None and "KeyError: 'kept'" in lines[1].traceback
    assert lines[2].traceback is not None and lines[2].traceback.startswith("Stack")
    assert "in informs" in lines[2].traceback
    if executor == "thread":
        # The application's handler saw the warning only, as the plugin's own
        # line (its function, not dagwerk's adapter).
        seen = [r for r in app_handler.records if r.name.startswith("dagwerk.task")]
        assert [(r.levelname, r.getMessage()) for r in seen] == [("WARNING", "a warning line")]
        assert seen[0].funcName == "informs"
        assert seen[0].pathname == plugins.__file__


def test_outside_an_attempt_ctx_logger_is_the_configured_logger(app_handler: _Recorder) -> None:
    from dagwerk.runtime.task_logs import task_logger

    logger = task_logger("informs")
    assert not logger.isEnabledFor(logging.INFO)
    logger.info("dropped")
    logger.warning("shown")
    assert [r.getMessage() for r in app_handler.records] == ["shown"]
