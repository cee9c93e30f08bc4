"""A process for the multi-process schedule tests: ``schedule URL HOLDER``
runs a scheduler until the stop file appears (with ``KILL_AFTER=N`` it kills
itself with SIGKILL right after its N-th tick commits, before the run
starts); ``submit URL KEY`` submits once with an idempotency key when the go
file appears and prints the run ID."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from dagwerk.engine import Engine
from dagwerk.scheduling.scheduler import Scheduler
from dagwerk.store import ScheduleFire
from dagwerk.testing.helpers import root


def _wait_for(path: Path, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.005)


def schedule(url: str, holder: str, stop: Path) -> None:
    kill_after = int(os.environ.get("KILL_AFTER", "0"))
    fired: list[ScheduleFire] = []

    def on_fire(fire: ScheduleFire) -> None:
        fired.append(fire)
        if kill_after and len(fired) >= kill_after:
            print(f"killing at {fire.tick}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    with Engine(url) as engine:
        scheduler = Scheduler(engine.store, holder=holder, lease_seconds=2.0, on_fire=on_fire)
        print("ready", flush=True)
        while not stop.exists():
            scheduler.run_pass()
            time.sleep(0.05)
        scheduler.release()


def submit(url: str, key: str, go: Path) -> None:
    with Engine(url) as engine:
        print("ready", flush=True)
        _wait_for(go)
        print(engine.submit([root("a")], {"order": key}, idempotency_key=key), flush=True)


if __name__ == "__main__":
    mode, url, name, path = sys.argv[1:5]
    if mode == "schedule":
        schedule(url, name, Path(path))
    else:
        submit(url, name, Path(path))
