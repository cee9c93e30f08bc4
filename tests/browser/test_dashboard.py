"""The dashboard in a real headless Chromium, used the way a person uses it:
open the overview, open a failed run, see the failed node in red, retry
from it and watch it turn green without a reload, resume a waiting task
from its form, re-inject a dead letter; ``--read-only`` hides the buttons
and refuses the POST; off loopback the token is demanded."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import browser_support
import pytest
from browser_support import Browser, Served

from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.testing.web import Demo, register_demo_plugins, seed_demo

WAIT = 30.0

# The suite's fixtures (see browser_support).
serve = browser_support.serve
browser = browser_support.browser


@pytest.fixture
def demo_db(tmp_path: Path) -> tuple[str, Demo]:
    db = f"sqlite:///{tmp_path / 'browser.db'}"
    with Engine(db, backstop_interval=None) as engine:
        demo = seed_demo(engine, tmp_path / "fail")
    return db, demo


@pytest.fixture
def worker_engine(demo_db: tuple[str, Demo], tmp_path: Path) -> Iterator[Engine]:
    """An engine with the demo plugins, to work what the browser queued."""
    with Engine(demo_db[0], backstop_interval=None) as engine:
        register_demo_plugins(engine, tmp_path / "fail")
        yield engine


def until(browser: Browser, check: Callable[[Any], Any], what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser.driver, WAIT, poll_frequency=0.1).until(check, message=what)


def css(browser: Browser, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return browser.driver.find_element(By.CSS_SELECTOR, selector)


def all_css(browser: Browser, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(browser.driver.find_elements(By.CSS_SELECTOR, selector))


def attr(browser: Browser, selector: str, name: str) -> str | None:
    """An attribute read in one script (the live part of a page is replaced
    while it polls, so a located element can go stale)."""
    found = browser.driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        "return e === null ? null : e.getAttribute(arguments[1]);",
        selector,
        name,
    )
    return None if found is None else str(found)


def node_fill(browser: Browser, slug: str) -> str:
    return str(
        browser.driver.execute_script(
            "return getComputedStyle(document.querySelector("
            "'g[data-node=\"' + arguments[0] + '\"] rect')).stroke;",
            slug,
        )
    )


RED = "rgb(214, 51, 108)"
GREEN = "rgb(47, 158, 68)"


def test_the_overview_shows_the_runs_and_the_dead_letter_queue(
    demo_db: tuple[str, Demo], serve: Callable[..., Served], browser: Browser
) -> None:
    served = serve(demo_db[0])
    browser.open(served.url + "/")
    assert css(browser, "h1").text == "Overview"
    cards = {c.text.split("\n")[1]: c.text.split("\n")[0] for c in all_css(browser, ".card")}
    assert cards["failed"] == "1" and cards["completed"] == "1" and cards["running"] == "2"
    assert css(browser, "#dlq-waiting").text == "1"


def test_retry_from_the_failed_node_turns_it_green_without_a_reload(
    demo_db: tuple[str, Demo],
    serve: Callable[..., Served],
    browser: Browser,
    worker_engine: Engine,
    tmp_path: Path,
) -> None:
    served = serve(demo_db[0])
    browser.open(served.url + "/runs")
    css(browser, 'tr[data-run="run-failed"] a').click()
    until(browser, lambda d: "run-failed" in d.current_url, "the run page")
    browser.snap("failed run")
    assert attr(browser, 'g[data-node="work"]', "data-state") == "failed"
    assert node_fill(browser, "work") == RED
    assert node_fill(browser, "fan") == GREEN
    browser.driver.execute_script("window.__noReload = 'kept';")
    (tmp_path / "fail").unlink()  # the retried attempt succeeds
    css(browser, 'input[name="nodes"][value="work"]').click()
    css(browser, "#retry-from").click()
    until(
        browser,
        lambda d: attr(browser, "[data-run-status]", "data-run-status") == "running",
        "the run reopened",
    )
    worker_engine.worker(concurrency=2, backstop_interval=None).run_until_idle()
    until(
        browser,
        lambda d: attr(browser, 'g[data-node="work"]', "data-state") == "done",
        "the work node turned done",
    )
    browser.snap("retried run")
    assert node_fill(browser, "work") == GREEN
    assert browser.driver.execute_script("return window.__noReload;") == "kept"
    until(
        browser,
        lambda d: attr(browser, "[data-run-status]", "data-run-status") == "completed",
        "the run completed",
    )


def test_resume_a_waiting_task_from_its_form(
    demo_db: tuple[str, Demo],
    serve: Callable[..., Served],
    browser: Browser,
    worker_engine: Engine,
) -> None:
    served = serve(demo_db[0])
    browser.open(served.url + "/runs/run-waiting")
    assert attr(browser, 'g[data-node="ask"]', "data-state") == "waiting"
    box = css(browser, 'tr[data-wait="approval"] textarea')
    box.send_keys('{"approved": true}')
    css(browser, 'tr[data-wait="approval"] button').click()
    until(browser, lambda d: css(browser, "#flash").text == "done", "the resume answered")
    worker_engine.worker(concurrency=1, backstop_interval=None).run_until_idle()
    until(
        browser,
        lambda d: attr(browser, "[data-run-status]", "data-run-status") == "completed",
        "the run completed",
    )
    (task,) = [t for t in worker_engine.list_tasks("run-waiting") if t.node_index == 0]
    (wait,) = worker_engine.task_waits(task.task_id)
    assert wait.state == "resolved" and wait.response == {"approved": True}


def test_reinject_a_dead_letter(
    demo_db: tuple[str, Demo],
    serve: Callable[..., Served],
    browser: Browser,
    worker_engine: Engine,
) -> None:
    db, demo = demo_db
    served = serve(db)
    browser.open(served.url + "/dead-letters")
    row = f'tr[data-letter="{demo.dead_letter_id}"]'
    css(browser, f"{row} button").click()
    until(browser, lambda d: all_css(browser, f"{row} .reinjected"), "re-injected")
    browser.snap("re-injected")
    (letter,) = worker_engine.list_dead_letters(demo.letter_run)
    assert letter.reinjected_attempt_id is not None
    worker_engine.worker(concurrency=1, backstop_interval=None).run_until_idle()
    assert worker_engine.get_run(demo.letter_run).status is RunStatus.COMPLETED  # type: ignore[union-attr]


FETCH = """
const done = arguments[arguments.length - 1];
fetch(arguments[0], {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{}'})
  .then(r => done(r.status)).catch(e => done(String(e)));
"""


def test_read_only_hides_the_buttons_and_refuses_the_post(
    demo_db: tuple[str, Demo], serve: Callable[..., Served], browser: Browser
) -> None:
    served = serve(demo_db[0], "--read-only")
    browser.open(served.url + "/runs/run-failed")
    assert css(browser, "#read-only").text == "read-only"
    assert all_css(browser, "button") == [] and all_css(browser, "input[type=checkbox]") == []
    browser.open(served.url + "/runs/run-waiting")
    assert all_css(browser, "textarea") == [] and all_css(browser, "button") == []
    browser.open(served.url + "/dead-letters")
    assert all_css(browser, "button") == []
    status = browser.driver.execute_async_script(FETCH, "/api/runs/run-failed/retry")
    assert status == 403


def test_off_loopback_the_token_is_demanded(
    demo_db: tuple[str, Demo], serve: Callable[..., Served], browser: Browser, tmp_path: Path
) -> None:
    db = demo_db[0]
    refused = subprocess.run(
        [sys.executable, "-m", "dagwerk", "serve", "--db", db, "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
        check=False,
    )
    assert refused.returncode == 2 and "DAGWERK_UI_TOKEN" in refused.stderr
    token = secrets.token_urlsafe(24)
    served = serve(db, host="0.0.0.0", env={"DAGWERK_UI_TOKEN": token})
    browser.open(served.url + "/runs")
    until(browser, lambda d: "/login" in d.current_url, "the login page")
    status = browser.driver.execute_async_script(
        "const done = arguments[0]; fetch('/api/runs').then(r => done(r.status));"
    )
    assert status == 401
    css(browser, 'input[name="token"]').send_keys("not-the-token-at-all")
    css(browser, "#login button").click()
    until(browser, lambda d: all_css(browser, "#login-failed"), "the refusal")
    css(browser, 'input[name="token"]').send_keys(token)
    css(browser, "#login button").click()
    until(browser, lambda d: d.current_url.endswith("/runs"), "the runs page")
    assert "run-failed" in browser.driver.page_source
    cookies = {c["name"]: c for c in browser.driver.get_cookies()}
    assert cookies["dagwerk_session"]["httpOnly"] is True
    assert token not in cookies["dagwerk_session"]["value"]
