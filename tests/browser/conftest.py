"""Fixtures of the browser suite: a ``dagwerk serve`` process over a demo
database, and a headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by Selenium. Nothing is downloaded: the browser
and its driver are the system's binaries.

Without them the suite is skipped, except in CI (``CI`` set), where it
fails: a broken browser setup must never pass as green. A failing test
leaves a screenshot of each page it opened and the last page's HTML in its
temporary folder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import (
    CHROMEDRIVER,
    CHROMIUM,
    FLAGS,
    Browser,
    Served,
    require_chromium,
    start_serve,
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.stash[_FAILED] = report.failed


_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def make(db: str, *args: str, **options: Any) -> Served:
        served = start_serve(db, tmp_path, *args, **options)
        started.append(served)
        return served

    yield make
    for served in started:
        served.stop()


@pytest.fixture
def browser(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Browser]:
    require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(30)
    wrapped = Browser(driver)
    try:
        yield wrapped
    finally:
        if request.node.stash.get(_FAILED, False):
            wrapped.save(tmp_path)
        driver.quit()
