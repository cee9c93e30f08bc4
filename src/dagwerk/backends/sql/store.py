"""The SQL store: every store protocol over named queries and gateway hooks."""

from __future__ import annotations

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
from ._waits import WaitsMixin
from ._workers import WorkersMixin

__all__ = ["SqlStore"]


class SqlStore(
    DurableMixin,
    RetentionMixin,
    SchedulesMixin,
    BatchMixin,
    ChildrenMixin,
    RunsMixin,
    LaunchesMixin,
    TasksMixin,
    WaitsMixin,
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
    ``DagRunStore``, ``RunActivityStore`` and ``DagQueueStore`` over a
    :class:`~dagwerk.backends.sql.gateway.Gateway`.

    Behaves exactly like :class:`~dagwerk.backends.memory.MemoryStore`, with
    one durable difference: output ``data`` must be JSON-serialisable. Each
    public method runs in one gateway transaction; writes hold the database
    write lock from their first statement, so every compare-and-set sees the
    state it checks. Constructor arguments: see
    :class:`~dagwerk.backends.sql._base.SqlStoreBase`.
    """
