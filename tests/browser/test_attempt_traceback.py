"""A failed task's page in headless Chromium: each failed attempt's traceback
is folded under its error and opens as text (a hostile message renders as
text; the secret it held is masked in the traceback)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import browser_support
from browser_support import Browser, Served

from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.models import DagNode, RetryPolicySpec

SECRET = "tb-secret-value-77"

serve = browser_support.serve
browser = browser_support.browser


def test_each_failed_attempts_traceback_opens_under_its_error(
    tmp_path: Path, serve: Callable[..., Served], browser: Browser
) -> None:
    db = f"sqlite:///{tmp_path / 'tb.db'}"
    with Engine(db, backstop_interval=None) as engine:

        @engine.plugin("explodes")
        def explodes(inputs: Any, ctx: Any) -> dict[str, object]:
            raise ValueError(f"<script>window.__pwned = 1</script> {ctx.secrets['token']}")

        retry = RetryPolicySpec(max_attempts=2, backoff_base=0.0, backoff_max=0.0)
        node = DagNode(slug="boom", plugin="explodes", retry=retry)
        run_id = engine.submit([node], run_id="run-tb")
        worker = engine.worker(
            concurrency=1,
            backstop_interval=None,
            secret_resolver=lambda run_id, plugin: {"token": SECRET},
        )
        worker.run_until_idle()
        assert engine.get_run(run_id).status is RunStatus.FAILED  # type: ignore[union-attr]
        (task,) = engine.list_tasks(run_id)
    served = serve(db)
    browser.open(f"{served.url}/tasks/{task.task_id}")
    folded = browser.driver.find_elements("css selector", "details.attempt-traceback")
    assert len(folded) == 2  # one per failed attempt
    text = folded[0].find_element("css selector", "pre")
    assert not text.is_displayed()
    folded[0].find_element("css selector", "summary").click()
    assert text.is_displayed()
    shown = text.text
    assert shown.startswith("Traceback (most recent call last):")
    assert "in explodes" in shown
    assert "ValueError: <script>window.__pwned = 1</script> ***" in shown
    assert SECRET not in shown
    assert browser.driver.execute_script("return window.__pwned === undefined;")
    browser.snap("attempt traceback")
