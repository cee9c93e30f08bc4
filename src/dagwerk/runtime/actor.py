"""The advancement actor: the only caller of a worker's processing step (AA-01..08).

One thread runs the step, so at most one step is in flight however many
observers wait for runs. Observers only watch: their aborts and deadlines
remove them and never touch the run. A failing step is queue-wide: it is
logged and backed off, and observers keep waiting; with a fault gate
(:mod:`dagwerk.runtime.faults`) a store fault is the gate's to log and to
back off, and a fatal one ends the loop. ``stop`` closes admission at once,
settles pending observers and waits only for the step in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from dagwerk.constants import RunStatus
from dagwerk.runtime.clock import Clock, SystemClock
from dagwerk.runtime.errors import AdvancementWaitError, RunAdvancementStoppedError
from dagwerk.runtime.faults import FaultGate

__all__ = ["ActorState", "AdvancementActor", "LoopHandedOver"]

_LOG = logging.getLogger("dagwerk.runtime.actor")
_TERMINAL = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CRASHED, RunStatus.CANCELLED}
)


class LoopHandedOver(BaseException):
    """Raised in a loop thread whose step was handed to another thread
    (:meth:`AdvancementActor.hand_over`): it unwinds the stuck thread's stack
    to the loop, which it leaves. A BaseException, so no ``except Exception``
    on the way can swallow it."""


class ActorState(StrEnum):
    CREATED = "created"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(slots=True)
class _Observer:
    run_id: str
    done: threading.Event = field(default_factory=threading.Event)
    status: RunStatus | None = None
    error: AdvancementWaitError | None = None

    def settle(self, status: RunStatus | None, error: AdvancementWaitError | None) -> None:
        if not self.done.is_set():
            self.status, self.error = status, error
            self.done.set()


class AdvancementActor:
    """Drives ``step`` (returns whether it processed anything) while there is demand.

    ``read_status`` reads a run's durable status (``None``: missing). With
    ``background=True`` the actor steps even without observers (a worker
    serving a queue). Idle backoff starts at ``idle_backoff_min`` and doubles
    up to ``idle_backoff_max``; a processed step resets it; a failed step backs
    off ``error_backoff``. New demand wakes a sleeping actor.

    ``faults`` is told of every error a step raises; a store fault is not
    logged here, the loop pauses for as long as the gate says (new demand
    does not cut that pause short), and a fatal fault ends the loop.
    """

    def __init__(
        self,
        step: Callable[[], bool],
        read_status: Callable[[str], RunStatus | None],
        *,
        clock: Clock | None = None,
        background: bool = False,
        idle_backoff_min: float = 0.025,
        idle_backoff_max: float = 0.5,
        error_backoff: float = 0.5,
        step_waits: float = 0.0,
        logger: logging.Logger = _LOG,
        faults: FaultGate | None = None,
    ) -> None:
        self._step = step
        self._read_status = read_status
        self._clock = clock or SystemClock()
        self._background = background
        self._idle_min, self._idle_max = idle_backoff_min, idle_backoff_max
        self._error_backoff = error_backoff
        # A step that itself waits for work (a long poll) when idle: an
        # unproductive step that lasted this long (real time) was its own
        # backoff, and sleeping on top of it only delays the next work.
        self._step_waits = step_waits
        self._log = logger
        self._faults = faults
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._observers: list[_Observer] = []
        self._state = ActorState.CREATED
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self.steps_in_flight = 0
        self.max_steps_in_flight = 0

    @property
    def state(self) -> ActorState:
        return self._state

    def start(self) -> None:
        """Start the actor thread; a second start is a no-op; start after stop raises."""
        with self._lock:
            if self._state is ActorState.RUNNING:
                return
            if self._state is not ActorState.CREATED:
                raise RunAdvancementStoppedError("the advancement actor was stopped")
            self._state = ActorState.RUNNING
            self._thread = threading.Thread(target=self._loop, name="dagwerk-actor", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Close admission, settle observers with ``runtime_advancement_stopped``,
        wake any backoff and wait for the step in flight. Idempotent; persists nothing."""
        with self._lock:
            if self._state is ActorState.CREATED:
                self._state = ActorState.STOPPED
                self._stopped.set()
            elif self._state is ActorState.RUNNING:
                self._state = ActorState.STOPPING
            observers, self._observers = self._observers, []
            thread = self._thread
        for observer in observers:
            observer.settle(None, _stopped_error())
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            # The loop may move to another thread meanwhile (hand_over): its
            # end, not one thread's, is what is waited for.
            self._stopped.wait(timeout)

    def in_loop_thread(self) -> bool:
        """Whether the calling thread is the one running the loop now."""
        return threading.current_thread() is self._thread

    def hand_over(self, rest: Callable[[], bool]) -> None:
        """Move the loop to a new thread while its thread is stuck in a step.

        The new thread first runs ``rest`` (the remainder of the step in
        flight; its result is the step's), then goes on with the loop. The
        stuck thread must raise :class:`LoopHandedOver` once it gets control
        back: it leaves the loop without touching it. Still one step in
        flight: the stuck thread's step is the one ``rest`` completes."""
        thread = threading.Thread(
            target=self._loop, args=(rest,), name="dagwerk-actor", daemon=True
        )
        with self._lock:
            self._thread = thread
        thread.start()

    def wait_for_run(
        self,
        run_id: str,
        timeout: float | None = None,
        *,
        abort: threading.Event | None = None,
    ) -> RunStatus:
        """Block until the run is terminal and return its status.

        Raises :class:`AdvancementWaitError` with code
        ``runtime_advancement_wait_aborted`` (``abort`` set),
        ``runtime_advancement_wait_deadline`` (``timeout`` passed on the
        actor's clock), ``runtime_advancement_stopped`` (actor stopping) or
        ``runtime_advancement_query_throw`` (reading the run raised). None of
        them cancels the run.
        """
        if abort is not None and abort.is_set():
            raise AdvancementWaitError("wait aborted", code="runtime_advancement_wait_aborted")
        if timeout is not None and timeout <= 0:
            raise AdvancementWaitError("wait deadline", code="runtime_advancement_wait_deadline")
        observer = _Observer(run_id)
        with self._lock:
            if self._state in (ActorState.STOPPING, ActorState.STOPPED):
                raise _stopped_error()
            self._observers.append(observer)
        self._wake.set()
        if abort is not None:
            threading.Thread(target=self._relay_abort, args=(abort, observer), daemon=True).start()
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        while not observer.done.is_set():
            remaining = None if deadline is None else deadline - self._clock.monotonic()
            if remaining is not None and remaining <= 0:
                # The deadline ends this observer only; the run is untouched (AA-03).
                self._remove(observer)
                observer.settle(
                    None,
                    AdvancementWaitError("wait deadline", code="runtime_advancement_wait_deadline"),
                )
                break
            self._clock.wait(observer.done, remaining)
        if observer.error is not None:
            raise observer.error
        assert observer.status is not None
        return observer.status

    def _relay_abort(self, abort: threading.Event, observer: _Observer) -> None:
        # Polls the caller's abort event until the observer settles either way.
        while not observer.done.is_set():
            if abort.wait(0.01):
                self._remove(observer)
                observer.settle(
                    None,
                    AdvancementWaitError("wait aborted", code="runtime_advancement_wait_aborted"),
                )
                return

    def notify(self) -> None:
        """New demand (e.g. work was enqueued): wake a sleeping actor."""
        self._wake.set()

    def _remove(self, observer: _Observer) -> None:
        with self._lock:
            if observer in self._observers:
                self._observers.remove(observer)

    def _settle_observers(self) -> bool:
        """Settle the observers of terminal or missing runs; return whether
        demand remains: background work, or an observer of this snapshot still
        waiting. One that arrived after the snapshot is not demand yet: the
        wake it set brings the loop back to settle it before any step (AA-02)."""
        with self._lock:
            observers = list(self._observers)
        by_run: dict[str, list[_Observer]] = {}
        for observer in observers:
            by_run.setdefault(observer.run_id, []).append(observer)
        for run_id, group in by_run.items():
            try:
                status = self._read_status(run_id)
            except Exception as exc:  # a query failure settles only this run's observers
                error = AdvancementWaitError(
                    f"reading run {run_id!r} failed: {exc}",
                    code="runtime_advancement_query_throw",
                )
                for observer in group:
                    self._remove(observer)
                    observer.settle(None, error)
                continue
            if status is None:
                for observer in group:
                    self._remove(observer)
                    observer.settle(
                        None,
                        AdvancementWaitError(
                            f"run {run_id!r} does not exist",
                            code="runtime_advancement_run_missing",
                        ),
                    )
            elif status in _TERMINAL:
                for observer in group:
                    self._remove(observer)
                    observer.settle(status, None)
        with self._lock:
            waiting = {id(o) for o in self._observers}
        return self._background or any(id(o) in waiting for o in observers)

    def _loop(self, resume: Callable[[], bool] | None = None) -> None:
        try:
            self._serve(resume)
        except LoopHandedOver:
            return  # the loop goes on in the thread it was handed to
        finally:
            if self._thread is threading.current_thread():
                with self._lock:
                    self._state = ActorState.STOPPED
                self._stopped.set()

    def _serve(self, resume: Callable[[], bool] | None) -> None:
        backoff = self._idle_min
        while True:
            if resume is not None:
                # The step in flight, handed over (already counted).
                step, resume = resume, None
            else:
                if self._state is not ActorState.RUNNING:
                    return
                # Cleared before looking, so an observer, notify or stop that
                # comes after the look still wakes the wait below.
                self._wake.clear()
                demand = self._settle_observers()
                if self._state is not ActorState.RUNNING:
                    return
                if not demand:
                    self._clock.wait(self._wake, None)
                    continue
                self.steps_in_flight += 1
                self.max_steps_in_flight = max(self.max_steps_in_flight, self.steps_in_flight)
                step = self._step
            began = time.monotonic()
            failed = handed_over = False
            try:
                processed = step()
            except LoopHandedOver:
                handed_over = True
                raise  # the step is not over: it goes on in another thread
            except Exception as exc:
                if self._faults is None or not self._faults.note(exc, "the worker's step"):
                    self._log.exception("Worker step threw during run advancement.")
                processed, delay, failed = False, self._error_backoff, True
            else:
                delay = backoff
            finally:
                if not handed_over:
                    self.steps_in_flight -= 1
            if self._faults is not None:
                if self._faults.fatal is not None:
                    self._end_for_fault()
                    return
                pause = self._faults.pause()
                if pause > 0:
                    self._settle_observers()
                    self._pause(pause)
                    continue
                if failed:
                    delay = self._error_backoff
            if processed:
                backoff = self._idle_min
                continue
            if not failed and 0 < self._step_waits <= time.monotonic() - began:
                backoff = self._idle_min
                continue  # the step waited for work: look again at once
            self._settle_observers()
            if self._state is not ActorState.RUNNING:
                return
            self._clock.wait(self._wake, delay)
            backoff = min(backoff * 2, self._idle_max)

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` (a fault's backoff); only ``stop`` ends it early."""
        deadline = self._clock.monotonic() + seconds
        while self._state is ActorState.RUNNING:
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return
            self._wake.clear()
            if self._state is not ActorState.RUNNING:
                return
            self._clock.wait(self._wake, remaining)

    def _end_for_fault(self) -> None:
        """A fatal store fault: admission closes and the observers learn why."""
        with self._lock:
            if self._state is ActorState.RUNNING:
                self._state = ActorState.STOPPING
            observers, self._observers = self._observers, []
        fatal = self._faults.fatal if self._faults is not None else None
        error = AdvancementWaitError(
            f"the worker stopped: {fatal}", code="runtime_advancement_stopped"
        )
        for observer in observers:
            observer.settle(None, error)


def _stopped_error() -> AdvancementWaitError:
    return AdvancementWaitError(
        "the advancement actor is stopping", code="runtime_advancement_stopped"
    )
