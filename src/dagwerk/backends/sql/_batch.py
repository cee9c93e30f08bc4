"""Batched worker operations of the SQL store (:class:`~dagwerk.store.BatchQueueStore`).

On a backend whose writers are serialised by one database lock (SQLite) a
batch is one transaction: the leases and the claims commit together, and so
do all completions and acks of one call. On a backend with row locks
(PostgreSQL) every transition locks its run first, root run before run; a
transaction that took several runs' locks in arbitrary order could deadlock
with another, so there a batch is one transaction per run (the leases stay
their own transaction, which takes no run lock). Either way each request
runs the single operation's own code under the same locks, except that on
PostgreSQL a batch claim shares its run's row with other claims and with
completions and locks the rows of the tasks it claims instead (claim mode,
``postgres/queries.sql``), where a single ``try_claim_task`` locks the run
exclusively.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from contextlib import suppress
from functools import partial
from typing import Any, TypeVar

from dagwerk.backends.errors import StoreBusyError, StoreUnavailableError
from dagwerk.backends.requests import check_claim
from dagwerk.constants import TaskStatus
from dagwerk.errors import DagwerkError
from dagwerk.models import EmittedOutput
from dagwerk.store import (
    ClaimedDelivery,
    CompletionOutcome,
    CompletionRequest,
    InvalidStoreValueError,
    LeasedDelivery,
    StoreContractError,
    TaskRecord,
    validate_worker_id,
)
from dagwerk.transitions import check_task_transition

from ._ahead import ClaimAheadMixin, Preclaimed
from ._queue import QueueMixin, RowFilter
from ._tasks import OutputTexts, TasksMixin, completion_result, output_texts, task_record
from .gateway import Params, Row, Tx

_T = TypeVar("_T")

_LOG = logging.getLogger("dagwerk.backends.sql")


class BatchMixin(TasksMixin, QueueMixin, ClaimAheadMixin):
    def _one_writer(self) -> bool:
        return self._gw.serialises_writers

    def _undoes_a_failed_write(self) -> bool:
        return self._gw.undoes_a_failed_write()

    def claim_deliveries(
        self,
        worker_id: str,
        *,
        limit: int,
        lease_seconds: float,
        queues: Sequence[str] | None = None,
        wait_seconds: float = 0.0,
        plugins: Collection[str] | None = None,
        prefer_run: str | None = None,
    ) -> list[ClaimedDelivery]:
        if self._one_writer():
            # What the unit's launches claimed for this claim comes first.
            if self._claim_intents:
                # Checked before anything claimed is taken (no read of the
                # queue, which checks them too, may follow).
                check_claim(worker_id, limit, lease_seconds, queues, wait_seconds)
                RowFilter.of(None, plugins, prefer_run)
            pre = self._take_preclaimed(worker_id, limit)
            self._note_handed_over(pre)
            claims: list[Row | None] = []
            leased: list[LeasedDelivery] = []
            if pre.rest or not pre.claimed:
                try:
                    leased = self._dequeue(
                        worker_id,
                        limit=pre.rest,
                        lease_seconds=lease_seconds,
                        queues=queues,
                        wait_seconds=0.0 if pre.claimed else wait_seconds,
                        plugins=plugins,
                        prefer_run=prefer_run,
                        claims=claims,
                    )
                except Exception:
                    if not pre.claimed:
                        raise
                    # The claimed tasks commit with their launches: whatever
                    # else fails, they must reach the worker.
                    _LOG.exception("reading the queue after the claimed launches failed")
                    leased, claims = [], []
            # Records are built after the commit: parsing plans need not hold
            # the database's write lock.
            return [
                *self._preclaimed_deliveries(pre),
                *(
                    ClaimedDelivery(d, _claimed(r), alone_in_launch(r))
                    for d, r in zip(leased, claims, strict=True)
                ),
            ]
        taken: list[ClaimedDelivery] = []
        ahead: Preclaimed | None = None
        if self._claim_intents:
            # What the launches of this thread claimed for it comes first.
            check_claim(worker_id, limit, lease_seconds, queues, wait_seconds)
            RowFilter.of(None, plugins, prefer_run)
            ahead = self._take_preclaimed(worker_id, limit)
            taken = self._preclaimed_deliveries(ahead)
        self._note_handed_over(ahead)
        if ahead is not None:
            if taken and not ahead.rest:
                return taken
            limit = ahead.rest if taken else limit
            wait_seconds = 0.0 if taken else wait_seconds
        # The leases leave the tasks' worker to the claims, which record it
        # in the statement that sets a task RUNNING (one task update, not two).
        try:
            leased = self._dequeue(
                worker_id,
                limit=limit,
                lease_seconds=lease_seconds,
                queues=queues,
                wait_seconds=wait_seconds,
                plugins=plugins,
                prefer_run=prefer_run,
                record_worker=False,
            )
        except Exception:
            if not taken:
                raise
            # The claimed tasks committed with their launches: whatever else
            # fails, they must reach the worker.
            _LOG.exception("reading the queue after the claimed launches failed")
            return taken
        found: dict[str, TaskRecord | None] = {}
        alone: set[str] = set()
        for group in _by_run([(d.run_id, d) for d in leased]):
            try:
                with self._gw.write() as tx:
                    rows = self._claim_many(tx, group, worker_id=worker_id)
                claimed = {d.delivery_id: _claimed(r) for d, r in zip(group, rows, strict=True)}
                alone.update(
                    d.delivery_id for d, r in zip(group, rows, strict=True) if alone_in_launch(r)
                )
            except StoreUnavailableError:
                # The leases are committed: the caller gets the rows unclaimed
                # and handles them one by one (or they come back after the
                # lease); the worker is recorded as the lease would have.
                claimed = {d.delivery_id: None for d in group}
                self._record_worker(worker_id, group)
            found.update(claimed)
        return [
            *taken,
            *(ClaimedDelivery(d, found[d.delivery_id], d.delivery_id in alone) for d in leased),
        ]

    def _preclaimed_deliveries(self, pre: Preclaimed) -> list[ClaimedDelivery]:
        """The claims of ``pre``; read again when the unit wrote since the
        last of them, and refused (task ``None``) where a write since left a
        task other than RUNNING under its attempt in a RUNNING run."""
        if not pre.claimed:
            return []
        if pre.current:
            return [
                ClaimedDelivery(d, _claimed(row), alone_in_launch(row)) for d, row in pre.claimed
            ]
        ids = [d.task_id for d, _ in pre.claimed]
        try:
            with self._gw.read() as tx:
                rows = {
                    row["task_id"]: row
                    for row in tx.all(
                        "tasks_claimable_many", {"ids": json.dumps(ids), "first": ids[0]}
                    )
                }
        except DagwerkError:
            # Refused, they take the one-by-one path, which reads them itself.
            _LOG.exception("reading the claimed launches' tasks again failed")
            rows = {}
        return [
            ClaimedDelivery(
                d,
                _claimed(row)
                if row is not None
                and self._matches(row, d.attempt_id, TaskStatus.RUNNING, d.generation)
                else None,
                alone_in_launch(row),
            )
            for d, row in ((d, rows.get(d.task_id)) for d, _ in pre.claimed)
        ]

    def _record_worker(self, worker_id: str, leased: list[LeasedDelivery]) -> None:
        """Record ``worker_id`` on the QUEUED tasks of ``leased`` (as a lease
        that records it does), if the store can be written now."""
        rows = [
            {"task_id": d.task_id, "attempt_id": d.attempt_id, "worker_id": worker_id}
            for d in leased
        ]
        with suppress(StoreBusyError, StoreUnavailableError), self._gw.write() as tx:
            tx.many("task_set_worker", rows)

    def _claim_many(
        self,
        tx: Tx,
        leased: list[LeasedDelivery],
        *,
        worker_id: str | None = None,
        fresh: Mapping[str, Mapping[str, object]] | None = None,
        now: float | None = None,
    ) -> list[Row | None]:
        """``try_claim_task`` for each leased row's attempt, in the caller's
        transaction: the tasks are read in one statement and set RUNNING in
        one more. A task claimed by an earlier row of the batch is not QUEUED
        for a later one, as with one claim after another. With ``worker_id``
        (a lease in this transaction that has not recorded its worker on the
        tasks yet) the claim records it too, and a QUEUED task left unclaimed
        gets it as the lease would have given it. ``fresh``: rows of tasks a
        launch inserted in this transaction with no write since but the
        leases (``_fresh_queued``), which are not read again. ``now``: the
        store time the claims start their attempts at (default: the clock's).
        Each claimed task's row comes back as the claim left its times."""
        ids = list(dict.fromkeys(d.task_id for d in leased))
        rows: dict[str, Row] = {i: fresh[i] for i in ids if i in fresh} if fresh else {}
        unread = [i for i in ids if i not in rows]
        if len(unread) == 1 and self._one_writer():
            # SQLite (no run lock to take): a plain key lookup, no JSON list.
            row = tx.one("task_get_owned", {"task_id": unread[0]})
            if row is not None:
                rows[unread[0]] = row
        elif unread:
            rows.update(
                (row["task_id"], row)
                for row in tx.all(
                    "tasks_claimable_many", {"ids": json.dumps(unread), "first": unread[0]}
                )
            )
        records: list[Row | None] = []
        updates: list[dict[str, object]] = []
        if now is None:
            now = self._now()
        unclaimed: list[dict[str, object]] = []
        claimed: set[str] = set()
        for delivery in leased:
            row = rows.get(delivery.task_id)
            if (
                row is None
                or delivery.task_id in claimed
                or not self._matches(
                    row, delivery.attempt_id, TaskStatus.QUEUED, delivery.generation
                )
            ):
                records.append(None)
                if worker_id is not None:
                    unclaimed.append(
                        {
                            "task_id": delivery.task_id,
                            "attempt_id": delivery.attempt_id,
                            "worker_id": worker_id,
                        }
                    )
                continue
            check_task_transition(TaskStatus.QUEUED, TaskStatus.RUNNING)
            claimed.add(delivery.task_id)
            updates.append(
                {
                    "task_id": delivery.task_id,
                    "old": TaskStatus.QUEUED.value,
                    "attempt_id": delivery.attempt_id,
                    "new": TaskStatus.RUNNING.value,
                    "error": row["error"],
                    "worker_id": worker_id,
                    "now": now,
                }
            )
            records.append(_StartedRow(row, now))
        if updates and worker_id is None:
            tx.many("task_set_status", updates)
        elif updates:
            tx.many("task_claim", updates)
        if unclaimed:
            tx.many("task_set_worker", unclaimed)
        return records

    def complete_and_ack(
        self, worker_id: str, requests: Sequence[CompletionRequest]
    ) -> list[CompletionOutcome]:
        validate_worker_id(worker_id)
        items = list(requests)
        for item in items:
            if not isinstance(item, CompletionRequest):
                raise InvalidStoreValueError(
                    "requests must be CompletionRequest values", field="requests"
                )
            if item.run_id is not None and type(item.run_id) is not str:
                raise InvalidStoreValueError("run_id must be a string or None", field="run_id")
        if not items:
            return []
        outcomes: list[CompletionOutcome] = [None] * len(items)
        # Output texts do not depend on stored state: computed before the
        # write lock is taken.
        texts = output_texts(output for item in items for output in item.outputs)
        if self._one_writer():
            self._complete_groups(
                worker_id, items, [list(range(len(items)))], {}, outcomes=outcomes, texts=texts
            )
        elif all(item.run_id for item in items):
            # The runs the caller named: each group checks them against the
            # tasks it reads under its run's lock (see _complete_groups).
            runs = {item.task_id: str(item.run_id) for item in items}
            groups = _by_run([(runs[item.task_id], i) for i, item in enumerate(items)])
            self._complete_groups(
                worker_id, items, groups, runs, outcomes=outcomes, texts=texts, named=True
            )
        else:
            self._complete_groups(
                worker_id, items, [list(range(len(items)))], None, outcomes=outcomes, texts=texts
            )
        return outcomes

    def _complete_groups(
        self,
        worker_id: str,
        items: list[CompletionRequest],
        groups: list[list[int]],
        runs: dict[str, str] | None,
        *,
        outcomes: list[CompletionOutcome],
        texts: Mapping[int, OutputTexts],
        named: bool = False,
    ) -> None:
        """Complete ``groups`` of ``items``, one transaction each. ``runs``:
        task -> run of the items (``None``: read them first, and group by
        them); ``named``: the caller named them, so each group checks them
        against the tasks it reads, and regroups by the stored runs if one
        differs (nothing of that group is written meanwhile)."""
        if runs is None:
            ids = json.dumps([items[i].task_id for group in groups for i in group])
            with self._gw.read() as tx:
                runs = {row["task_id"]: row["run_id"] for row in tx.all("tasks_runs", {"ids": ids})}
            keyed = [(runs.get(items[i].task_id, ""), i) for group in groups for i in group]
            groups = _by_run(keyed)
        for position, group in enumerate(groups):
            run_id = runs.get(items[group[0]].task_id)
            group_items = [(i, items[i]) for i in group]
            # One writer (SQLite): the outputs are first inserted without
            # reading which of their IDs are taken; a taken one fails the
            # insert, which undoes the group's writes, and the group is
            # decided again with the read (nothing else wrote meanwhile).
            optimistic = self._one_writer() and self._undoes_a_failed_write()
            while True:
                try:
                    with self._gw.write() as tx:
                        written = self._complete_group(
                            tx,
                            worker_id,
                            group_items,
                            outcomes,
                            texts,
                            run_id=run_id,
                            optimistic=optimistic,
                            named=named,
                        )
                    break
                except _OutputIdTaken:
                    optimistic = False
                    for i in group:
                        outcomes[i] = None
                except _OtherRun:
                    for i in group:
                        outcomes[i] = None
                    rest = [i for later in groups[position:] for i in later]
                    self._complete_groups(
                        worker_id, items, [rest], None, outcomes=outcomes, texts=texts
                    )
                    return
            kept = self._recent_outputs.keepable(written) if written else None
            if kept:
                self._after_commit(partial(self._recent_outputs.add, kept))

    def _complete_group(
        self,
        tx: Tx,
        worker_id: str,
        items: list[tuple[int, CompletionRequest]],
        outcomes: list[CompletionOutcome],
        texts: Mapping[int, OutputTexts],
        *,
        run_id: str | None = None,
        optimistic: bool = False,
        named: bool = False,
    ) -> list[dict[str, object]]:
        """Every request of ``items`` in one transaction, with set-based writes;
        the output rows written. ``optimistic``: the taken output IDs are not
        read; a taken one raises :class:`_OutputIdTaken` from the insert.

        The tasks are read in one statement, the run's taken output IDs in
        one per run; each request is then decided in order exactly as
        ``try_complete_task`` decides it (a request for a task an earlier
        request of this call completed sees that completion), and the writes
        go out per statement for all requests together. A run with budget
        accounts takes the one-by-one path, whose charges are per request.
        With ``run_id`` (the run of the tasks, read before the transaction)
        the taken output IDs are read together with the tasks, under the
        same lock (one round trip on PostgreSQL).
        """
        ids = list(dict.fromkeys(item.task_id for _, item in items))
        tasks = {"ids": json.dumps(ids), "first": ids[0]}
        # Without a run (SQLite, where a read costs no round trip, or tasks
        # the grouping read did not find) nothing is read ahead.
        emitted = (
            []
            if not run_id
            else [
                output.id
                for _, item in items
                for output in item.outputs
                if isinstance(output, EmittedOutput)
            ]
        )
        known: dict[str, set[str]] = {}
        if run_id and emitted:
            found, taken_rows = tx.all_of(
                [
                    ("tasks_get_owned_many", tasks),
                    ("outputs_reserved", {"run_id": run_id, "ids": json.dumps(emitted)}),
                ]
            )
            known[run_id] = {row["output_id"] for row in taken_rows}
        elif len(ids) == 1 and self._one_writer():
            # One task (a chain's step): a plain key lookup, no JSON list.
            found = tx.all("task_get_completing", {"task_id": ids[0]})
        else:
            found = tx.all("tasks_get_owned_many", tasks)
        rows = {row["task_id"]: row for row in found}
        if named and (ids[0] not in rows or any(row["run_id"] != run_id for row in rows.values())):
            # The run lock taken is that of the first task's stored run: it
            # covers this group only if every task found belongs to the run
            # the caller named, and the first was found.
            raise _OtherRun
        statuses = {row["run_id"]: row["run_status"] for row in rows.values()}
        budgeted = {
            run_id
            for run_id, status in statuses.items()
            if self._charges_completions(tx, run_id, status)
        }
        reserved = {} if optimistic else self._reserved_outputs(tx, items, rows, budgeted, known)
        batch = _CompletionBatch(self._now())
        for index, item in items:
            row = rows.get(item.task_id)
            if row is not None and row["run_id"] in budgeted:
                outcomes[index] = self._complete_and_ack_in(tx, worker_id, item)
                continue
            earlier = batch.completed.get(item.task_id)
            if earlier is not None:
                # FN-06 within this call: the same attempt gets the first
                # result (filled in once it is written), another gets None.
                if earlier[0] == item.expected_attempt_id:
                    batch.repeats.append((index, earlier[1]))
                batch.acks.append({"delivery_id": item.delivery_id, "worker_id": worker_id})
                continue
            if row is None or row["completed_attempt_id"] is not None:
                # FN-06: an exact repeat replays the first result; anything
                # else about a completed or unknown task is not accepted.
                outcomes[index] = _replay(row, item)
                batch.acks.append({"delivery_id": item.delivery_id, "worker_id": worker_id})
                continue
            if not self._matches(row, item.expected_attempt_id, TaskStatus.RUNNING, None):
                outcomes[index] = None
                batch.acks.append({"delivery_id": item.delivery_id, "worker_id": worker_id})
                continue
            outputs = tuple(item.outputs)
            taken = reserved.setdefault(row["run_id"], set())
            try:
                prepared = self._prepare_outputs(tx, row, outputs, reserved=taken, texts=texts)
            except StoreUnavailableError:
                raise
            except DagwerkError as exc:
                outcomes[index] = exc  # refused before anything of it was written
                continue
            taken.update(output.id for output in outputs)
            batch.add(index, item, row, prepared, worker_id)
        self._write_completions(tx, batch, outcomes, optimistic=optimistic)
        if self._completion_reads.active:
            self._read_ahead(tx, batch)
        return batch.outputs

    def _read_ahead(self, tx: Tx, batch: _CompletionBatch) -> None:
        """Send, with the commit, what the reconcile after these completions
        reads next (see _completion_reads): only for one run whose topology
        is cached and whose launches these completions completed."""
        completed: dict[str, set[int]] = {}
        for position, (_, row) in enumerate(batch.results):
            if batch.tasks[position]["launch_complete"]:
                completed.setdefault(row["run_id"], set()).add(row["node_index"])
        if len(completed) != 1:
            return
        ((run_id, nodes),) = completed.items()
        topology = self._topologies.get(run_id)
        if topology is None:
            return
        reads = self._completion_reads
        plan = reads.plan(run_id, topology, nodes, self.limits)
        reads.keep(plan, tx.all_of_committing(plan.queries))  # committed when it returns

    def _reserved_outputs(
        self,
        tx: Tx,
        items: list[tuple[int, CompletionRequest]],
        rows: dict[str, Row],
        budgeted: set[str],
        known: dict[str, set[str]],
    ) -> dict[str, set[str]]:
        """Per run, which of the output IDs the requests emit are taken
        (``known``: runs already read, for every ID the requests emit)."""
        wanted: dict[str, list[str]] = {}
        for _, item in items:
            row = rows.get(item.task_id)
            if row is None or row["run_id"] in budgeted:
                continue
            wanted.setdefault(row["run_id"], []).extend(
                output.id for output in item.outputs if isinstance(output, EmittedOutput)
            )
        return {
            run_id: known[run_id]
            if run_id in known
            else {
                row["output_id"]
                for row in tx.all("outputs_reserved", {"run_id": run_id, "ids": json.dumps(ids)})
            }
            for run_id, ids in wanted.items()
            if ids
        }

    def _write_completions(
        self,
        tx: Tx,
        batch: _CompletionBatch,
        outcomes: list[CompletionOutcome],
        *,
        optimistic: bool = False,
    ) -> None:
        # The writes touch five tables and read none another writes: they
        # may go out as one statement (Tx.many_of).
        writes: list[tuple[str, Iterable[Params]]] = []
        if batch.outputs:
            if optimistic:
                try:
                    tx.many("output_insert", batch.outputs)
                except StoreContractError as exc:
                    raise _OutputIdTaken from exc  # decided again with the read
            else:
                writes.append(("output_insert", batch.outputs))
        # Each launch's counter moves once; the request that brought it to
        # its task count is the one that completed the launch. The counter
        # was read with the tasks, under the lock every write of it takes
        # (the run in completion mode on PostgreSQL): its update needs no
        # answer and travels with the commit.
        for launch_id, positions in batch.by_launch.items():
            before, task_count = batch.counters[launch_id]
            for k, position in enumerate(positions):
                complete = before + k + 1 == task_count
                batch.tasks[position]["launch_complete"] = int(complete)
        if batch.by_launch:
            counts = [
                {"launch_id": launch_id, "n": len(positions)}
                for launch_id, positions in batch.by_launch.items()
            ]
            writes.append(("launch_count_completions", counts))
        if batch.tasks:
            check_task_transition(TaskStatus.RUNNING, TaskStatus.COMPLETED)
            writes.append(("task_complete", batch.tasks))
            bumps = [{"run_id": r, "node_index": n} for r, n in batch.nodes]
            writes.append(("node_bump", bumps))
        if batch.acks:
            writes.append(("queue_ack", batch.acks))
        tx.many_of(writes)
        for position, (index, row) in enumerate(batch.results):
            complete = bool(batch.tasks[position]["launch_complete"])
            outcomes[index] = completion_result(row, complete)
        for index, first in batch.repeats:
            outcomes[index] = outcomes[first]

    def _complete_and_ack_in(
        self, tx: Tx, worker_id: str, item: CompletionRequest
    ) -> CompletionOutcome:
        try:
            result = self._complete(tx, item.task_id, tuple(item.outputs), item.expected_attempt_id)
        except StoreUnavailableError:
            raise  # the transaction itself failed: nothing of the call commits
        except DagwerkError as exc:
            # Refused before anything of this request was written.
            return exc
        tx.run("queue_ack", {"delivery_id": item.delivery_id, "worker_id": worker_id})
        return result


class _OtherRun(Exception):
    """A group's tasks are not all of the run the caller named (see
    ``_complete_groups``): the group's transaction rolls back."""


class _OutputIdTaken(Exception):
    """An optimistic output insert met a taken output ID (see ``complete_and_ack``)."""


def alone_in_launch(row: Mapping[str, object] | Row | None) -> bool:
    """Whether a claimed task's row says it is its launch's only task
    (``launch_task_count``, where the claim's statement reads it)."""
    if row is None:
        return False
    try:
        return bool(row["launch_task_count"] == 1)
    except (KeyError, IndexError):
        return False


def _claimed(row: Row | None) -> TaskRecord | None:
    """The record of a task as its claim left it (the row was read before the
    claim set it RUNNING). A stored plan that no longer parses gives ``None``:
    the caller then treats the row as unclaimable, which recovers the task
    under a new attempt (and, should the plan stay unreadable, the row ends
    in the dead-letter queue after ``max_deliveries``)."""
    if row is None:
        return None
    try:
        return task_record(row, TaskStatus.RUNNING)
    except ValueError:
        return None


class _StartedRow:
    """A task row read before its claim, with the times the claim wrote
    (started at ``started_at``, not finished): what the row reads after it."""

    __slots__ = ("_row", "_started_at")

    def __init__(self, row: Row, started_at: float) -> None:
        self._row = row
        self._started_at = started_at

    def __getitem__(self, key: str, /) -> Any:
        if key == "started_at":
            return self._started_at
        if key == "finished_at":
            return None
        return self._row[key]


def _by_run(keyed: list[tuple[str, _T]]) -> list[list[_T]]:
    """Group values by run ID, groups in the order their run first appears."""
    groups: dict[str, list[_T]] = {}
    for run_id, value in keyed:
        groups.setdefault(run_id, []).append(value)
    return list(groups.values())


class _CompletionBatch:
    """The writes of one transaction's accepted completions, in request order."""

    def __init__(self, now: float) -> None:
        self.now = now
        """The store time the completions settle their attempts at."""
        self.outputs: list[dict[str, object]] = []
        self.tasks: list[dict[str, object]] = []
        self.acks: list[dict[str, object]] = []
        self.by_launch: dict[str, list[int]] = {}
        # launch -> (its counter as read with the tasks, its task count)
        self.counters: dict[str, tuple[int, int]] = {}
        self.nodes: dict[tuple[str, int], None] = {}
        self.results: list[tuple[int, Row]] = []
        # task -> (attempt, index of the request that completed it)
        self.completed: dict[str, tuple[str, int]] = {}
        self.repeats: list[tuple[int, int]] = []  # (request index, first request index)

    def add(
        self,
        index: int,
        item: CompletionRequest,
        row: Row,
        prepared: list[dict[str, object]],
        worker_id: str,
    ) -> None:
        position = len(self.tasks)
        self.outputs.extend(prepared)
        self.tasks.append(
            {
                "task_id": item.task_id,
                "attempt_id": item.expected_attempt_id,
                "launch_complete": 0,
                "now": self.now,
            }
        )
        self.by_launch.setdefault(row["launch_id"], []).append(position)
        self.counters[row["launch_id"]] = (row["launch_completed"], row["launch_task_count"])
        self.nodes[(row["run_id"], row["node_index"])] = None
        self.acks.append({"delivery_id": item.delivery_id, "worker_id": worker_id})
        self.results.append((index, row))
        self.completed[item.task_id] = (item.expected_attempt_id, index)


def _replay(row: Row | None, item: CompletionRequest) -> CompletionOutcome:
    """The outcome of a request for a task completed before this call, or
    unknown: the first result for the same attempt, else None."""
    if row is None or row["completed_attempt_id"] != item.expected_attempt_id:
        return None
    return completion_result(row, bool(row["completed_launch_complete"]))
