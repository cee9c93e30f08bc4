"""The worker's per-attempt state and the reads a batch of attempts shares."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dagwerk._fifo import RUN_CACHE_LIMIT, FifoCache
from dagwerk.budgets import AccountUsage
from dagwerk.lineage import RunLink
from dagwerk.models import DagNode, ResolvedOutput, TaskInputs
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.executors import AttemptSignal
from dagwerk.runtime.plugins import PluginSpec
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.store import (
    DagBudgetStore,
    DagChildStore,
    LeasedDelivery,
    OutputResolver,
    RecentOutputsStore,
    TaskRecord,
)

__all__ = ["LINKS_KEPT", "Attempt", "BatchReads", "Running"]

LINKS_KEPT = RUN_CACHE_LIMIT
"""How many runs' lineage links a worker keeps between batches."""


_DONE_LOCK = threading.Lock()


class Running:
    """What the worker's stop, watcher and heartbeat need of a running attempt.

    :attr:`done` is an Event only for a thread that waits on it (the watcher
    of the one-by-one path) and is made on first use: a batch of trivial
    attempts spent a good part of its time building Events nobody waited on.
    """

    __slots__ = ("_done", "_finished", "last_beat", "signal")

    def __init__(self, signal: AttemptSignal) -> None:
        self.signal = signal
        self.last_beat = float("-inf")
        self._finished = False
        self._done: threading.Event | None = None

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` was called (the attempt's plugin is over)."""
        return self._finished

    def finish(self) -> None:
        """Mark the attempt over and wake whoever waits on :attr:`done`."""
        with _DONE_LOCK:
            self._finished = True
            done = self._done
        if done is not None:
            done.set()

    @property
    def done(self) -> threading.Event:
        """Set once the attempt is over (made on first use, already set if so)."""
        with _DONE_LOCK:
            if self._done is None:
                self._done = threading.Event()
                if self._finished:
                    self._done.set()
            return self._done


@dataclass(slots=True)
class Attempt:
    """One claimed attempt, prepared to run."""

    delivery: LeasedDelivery
    task: TaskRecord
    node: DagNode
    spec: PluginSpec
    inputs: TaskInputs
    policy: RetryPolicy
    timeout: float | None
    bound: float
    entry: Running = field(default_factory=lambda: Running(AttemptSignal()))
    ctx: TaskContext | None = None
    alone: bool = False
    """The task is its launch's only one (``ClaimedDelivery.alone``)."""


class _Prefetched:
    """An ``OutputResolver`` over outputs a batch read in one request."""

    def __init__(self, outputs: Mapping[str, ResolvedOutput]) -> None:
        self._outputs = outputs

    def resolve_outputs(
        self, run_id: str, output_ids: Sequence[str]
    ) -> Mapping[str, ResolvedOutput]:
        return {oid: self._outputs[oid] for oid in output_ids if oid in self._outputs}


class _Recent:
    """An ``OutputResolver`` through a store's ``resolve_recent_outputs``."""

    __slots__ = ("_store",)

    def __init__(self, store: RecentOutputsStore) -> None:
        self._store = store

    def resolve_outputs(
        self, run_id: str, output_ids: Sequence[str]
    ) -> Mapping[str, ResolvedOutput]:
        return self._store.resolve_recent_outputs(run_id, tuple(output_ids))


class BatchReads:
    """Reads that every attempt of one batch would repeat, done once per run.

    A run's lineage link never changes once the run exists. Its budget can
    be set while the run runs, so it is read once per batch, as one
    attempt would read it once before running. The outputs of all attempts
    of a run are resolved in one request; if that request fails, each
    attempt resolves its own (and fails on its own).
    """

    def __init__(
        self,
        store: OutputResolver,
        plans: Mapping[str, list[TaskRecord]],
        *,
        child_store: DagChildStore | None,
        budget_store: DagBudgetStore | None,
        recent_outputs: RecentOutputsStore | None = None,
        links: dict[str, RunLink | None] | None = None,
    ) -> None:
        self._store = store
        self._recent_outputs = recent_outputs
        self._child_store = child_store
        self._budget_store = budget_store
        self._plans = plans
        # A run's link is written with the run and never changes, so a
        # worker may keep the links it read across batches (at most
        # LINKS_KEPT of them: the oldest is forgotten first).
        self._links: dict[str, RunLink | None] = FifoCache(LINKS_KEPT) if links is None else links
        self._budgets: dict[str, tuple[AccountUsage, ...]] = {}
        self._resolvers: dict[str, OutputResolver] = {}

    def link(self, run_id: str) -> RunLink | None:
        if run_id not in self._links:
            store = self._child_store
            self._links[run_id] = None if store is None else store.get_run_link(run_id)
        return self._links[run_id]

    def budget(self, run_id: str) -> tuple[AccountUsage, ...]:
        if run_id not in self._budgets:
            store = self._budget_store
            self._budgets[run_id] = () if store is None else tuple(store.get_run_budget(run_id))
        return self._budgets[run_id]

    def resolver(self, run_id: str) -> OutputResolver:
        """An ``OutputResolver`` for the run's attempts in this batch.

        A store that keeps the outputs it committed lately
        (``resolve_recent_outputs``, the SQL stores) answers from them where
        it can: a claimed task's inputs are then not read again."""
        found = self._resolvers.get(run_id)
        if found is None:
            recent = self._recent_outputs
            own: OutputResolver = self._store if recent is None else _Recent(recent)
            found = own
            tasks = self._plans.get(run_id, [])
            if len(tasks) > 1:
                wanted = tuple(
                    dict.fromkeys(
                        oid for task in tasks for edge in task.plan.edges for oid in edge.output_ids
                    )
                )
                try:
                    found = _Prefetched(own.resolve_outputs(run_id, wanted))
                except Exception:
                    found = self._store  # each attempt resolves (and fails) alone
            self._resolvers[run_id] = found
        return found
