"""Running a batch of thread-executor attempts on as few threads as it needs.

A plugin thread per attempt costs two thread hand-offs under the GIL per
attempt, which for trivial plugins is most of a task's cost. Here the
attempts of a batch wait in a queue; runner threads (pooled daemon threads)
take them one after the other. The batch starts with one runner; whenever
every runner has been inside the same attempt for ``RAMP_SECONDS`` (real
time) while attempts still wait, one more runner starts, up to one per
attempt or the batch's parallelism, whichever is fewer. Trivial plugins
therefore run back to back on one thread, while slow ones fan out to full
parallelism within milliseconds.

Semantics are those of one thread per attempt:
- an attempt's deadline runs from the moment its plugin starts; when it
  passes, the attempt is settled as a timeout first and aborted at once
  (WK-10), and its runner is retired: it may stay inside the plugin, but a
  new runner takes over the queue, so a hung plugin only ever keeps its own
  thread;
- an attempt aborted before it starts never enters its plugin; one aborted
  while running is settled as cancelled and its runner retired the same way;
- a plugin's late result never replaces a settled outcome (first claim wins).

With ``flush``, results need not wait for the slowest attempt: once a
plugin has returned and ``FLUSH_SECONDS`` (real time) passed while other
attempts still run, the supervisor hands every result returned so far to
``flush`` (the batch path commits them as a group) and goes on supervising.
A batch whose attempts all return within that bound is handed back whole,
as without ``flush``. Only one wake-up of the supervisor is added per such
group (at its first result), not one per attempt.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from dagwerk.runtime._threads import spawn
from dagwerk.runtime.clock import Clock
from dagwerk.runtime.outcomes import ExecutionOutcome

__all__ = ["FLUSH_SECONDS", "RAMP_SECONDS", "BatchJob", "BatchSettlement", "run_batch"]


class _Signal(Protocol):
    def fire(self, reason: str) -> None: ...


class BatchJob(Protocol):
    """What the runners read of a job (the executors' ``AttemptJob``)."""

    @property
    def timeout(self) -> float | None: ...

    @property
    def signal(self) -> _Signal: ...


class BatchSettlement(Protocol):
    """A job's outcome, first claim wins (the executors' ``Settlement``)."""

    @property
    def outcome(self) -> ExecutionOutcome | None: ...

    def claim(self, outcome: ExecutionOutcome) -> bool: ...


Job = TypeVar("Job", bound=BatchJob)

_STOPPED = frozenset({"timeout", "cancelled"})

RAMP_SECONDS = 0.002
"""How long every runner must have been inside one attempt before another starts."""

FLUSH_SECONDS = 0.005
"""How long a returned result waits for the rest of its batch before it is
flushed on its own (with every other result returned meanwhile)."""


class _Runner:
    __slots__ = ("current", "retired", "since")

    def __init__(self) -> None:
        self.current: int | None = None
        self.since = 0.0  # real monotonic time the current attempt started
        self.retired = False


def run_batch(
    jobs: Sequence[Job],
    settlements: Sequence[BatchSettlement],
    wake: threading.Event,
    *,
    clock: Clock,
    call: Callable[[Job], ExecutionOutcome],
    timeout_outcome: Callable[[float | None], ExecutionOutcome],
    parallelism: int | None = None,
    observe: Callable[[int, float], object] | None = None,
    flush: Callable[[list[tuple[int, ExecutionOutcome]]], object] | None = None,
) -> None:
    """Run every job not yet settled; return once each one is settled.

    At most ``parallelism`` runners are inside plugins at once (``None``:
    one per job). ``observe(index, seconds)`` is told, on the runner's
    thread, how long (real time) each job's call took once it returned.
    ``flush([(index, outcome), ...])`` is called on this thread with the
    jobs whose plugin returned and whose result waited ``FLUSH_SECONDS``
    while others still run (each job at most once; see the module)."""
    lock = threading.Lock()
    waiting = deque(i for i, s in enumerate(settlements) if s.outcome is None)
    started: dict[int, float] = {}  # job index -> clock time its plugin started
    runners: list[_Runner] = []
    # Jobs whose plugin returned and that are not flushed yet, and the real
    # time the first of them returned (None: none waits).
    returned: list[int] = []
    first_returned: list[float | None] = [None]

    def serve(runner: _Runner) -> None:
        while True:
            with lock:
                if runner.retired or not waiting:
                    runner.current = None
                    return
                index = waiting.popleft()
                if settlements[index].outcome is not None:
                    continue  # aborted before it started: never enters the plugin
                runner.current = index
                runner.since = time.monotonic()
                started[index] = clock.monotonic()
            outcome = call(jobs[index])
            if observe is not None:
                observe(index, time.monotonic() - runner.since)
            won = settlements[index].claim(outcome)
            first = False
            with lock:
                runner.current = None
                if won and flush is not None:
                    returned.append(index)
                    if first_returned[0] is None:
                        first_returned[0] = time.monotonic()
                        first = True
            if first:
                wake.set()  # the supervisor times this group's flush

    def add_runner() -> None:
        runner = _Runner()
        runners.append(runner)
        spawn(
            lambda: serve(runner),
            name=f"dagwerk-attempts-{len(runners)}",
            wait_started=False,
        )

    limit = len(waiting) if parallelism is None else min(len(waiting), parallelism)
    with lock:
        if waiting:
            add_runner()
    while True:
        now = clock.monotonic()
        with lock:
            for runner in runners:
                index = runner.current
                if index is None or runner.retired:
                    continue
                job, settlement = jobs[index], settlements[index]
                deadline = None if job.timeout is None else started[index] + job.timeout
                overdue = deadline is not None and deadline <= now
                # Settled as a timeout first, then aborted at once (WK-10); a
                # result or an abort that got there first wins instead.
                if (
                    settlement.outcome is None
                    and overdue
                    and settlement.claim(timeout_outcome(job.timeout))
                ):
                    job.signal.fire(f"timeout {job.timeout}s")
                outcome = settlement.outcome
                if outcome is not None and outcome.kind.value in _STOPPED:
                    # Settled while its plugin may still run (timed out or
                    # aborted): the runner is left to it, another takes over.
                    runner.retired = True
            active = [r for r in runners if not r.retired]
            if waiting and (
                not any(r.current is None for r in active)
                and all(time.monotonic() - r.since >= RAMP_SECONDS for r in active)
                and len(active) < limit
            ):
                add_runner()
            pending = [i for i, s in enumerate(settlements) if s.outcome is None]
            if not pending:
                return
            deadlines = [
                started[i] + t
                for i in pending
                if i in started and (t := jobs[i].timeout) is not None
            ]
            queued = bool(waiting)
            due: list[int] = []
            flush_in: float | None = None
            if first_returned[0] is not None:
                flush_in = first_returned[0] + FLUSH_SECONDS - time.monotonic()
                if flush_in <= 0:
                    due, returned[:] = list(returned), []
                    first_returned[0] = None
                    flush_in = None
        if due and flush is not None:
            # Others still run: these commit without waiting for them.
            flush([(i, outcome) for i in due if (outcome := settlements[i].outcome) is not None])
            continue
        remaining = min(deadlines) - now if deadlines else None
        if queued or flush_in is not None:
            # Attempts still wait for a runner (look again after the ramp
            # interval), or a result waits for its flush: real time, whatever
            # the clock (a fake clock must not keep a batch from fanning out
            # or its results from committing).
            step = min(
                s
                for s in (
                    RAMP_SECONDS if queued else None,
                    flush_in,
                    None if remaining is None else max(remaining, 0.0),
                )
                if s is not None
            )
            wake.wait(step)
        else:
            clock.wait(wake, remaining)
        wake.clear()
