"""The dagwerk extensions of the store protocols, under one name: wait
responses, stored waits, delayed task retries, node re-runs, the durable
queue, batched worker operations, the gated-dispatch backstop, worker
presence, store settings, child runs and budgets.

Each capability has a module of its own (``dagwerk.store_waits``,
``dagwerk.store_queue``, ...); :mod:`dagwerk.store` re-exports every name,
with the seed's protocols (``DagStore``, ``DagWaitStore``, ``DagRetryStore``,
``OutputResolver``, method for method as the seed defines them); import them
from there. A store written to the seed's protocols alone works with every
seed function; the extensions a store implements are looked up once per
store (:class:`dagwerk.capabilities.StoreCapabilities`), and without one its
caller does what the seed does.
"""

from __future__ import annotations

from dagwerk.store_backstop import (
    BackstopStore,
    LiveNodeStore,
    QueueStats,
    RunningTasksStore,
    StallRecord,
    WaitAgesStore,
)
from dagwerk.store_children import (
    DagBudgetStore,
    DagChildStore,
)
from dagwerk.store_claims import (
    BatchQueueStore,
    ClaimAheadStore,
    ClaimedDelivery,
    CompletionOutcome,
    CompletionRequest,
    RecentOutputsStore,
    UnitOfWorkStore,
)
from dagwerk.store_lifetime import (
    ClosableStore,
    LimitedStore,
)
from dagwerk.store_queue import (
    DagQueueStore,
    DeadLetter,
    LeasedDelivery,
    QueueForecastStore,
)
from dagwerk.store_retries import (
    DelayedRetryStore,
    NodeRerunStore,
)
from dagwerk.store_waits import (
    WaitRecord,
    WaitRecordStore,
    WaitResponseStore,
)
from dagwerk.store_workers import (
    WORKER_RECORDS_KEPT_SECONDS,
    ExpiredLease,
    WorkerPresenceStore,
    WorkerRecord,
)

__all__ = [
    "WORKER_RECORDS_KEPT_SECONDS",
    "BackstopStore",
    "BatchQueueStore",
    "ClaimAheadStore",
    "ClaimedDelivery",
    "ClosableStore",
    "CompletionOutcome",
    "CompletionRequest",
    "DagBudgetStore",
    "DagChildStore",
    "DagQueueStore",
    "DeadLetter",
    "DelayedRetryStore",
    "ExpiredLease",
    "LeasedDelivery",
    "LimitedStore",
    "LiveNodeStore",
    "NodeRerunStore",
    "QueueForecastStore",
    "QueueStats",
    "RecentOutputsStore",
    "RunningTasksStore",
    "StallRecord",
    "UnitOfWorkStore",
    "WaitAgesStore",
    "WaitRecord",
    "WaitRecordStore",
    "WaitResponseStore",
    "WorkerPresenceStore",
    "WorkerRecord",
]
