"""A running task's page in headless Chromium: its stored log lines show
when the page opens, and a line the task logs later appears without a
reload."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import browser_support
from browser_support import Browser, Served

from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.models import DagNode

WAIT = 10.0

serve = browser_support.serve
browser = browser_support.browser


def messages(browser: Browser) -> list[str]:
    found = browser.driver.execute_script(
        "return Array.from(document.querySelectorAll('#log-lines .message'))"
        ".map(function (e) { return e.textContent; });"
    )
    return [str(text) for text in found]


def until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_running_tasks_new_log_line_appears_without_a_reload(
    tmp_path: Path, serve: Callable[..., Served], browser: Browser
) -> None:
    db = f"sqlite:///{tmp_path / 'logs.db'}"
    go_on = threading.Event()
    with Engine(db, backstop_interval=None) as engine:

        @engine.plugin("two_lines")
        def two_lines(inputs: Any, ctx: Any) -> dict[str, object]:
            ctx.logger.warning("<i>first</i> line")
            if not go_on.wait(WAIT * 2):
                raise RuntimeError("the test never let the task go on")
            ctx.logger.warning("second line")
            return {}

        run_id = engine.submit([DagNode(slug="talk", plugin="two_lines")], run_id="run-talk")
        (task,) = engine.list_tasks(run_id)
        worker = engine.worker(concurrency=1, backstop_interval=None)
        working = threading.Thread(target=worker.run_until_idle, daemon=True)
        working.start()
        try:
            until(lambda: engine.logs(run_id), "the first line stored")
            served = serve(db)
            browser.open(f"{served.url}/tasks/{task.task_id}")
            assert messages(browser) == ["<i>first</i> line"]
            browser.driver.execute_script("window.__noReload = 'kept';")
            go_on.set()
            until(lambda: len(messages(browser)) == 2, "the second line on the page")
            browser.snap("task logs")
            assert messages(browser) == ["<i>first</i> line", "second line"]
            assert browser.driver.execute_script("return window.__noReload;") == "kept"
        finally:
            go_on.set()
            working.join(WAIT * 2)
        assert engine.get_run(run_id).status is RunStatus.COMPLETED  # type: ignore[union-attr]
