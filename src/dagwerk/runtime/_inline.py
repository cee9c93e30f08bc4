"""Running a lone attempt's plugin on the worker's loop thread.

A batch of one attempt (each step of a chain, say) spent a good part of its
hop on two thread hand-offs: the loop thread woke a runner thread for the
plugin, and the runner woke the loop thread with the result. Here the loop
thread runs the plugin itself, and a supervisor thread stands by, woken only
when it has something to do: an abort, or a deadline to keep.

The semantics are those of a runner thread (see ``runtime/_batch_exec.py``):

- the deadline runs from the moment the plugin starts; when it passes, the
  attempt is settled as a timeout first and then aborted (WK-10);
- an attempt aborted before it starts never enters its plugin; one aborted
  while it runs (cancellation, worker stop) is settled as cancelled at once;
- a plugin's late result never replaces a settled outcome.

When an attempt is settled while its plugin is still running, the
supervisor hands the rest of the step to a new loop thread
(:meth:`~dagwerk.runtime.actor.AdvancementActor.hand_over`), so a plugin
that ignores its abort keeps only the thread it runs on, as a runner would.
When such a plugin returns at last, its thread leaves the loop
(:class:`~dagwerk.runtime.actor.LoopHandedOver`).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable

from dagwerk.runtime.actor import LoopHandedOver
from dagwerk.runtime.clock import Clock
from dagwerk.runtime.executors import (
    AttemptJob,
    ExecutionOutcome,
    OutcomeKind,
    Settlement,
    call_job,
    cancelled_outcome,
    pre_aborted,
    timeout_outcome,
)

__all__ = ["InlineRunner"]


class _NoWake:
    """A settlement's waker that wakes nobody: the loop thread claims its own
    result and needs no wake-up, and the other claimants wake the supervisor
    themselves."""

    @staticmethod
    def set() -> None:
        return None


_NO_WAKE = _NoWake()


class _Inline:
    __slots__ = ("handed_over", "job", "on_hand_over", "settlement", "started")

    def __init__(self, job: AttemptJob, on_hand_over: Callable[[ExecutionOutcome], None]) -> None:
        self.job = job
        self.on_hand_over = on_hand_over
        self.settlement = Settlement(_NO_WAKE)
        self.started = 0.0  # clock time the plugin started
        self.handed_over = False


class InlineRunner:
    """Runs one attempt at a time on the calling (loop) thread; see the module."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._current: _Inline | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    def run(
        self, job: AttemptJob, on_hand_over: Callable[[ExecutionOutcome], None]
    ) -> ExecutionOutcome:
        """Run ``job``'s plugin here; its settled outcome.

        ``on_hand_over(outcome)`` runs on the supervisor thread when the
        attempt is settled (timeout, abort) while its plugin still runs: it
        must carry on with ``outcome`` elsewhere, as this call then never
        returns: once the plugin is over it raises :class:`LoopHandedOver`.
        """
        early = pre_aborted(job.signal)
        if early is not None:
            return early
        inline = _Inline(job, on_hand_over)
        with self._lock:
            self._current = inline
            inline.started = self._clock.monotonic()

        def aborted(reason: str) -> None:
            self._aborted(inline, reason)

        job.signal.bind(aborted)
        try:
            if job.timeout is not None:
                self._poke()  # the supervisor keeps the deadline
            outcome = None
            if inline.settlement.outcome is None:  # aborted in between: never entered
                # A fresh context per attempt, as on a runner thread: nothing a
                # plugin sets in a context variable reaches the next one.
                outcome = contextvars.Context().run(call_job, job)
        finally:
            # The plugin is over, so an abort has nothing left to settle. Bound,
            # the listener tied the attempt (through its hand-over) to its own
            # signal: a cycle that kept a root's outputs, or a join's inputs,
            # alive until a full collection of the cyclic collector.
            job.signal.unbind(aborted)
        with self._lock:
            self._current = None
            handed_over = inline.handed_over
        # Once the supervisor took the attempt (even one aborted before its
        # plugin started), the rest of the step is another thread's.
        if handed_over:
            raise LoopHandedOver
        if outcome is not None:
            inline.settlement.claim(outcome)
        settled = inline.settlement.outcome
        assert settled is not None
        if settled.kind is OutcomeKind.CANCELLED:
            job.signal.fire(settled.detail or settled.kind.value)
        return settled

    def stop(self) -> None:
        """End the supervisor; wait for it unless an attempt is still in its
        care (it then ends once that attempt is handed over or returns)."""
        with self._lock:
            self._stopped = True
            thread = self._thread
            idle = self._current is None
        self._wake.set()
        if idle and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _aborted(self, inline: _Inline, reason: str) -> None:
        if inline.settlement.claim(cancelled_outcome(reason)):
            self._poke()

    def _poke(self) -> None:
        with self._lock:
            if self._thread is None:
                # Started on first need: a worker whose attempts neither time
                # out nor get aborted never has one.
                self._thread = threading.Thread(
                    target=self._supervise, name="dagwerk-inline", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _supervise(self) -> None:
        clock = self._clock
        while True:
            # Cleared before looking: a change made after the look sets it again.
            self._wake.clear()
            with self._lock:
                inline = self._current
                if inline is None and self._stopped:
                    self._thread = None
                    return
            remaining: float | None = None
            if inline is not None:
                job, settlement = inline.job, inline.settlement
                if settlement.outcome is None and job.timeout is not None:
                    remaining = inline.started + job.timeout - clock.monotonic()
                    # Settled as a timeout first, then aborted (WK-10).
                    if remaining <= 0 and settlement.claim(timeout_outcome(job.timeout)):
                        job.signal.fire(f"timeout {job.timeout}s")
                outcome = settlement.outcome
                if outcome is not None:
                    with self._lock:
                        take = self._current is inline
                        if take:
                            inline.handed_over = True
                            self._current = None
                    if take:
                        inline.on_hand_over(outcome)
                    continue
            clock.wait(self._wake, remaining)
