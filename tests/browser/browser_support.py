"""Helpers of the browser suite: the system's Chromium and its driver, a
``dagwerk serve`` process over a demo database, and a browser that keeps a
screenshot of each page it opens. Nothing is downloaded: the browser and
its driver are Debian's ``chromium`` and ``chromium-driver``.

Without them the suite is skipped, except in CI (``CI`` set), where it
fails: a broken browser setup must never pass as green. A failing test
leaves a screenshot of each page it opened and the last page's HTML in its
temporary folder. The fixtures live here, not in a ``conftest.py``, so this
directory adds no second module named ``conftest`` to the test run.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "CHROMEDRIVER",
    "CHROMIUM",
    "FLAGS",
    "Browser",
    "Served",
    "browser",
    "require_chromium",
    "serve",
    "start_serve",
]

CHROMIUM = Path(os.environ.get("DAGWERK_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("DAGWERK_CHROMEDRIVER", "/usr/bin/chromedriver"))
STARTUP_TIMEOUT = 60.0
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


def require_chromium() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if not missing:
        return
    hint = "apt-get install -y chromium chromium-driver"
    if os.environ.get("CI"):
        pytest.fail(f"browser tests need {', '.join(missing)} in CI ({hint})")
    pytest.skip(f"no {', '.join(missing)} ({hint})")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Served:
    """A running ``dagwerk serve``; ``url`` is where a browser reaches it."""

    proc: subprocess.Popen[str]
    url: str
    stderr: list[str]
    reader: threading.Thread

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=10)
        return int(self.proc.returncode)


def start_serve(
    db: str, cwd: Path, *args: str, env: dict[str, str] | None = None, host: str = "127.0.0.1"
) -> Served:
    """``dagwerk serve`` on a free port; returns once it announced itself."""
    port = free_port()
    full_env = {
        **{k: v for k, v in os.environ.items() if k not in ("DAGWERK_DB", "DAGWERK_UI_TOKEN")},
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagwerk",
            "serve",
            "--db",
            db,
            "--port",
            str(port),
            "--host",
            host,
            "--backstop-interval",
            "0",
            *args,
        ],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    seen: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        with proc.stderr:
            for line in proc.stderr:
                seen.append(line)
                lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while True:
        try:
            line = lines.get(timeout=STARTUP_TIMEOUT)
        except queue.Empty:
            proc.kill()
            pytest.fail(f"serve did not announce itself: {''.join(seen)}")
        if line is None:
            pytest.fail(f"serve exited ({proc.wait()}): {''.join(seen)}")
        if "serving the dashboard" in line:
            return Served(proc, f"http://127.0.0.1:{port}", seen, reader)


class Browser:
    """The driver, with a screenshot of each page it opened (written to the
    test's folder if the test fails)."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.shots: list[tuple[str, bytes]] = []

    def open(self, url: str) -> None:
        self.driver.get(url)
        self.snap(url)

    def snap(self, label: str) -> None:
        self.shots.append((label, self.driver.get_screenshot_as_png()))

    def save(self, folder: Path) -> None:
        self.snap("at failure")
        for number, (label, png) in enumerate(self.shots):
            (folder / f"page-{number:02d}.png").write_bytes(png)
            with (folder / "pages.txt").open("a", encoding="utf-8") as index:
                index.write(f"page-{number:02d}.png {label}\n")
        (folder / "failure.html").write_text(self.driver.page_source, encoding="utf-8")


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
    failures_before = request.session.testsfailed
    try:
        yield wrapped
    finally:
        # The call phase's report is counted before fixtures are torn down.
        if request.session.testsfailed > failures_before:
            wrapped.save(tmp_path)
        driver.quit()
