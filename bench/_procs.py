"""Processes of the benchmark suite: workers, the submitter, and profiling.

* Workers are real ``dagwerk worker`` processes (``python -m dagwerk worker
  --db URL --plugins bench.workloads --concurrency N``), started before the
  clock and stopped with SIGTERM after it. With ``profile=PATH`` the same
  command runs under :func:`profiled_cli`, which profiles every thread of
  the process (cProfile is per thread in Python 3.11) and writes the merged
  statistics to PATH at exit.
* The submitter is a separate process (``python -m bench._procs submit
  ...``) so its peak RSS is its own: it submits the workload, waits for every
  run to be terminal and prints one JSON line (times come from the runs'
  ``created``/``finished_at`` stamps in the store and the submitter's clock,
  both ``time.time()``).

Run as a module this file is the entry point of both child kinds.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = [ROOT / "src"]
"""Where the children import dagwerk from (``--src`` of bench/run.py replaces it)."""

__all__ = [
    "WorkerProcs",
    "peak_rss_mb",
    "profiled_cli",
    "run_client",
    "run_submitter",
]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), str(SRC[0]), env.get("PYTHONPATH", "")) if p
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set (``VmHWM``) in MiB, or ``None`` once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


@dataclass
class WorkerProcs:
    """``count`` worker processes serving ``url``, with their logs in ``directory``."""

    url: str
    count: int
    directory: Path
    concurrency: int | None = 4
    """``--concurrency`` of each worker; ``None``: no flag (the worker's default)."""
    executor: str = "thread"
    profile: Path | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    peak_rss: list[float] = field(default_factory=list)

    def start(self, ready_timeout: float = 60.0) -> None:
        """Start the workers and return once each has said it is serving."""
        args = [
            "worker",
            "--db",
            self.url,
            "--plugins",
            "bench.workloads",
            *(["--concurrency", str(self.concurrency)] if self.concurrency is not None else []),
            *(["--executor", self.executor] if self.executor != "thread" else []),
        ]
        for n in range(self.count):
            log = (self.directory / f"worker-{n}.log").open("wb")
            if self.profile is not None:
                prof = self.profile.with_name(f"{self.profile.stem}-{n}{self.profile.suffix}")
                command = [sys.executable, "-m", "bench._procs", "profile", str(prof), *args]
            else:
                command = [sys.executable, "-m", "dagwerk", *args]
            self.procs.append(
                subprocess.Popen(
                    command,
                    cwd=self.directory,
                    env=_child_env(),
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            )
            log.close()
        deadline = time.monotonic() + ready_timeout
        for n, proc in enumerate(self.procs):
            log_path = self.directory / f"worker-{n}.log"
            while "serving" not in log_path.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"worker {n} did not start:\n{log_path.read_text()}")
                time.sleep(0.02)

    def stop(self, timeout: float = 60.0) -> None:
        """Record each worker's peak RSS, then SIGTERM and wait for it."""
        self.peak_rss = [peak_rss_mb(p.pid) or 0.0 for p in self.procs]
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def errors(self) -> str:
        """Tracebacks the workers logged (empty when there were none)."""
        found = []
        for n in range(len(self.procs)):
            text = (self.directory / f"worker-{n}.log").read_text(errors="replace")
            if "Traceback" in text:
                found.append(f"worker {n}:\n{text[-4000:]}")
        return "\n".join(found)


def run_submitter(url: str, workload: str, size: int, directory: Path, profile: Path | None) -> Any:
    """Run the submitter child for ``workload`` and return its JSON result."""
    command = [sys.executable, "-m", "bench._procs", "submit", url, workload, str(size)]
    if profile is not None:
        command += ["--profile", str(profile)]
    done = subprocess.run(
        command, cwd=directory, env=_child_env(), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"submitter failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_client(url: str, workload: str, size: int, directory: Path) -> Any:
    """Run the client child (``Engine.submit`` then ``Engine.wait``) for
    ``workload`` and return its JSON result."""
    command = [sys.executable, "-m", "bench._procs", "client", url, workload, str(size)]
    done = subprocess.run(
        command, cwd=directory, env=_child_env(), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"client failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- child entry points ------------------------------------------------------------------


def profiled_cli(out: Path, argv: Sequence[str]) -> None:
    """Run ``dagwerk argv`` with every thread profiled; merged stats go to ``out``."""
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()
    original_run = threading.Thread.run

    def run(self: threading.Thread) -> None:
        profiler = cProfile.Profile()
        with lock:
            profiles.append(profiler)
        profiler.enable()
        try:
            original_run(self)
        finally:
            profiler.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    main = cProfile.Profile()
    from dagwerk.cli import main as dagwerk_main

    main.enable()
    try:
        dagwerk_main(list(argv))
    except SystemExit:
        pass
    finally:
        main.disable()
        stats = pstats.Stats(main)
        with lock:
            for profiler in profiles:
                # A profiler whose thread still runs is disabled by its own
                # thread only; its figures so far are what we have.
                try:
                    stats.add(profiler)
                except TypeError:
                    continue
        stats.dump_stats(str(out))


SUBMITTER_POLL = 0.05
"""How often the submitter reads the last pending run (seconds). The figures
come from the runs' stored ``finished_at``, so this adds nothing to them; a
tighter poll (10 ms, say) only takes CPU from the workers on 2 cores."""


def _submit(url: str, workload: str, size: int, profile: str | None) -> None:
    from bench.workloads import chain_nodes, fanout_nodes, small_run_nodes
    from dagwerk.engine import Engine

    profiler = cProfile.Profile() if profile else None
    engine = Engine(url, execution_root=Path.cwd(), poll_interval=SUBMITTER_POLL)
    store = engine.store
    if profiler is not None:
        profiler.enable()
    began = time.time()
    if workload == "fanout":
        run_ids = [engine.submit(fanout_nodes(), {"count": size}, run_id="fanout")]
    elif workload == "chain":
        run_ids = [engine.submit(chain_nodes(size), {}, run_id="chain")]
    elif workload == "many":
        nodes = small_run_nodes()
        run_ids = [engine.submit(nodes, {}, run_id=f"many-{n:06d}") for n in range(size)]
    else:
        raise SystemExit(f"unknown workload {workload!r}")
    submitted = time.time()
    pending = list(run_ids)
    pause: Callable[[float], bool] = threading.Event().wait
    while pending:
        record = store.get_run(pending[-1])
        if record is None or record.finished_at is None:
            pause(SUBMITTER_POLL)
            continue
        pending.pop()
    if profiler is not None and profile is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    records = [store.get_run(run_id) for run_id in run_ids]
    statuses = sorted({str(r.status) for r in records if r is not None})
    finished = max(r.finished_at or 0.0 for r in records if r is not None)
    tasks = sum(len(store.list_tasks(run_id)) for run_id in run_ids)
    engine.close()
    result = {
        "runs": len(run_ids),
        "tasks": tasks,
        "statuses": statuses,
        "submit_seconds": submitted - began,
        "seconds": finished - began,
        "submitter_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(json.dumps(result))


def _client(url: str, workload: str, size: int) -> None:
    """What a user's program sees: ``Engine.submit``, then ``Engine.wait``
    (its default poll), which returns once the run is terminal with its
    result read back. The clock (``time.perf_counter``, this process only)
    runs from before the submit to the result in hand."""
    from bench.workloads import chain_nodes, fanout_nodes
    from dagwerk.engine import Engine

    nodes = chain_nodes(size) if workload == "chain" else fanout_nodes()
    run_input: dict[str, object] = {} if workload == "chain" else {"count": size}
    engine = Engine(url, execution_root=Path.cwd())
    try:
        began = time.perf_counter()
        run_id = engine.submit(nodes, run_input, run_id=workload)
        result = engine.wait(run_id, timeout=600.0)
        seconds = time.perf_counter() - began
        tasks = len(engine.store.list_tasks(run_id))
        print(
            json.dumps(
                {
                    "seconds": seconds,
                    "tasks": tasks,
                    "status": result.status.value,
                    "outputs": sum(len(v) for v in result.outputs.values()),
                }
            )
        )
    finally:
        engine.close()


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "profile":
        profiled_cli(Path(args[1]), args[2:])
        return
    parser = argparse.ArgumentParser(prog="python -m bench._procs submit|client")
    parser.add_argument("kind", choices=["submit", "client"])
    parser.add_argument("url")
    parser.add_argument("workload", choices=["fanout", "chain", "many"])
    parser.add_argument("size", type=int)
    parser.add_argument("--profile")
    parsed = parser.parse_args(args)
    if parsed.kind == "client":
        _client(parsed.url, parsed.workload, parsed.size)
        return
    _submit(parsed.url, parsed.workload, parsed.size, parsed.profile)


if __name__ == "__main__":
    main()
