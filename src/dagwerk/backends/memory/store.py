"""The in-memory reference store."""

from __future__ import annotations

import time
from collections.abc import Callable

from dagwerk.limits import Limits

from ._batch import BatchMixin
from ._children import ChildrenMixin
from ._durable import DurableMixin
from ._frontier import FrontierMixin
from ._gated import GatedMixin
from ._launches import LaunchesMixin
from ._logs import LogsMixin
from ._queue import QueueMixin
from ._retention import RetentionMixin
from ._runs import RunsMixin
from ._schedules import SchedulesMixin
from ._tasks import TasksMixin
from ._tracebacks import TracebacksMixin
from ._views import ViewsMixin
from ._workers import WorkersMixin


class MemoryStore(
    RetentionMixin,
    DurableMixin,
    SchedulesMixin,
    BatchMixin,
    ChildrenMixin,
    RunsMixin,
    LaunchesMixin,
    TasksMixin,
    QueueMixin,
    GatedMixin,
    WorkersMixin,
    FrontierMixin,
    LogsMixin,
    TracebacksMixin,
    ViewsMixin,
):
    """Implements ``DagStore``, ``DagWaitStore``, ``DagRetryStore``,
    ``OutputResolver`` (the seed's protocols), their extensions
    ``WaitResponseStore``, ``DelayedRetryStore`` and ``NodeRerunStore``,
    and ``DagRunStore`` and ``RunActivityStore``, in memory.

    Thread-safe: one re-entrant lock serialises every public method, and each
    method is one transaction (validate, then write). It keeps wait, resume
    and recovery records so exact repeats replay their first result (WT-16),
    reserves output IDs for a run's lifetime, and keeps the outbox as an
    ordered table of deliveries. It is the reference the other backends are
    compared against, and the store of quick local runs.

    ``limits`` bounds publication, launches, snapshots and run input
    (default ``Limits()``); the orchestrator reads it from ``store.limits``.
    It also implements ``DagQueueStore``: ``clock`` supplies the queue's time,
    ``max_deliveries`` bounds the leases of one row, and every row gets
    ``default_queue`` and ``default_priority``.
    """

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
        max_deliveries: int = 3,
        default_queue: str = "default",
        default_priority: int = 0,
    ) -> None:
        super().__init__(
            limits=limits,
            clock=clock,
            max_deliveries=max_deliveries,
            default_queue=default_queue,
            default_priority=default_priority,
        )
