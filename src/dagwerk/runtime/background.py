"""A worker's background loops, together.

- the advancement actor (:mod:`dagwerk.runtime.actor`): the loop whose step
  runs a due backstop pass, then one batch (a long poll when the queue is
  empty), then tells the observers;
- the attempt monitor (:mod:`dagwerk.runtime.monitor`): the one watcher of
  running attempts (cancellation, lease extension);
- the idle sweep (:mod:`dagwerk.runtime.sweep`), run when a batch finds
  nothing to lease;
- the backstop (:mod:`dagwerk.runtime.backstop`), for a store that has one;
- presence (:mod:`dagwerk.runtime.presence`): the worker's record for the
  stall diagnosis, for a store that keeps one;
- retention (:mod:`dagwerk.runtime.retention`): deleting old runs, when the
  worker has a ``retention`` setting, from the actor's step;
- the scheduler thread (:mod:`dagwerk.scheduling.scheduler`): firing due
  schedules, for a store that keeps them.

:class:`Background` builds them from the worker's settings and starts and
stops them in the worker's order: presence and the actor start together;
the actor stops first (the batch in flight finishes), the watcher and
presence after the worker gave back what it still holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dagwerk.capabilities import StoreCapabilities
from dagwerk.orchestrator import OrchestratorCallbacks
from dagwerk.runtime.actor import AdvancementActor
from dagwerk.runtime.backstop import Backstop
from dagwerk.runtime.clock import Clock
from dagwerk.runtime.faults import FaultGate
from dagwerk.runtime.monitor import AttemptMonitor
from dagwerk.runtime.observer import WorkerObserver, notify
from dagwerk.runtime.presence import Presence
from dagwerk.runtime.retention import PeriodicRetention
from dagwerk.runtime.roles import WorkerStore
from dagwerk.runtime.settings import WorkerSettings
from dagwerk.runtime.status import RunStatusReader
from dagwerk.runtime.sweep import StaleSweeper
from dagwerk.scheduling.scheduler import worker_scheduler
from dagwerk.store import DagQueueStore

__all__ = ["Background"]


class Background:
    """The background loops of one worker.

    ``serve(wait_seconds)`` handles one batch and returns how many rows it
    leased (the worker's ``process_once``); ``served`` names the plugins the
    worker leases rows of. ``faults`` is the worker's fault gate: a step
    first commits the settlements it holds, and claims nothing while they
    still fail.
    """

    def __init__(
        self,
        store: WorkerStore,
        queue: DagQueueStore,
        capabilities: StoreCapabilities,
        settings: WorkerSettings,
        *,
        worker_id: str,
        max_deliveries: int,
        serve: Callable[[float], int],
        served: Callable[[], frozenset[str]],
        status: RunStatusReader,
        clock: Clock,
        callbacks: OrchestratorCallbacks,
        observers: Sequence[WorkerObserver],
        faults: FaultGate,
    ) -> None:
        self._serve = serve
        self.faults = faults
        self._observers = observers
        self._idle_wait = settings.idle_seconds
        presence = capabilities.presence
        self.presence: Presence | None = (
            None
            if presence is None
            else Presence(
                presence, worker_id, plugins=served, queues=settings.queues, faults=faults
            )
        )
        self.sweeper = StaleSweeper(
            store,
            running_tasks=capabilities.running_tasks,
            clock=clock,
            lease_seconds=settings.lease_seconds,
            max_deliveries=max_deliveries,
            callbacks=callbacks,
        )
        # Gated dispatch: the periodic backstop runs from the background loop
        # only (once at start, then every ``backstop_interval`` seconds;
        # ``None`` disables it).
        self.backstop: Backstop | None = None
        if capabilities.backstop is not None:
            self.backstop = Backstop(
                capabilities.backstop,
                interval=settings.backstop_interval,
                clock=clock,
                holder=worker_id,
                callbacks=callbacks,
                on_report=lambda report: notify(self._observers, "backstop_finished", report),
                faults=faults,
            )
        self.monitor = AttemptMonitor(
            status.safe,
            queue,
            worker_id=worker_id,
            clock=clock,
            interval=settings.check_interval,
            lease_seconds=settings.lease_seconds,
            faults=faults,
        )
        # Deleting old runs (``retention``: their age, or a RetentionPolicy),
        # from the actor's step next to the backstop.
        self.retention = PeriodicRetention.for_worker(
            capabilities, settings.retention, clock=clock, holder=worker_id, faults=faults
        )
        # Schedules: this worker takes part in firing them.
        self.scheduler = worker_scheduler(
            store,
            interval=settings.schedule_interval,
            clock=clock,
            holder=worker_id,
            faults=faults,
        )
        poll_interval = settings.poll_interval
        self.actor = AdvancementActor(
            self.step,
            status.read,
            clock=clock,
            background=True,
            idle_backoff_min=min(0.025, poll_interval),
            idle_backoff_max=poll_interval,
            # serve(idle_wait) is a long poll when the queue is empty.
            step_waits=self._idle_wait * 0.9,
            faults=faults,
        )

    def start(self) -> None:
        """Record the worker and start the actor's loop (idempotent)."""
        if self.presence is not None:
            self.presence.start()
        self.actor.start()
        if self.scheduler is not None:
            self.scheduler.start()

    def stop_loop(self, timeout: float | None = None) -> None:
        """Stop the scheduler and the actor's loop; the batch in flight finishes first."""
        if self.scheduler is not None:
            self.scheduler.stop()
        self.actor.stop(timeout)

    def stop_watchers(self) -> None:
        """Stop the attempt monitor's thread."""
        self.monitor.stop()

    def retire(self) -> None:
        """Retire the worker's record (the worker stopped cleanly)."""
        if self.presence is not None:
            self.presence.stop()

    def step(self) -> bool:
        """One step of the actor's loop: the settlements held since a store
        fault (while they fail, nothing else), a due backstop pass, then one
        batch (waiting up to ``idle_wait`` for work); whether it handled anything."""
        if not self.faults.retry_parked():
            return False
        if self.backstop is not None:
            self.backstop.maybe_run()
        if self.retention is not None:
            self.retention.maybe_run()
        handled = self._serve(self._idle_wait) > 0
        self.step_finished()
        return handled

    def step_finished(self) -> None:
        """Tell the observers a step ended without an error."""
        notify(self._observers, "step_finished")

    def idle_sweep(self) -> int:
        """The throttled sweep of stale tasks; how many it requeued."""
        swept = self.sweeper.maybe_sweep()
        if swept:
            notify(self._observers, "swept", swept)
        return sum(1 for report in swept if report.action == "requeued")
