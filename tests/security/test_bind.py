"""The metrics/health server listens on the loopback address unless told
otherwise.

``HealthServer`` binds 127.0.0.1 by default; ``dagwerk serve`` does too
(``--host`` is the explicit way out) and ``dagwerk worker --metrics-port``
always does. On Linux every 127.x.y.z address is loopback, so a server bound
to 127.0.0.1 refuses a connection to 127.0.0.2 while one bound to 0.0.0.0
(an explicit choice) accepts it: the test tells "bound to 127.0.0.1" from
"bound everywhere" by behaviour, not only by the reported address.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dagwerk.health import DEFAULT_HOST, HealthServer, HealthState
from dagwerk.metrics import Metrics

linux_loopback = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="127.0.0.2 is loopback on Linux"
)


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def _server(**options: object) -> HealthServer:
    return HealthServer(Metrics(), HealthState(store=None), port=0, **options)  # type: ignore[arg-type]


def test_the_health_server_binds_loopback_by_default() -> None:
    assert DEFAULT_HOST == "127.0.0.1"
    with _server() as server:
        assert server.host == "127.0.0.1"
        assert server.url.startswith("http://127.0.0.1:")
        assert _reachable("127.0.0.1", server.port)


@linux_loopback
def test_a_default_server_is_not_reachable_on_another_address() -> None:
    with _server() as server:
        assert not _reachable("127.0.0.2", server.port)


@linux_loopback
def test_binding_elsewhere_is_an_explicit_option() -> None:
    with _server(host="0.0.0.0") as server:
        assert server.host == "0.0.0.0"
        assert _reachable("127.0.0.2", server.port)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _announced(proc: subprocess.Popen[str], pattern: str, timeout: float = 60) -> re.Match[str]:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    raise AssertionError("no announcement: " + "".join(lines))


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM")
@pytest.mark.parametrize("command", ["serve", "worker"])
def test_the_cli_servers_bind_loopback_by_default(tmp_path: Path, command: str) -> None:
    port = _free_port()
    db = f"sqlite:///{tmp_path / 'm.db'}"
    args = (
        ["serve", "--port", str(port), "--backstop-interval", "0"]
        if command == "serve"
        else ["worker", "--metrics-port", str(port), "--backstop-interval", "0"]
    )
    env = {k: v for k, v in os.environ.items() if k != "DAGWERK_DB"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagwerk", *args, "--db", db],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    try:
        found = _announced(proc, r"http://([0-9.]+):(\d+)/metrics")
        assert found.group(1) == "127.0.0.1" and int(found.group(2)) == port
        assert _reachable("127.0.0.1", port)
        if sys.platform.startswith("linux"):
            assert not _reachable("127.0.0.2", port)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=10)
