"""The durable queue of the SQL store: leases, nacks, dead letters.

The outbox table is the queue. ``available_at`` is the row's visibility
time: a lease or a nack delay moves it into the future, so one indexed
comparison finds every deliverable row.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Collection, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass

from dagwerk.backends.errors import StoreBusyError, StoreUnavailableError
from dagwerk.backends.requests import check_claim, check_string
from dagwerk.constants import TaskStatus
from dagwerk.store import (
    DeadLetter,
    LeasedDelivery,
    TaskAttemptRef,
    validate_plugin_names,
    validate_queue_names,
    validate_run_preference,
    validate_seconds,
    validate_worker_id,
)

from ._base import SqlStoreBase
from .gateway import Row, Tx

MAX_DELIVERIES_REASON = "max_deliveries"


_DUE_LOOK_AFTER = 0.1
"""A dequeue that would wait longer than this for work first reads when the
next row is due (a short wait is not worth the read)."""


class QueueMixin(SqlStoreBase):
    def dequeue(
        self,
        worker_id: str,
        *,
        limit: int,
        lease_seconds: float,
        queues: Sequence[str] | None = None,
        wait_seconds: float = 0.0,
        plugins: Collection[str] | None = None,
        prefer_run: str | None = None,
    ) -> list[LeasedDelivery]:
        return self._dequeue(
            worker_id,
            limit=limit,
            lease_seconds=lease_seconds,
            queues=queues,
            wait_seconds=wait_seconds,
            plugins=plugins,
            prefer_run=prefer_run,
        )

    def _dequeue(
        self,
        worker_id: str,
        *,
        limit: int,
        lease_seconds: float,
        queues: Sequence[str] | None,
        wait_seconds: float,
        plugins: Collection[str] | None = None,
        prefer_run: str | None = None,
        claims: list[Row | None] | None = None,
        record_worker: bool = True,
    ) -> list[LeasedDelivery]:
        """``dequeue``; with ``claims`` each leased row's task is also claimed
        in the lease's transaction and the claimed task's row (or ``None``) is
        appended to ``claims`` (see :meth:`_lease`). ``record_worker=False``:
        the leases do not record the worker on the tasks; the caller's claim
        of the same rows does."""
        lease, names, patience = check_claim(worker_id, limit, lease_seconds, queues, wait_seconds)
        if names == []:
            return []
        wanted = RowFilter.of(names, plugins, prefer_run)
        deadline = time.monotonic() + patience
        # A gateway that can be notified (``work_epoch``/``wait_for_work``)
        # wakes at once on a local enqueue; the default is a short poll. The
        # queue is looked at again when a wait was woken (a gateway that
        # cannot tell, ``None``, after each wait) and at the deadline. A row
        # that becomes due wakes no one: a long wait ends when the next one
        # is due.
        while True:
            epoch = self._gw.work_epoch()
            leased = self._lease(
                worker_id, limit, lease, wanted, claims, record_worker=record_worker
            )
            remaining = deadline - time.monotonic()
            if leased or remaining <= 0:
                return leased
            if remaining > _DUE_LOOK_AFTER:
                due = self._due_in(wanted, worker_id)
                if due is not None and due < remaining:
                    deadline, remaining = time.monotonic() + due, due
            while remaining > 0 and self._gw.wait_for_work(remaining, epoch) is False:
                remaining = deadline - time.monotonic()

    def next_delivery_in(
        self,
        *,
        queues: Sequence[str] | None = None,
        plugins: Collection[str] | None = None,
        worker_id: str | None = None,
    ) -> float | None:
        names = validate_queue_names(queues)
        wanted = RowFilter.of(names, plugins, None)
        if worker_id is not None:
            validate_worker_id(worker_id)
        return self._due_in(wanted, worker_id)

    def _due_in(self, wanted: RowFilter, worker_id: str | None) -> float | None:
        """Seconds until the earliest row of ``wanted`` not under another
        worker's live lease becomes deliverable (``0.0``: now; ``None``: no
        such row); a row under ``worker_id``'s own lease is due when that
        lease ends."""
        now = self._now()
        params = {**wanted.params(None), "now": now, "worker_id": worker_id}
        row = self._read_one("queue_next_due", params)
        due = None if row is None else row["due"]
        return None if due is None else max(0.0, float(due) - now)

    def _claim_many(
        self,
        tx: Tx,
        leased: list[LeasedDelivery],
        *,
        worker_id: str | None = None,
        fresh: Mapping[str, Mapping[str, object]] | None = None,
        now: float | None = None,
    ) -> list[Row | None]:
        """Claim the leased rows' attempts in ``tx`` (implemented by the batch mixin)."""
        raise NotImplementedError

    def take_dead_lettered(self) -> list[TaskAttemptRef]:
        with self._dead_lettered_lock:
            taken, self._dead_lettered = self._dead_lettered, []
            return taken

    def _lease(
        self,
        worker_id: str,
        limit: int,
        lease: float,
        wanted: RowFilter,
        claims: list[Row | None] | None = None,
        *,
        record_worker: bool = True,
    ) -> list[LeasedDelivery]:
        # Rows past max_deliveries are only noted here and buried afterwards,
        # each in its own transaction that locks the run row first: burying
        # crashes the task, which needs the run row, and a cancel or finish
        # of that run holds the run row while it deletes queue rows. Taking
        # the run row while holding queue rows could deadlock with it.
        spent: dict[str, Row] = {}
        serialised = self._gw.serialises_writers
        if claims is None and not record_worker and self._gw.pipelines_writes:
            flown = self._lease_in_flights(worker_id, limit, lease, wanted, spent)
            self._bury_all(spent, flown)
            return flown
        # One database-wide write lock (SQLite): an idle worker's poll must
        # not take it just to find nothing, since every other writer would
        # wait for that empty transaction. A read never waits for writers, so
        # an empty queue is seen without it, in one statement without BEGIN
        # and COMMIT (and a unit of work that holds the lock needs no look).
        if (
            serialised
            and self._write_mark() is None
            and self._read_one(
                "queue_candidates", {**wanted.params(None), "now": self._now(), "limit": 1}
            )
            is None
        ):
            return []
        with self._gw.write() as tx:
            # Tasks a launch of this unit just inserted need no read to be
            # claimed (the leases below touch only the queue's rows).
            inserted = self._fresh_queued() if claims is not None else {}
            now = self._now()
            leased: list[LeasedDelivery] = []
            for run_id in wanted.phases():
                self._lease_rounds(
                    tx,
                    wanted.params(run_id),
                    worker_id=worker_id,
                    limit=limit,
                    lease=lease,
                    now=now,
                    spent=spent,
                    leased=leased,
                    record_worker=record_worker and claims is None,
                )
            if claims is not None and leased:
                claims.extend(
                    self._claim_many(tx, leased, worker_id=worker_id, fresh=inserted, now=now)
                )
        self._bury_all(spent, leased)
        return leased

    def _lease_rounds(
        self,
        tx: Tx,
        params: Mapping[str, object],
        *,
        worker_id: str,
        limit: int,
        lease: float,
        now: float,
        spent: dict[str, Row],
        leased: list[LeasedDelivery],
        record_worker: bool,
    ) -> None:
        """Lease rows matching ``params`` into ``leased`` (up to ``limit`` in
        all) in ``tx``; rows past ``max_deliveries`` go to ``spent``."""
        while len(leased) < limit:
            # Noted rows stay candidates in this transaction, so the
            # query reaches past them; each round leases or notes a new
            # row, or ends the loop.
            asked = limit - len(leased) + len(spent)
            rows = tx.all("queue_candidates", {**params, "now": now, "limit": asked})
            fresh = [row for row in rows if row["delivery_id"] not in spent]
            if not fresh:
                break
            # Fewer rows than asked for: there is nothing beyond them, so
            # this round is the last (saves an empty query per dequeue).
            exhausted = len(rows) < asked
            expires = now + lease
            taken: list[Row] = []
            for row in fresh:
                if len(leased) + len(taken) >= limit:
                    break
                if row["delivery_count"] >= self.max_deliveries:
                    spent[row["delivery_id"]] = row
                    continue
                taken.append(row)
            if not taken:
                if exhausted:
                    break
                continue
            # One statement each for the round's rows, before the next
            # round's query (which must no longer see them).
            tx.many(
                "queue_lease",
                [
                    {
                        "delivery_id": r["delivery_id"],
                        "worker_id": worker_id,
                        "expires": expires,
                    }
                    for r in taken
                ],
            )
            if record_worker:
                # (With ``claims`` the claim records the worker in the
                # same statement that sets the task RUNNING; without
                # ``record_worker`` the caller's claim does.)
                tx.many(
                    "task_set_worker",
                    [
                        {
                            "task_id": r["task_id"],
                            "attempt_id": r["attempt_id"],
                            "worker_id": worker_id,
                        }
                        for r in taken
                    ],
                )
            leased.extend(_leased(row, worker_id, expires) for row in taken)
            if exhausted:
                break

    def _lease_in_flights(
        self,
        worker_id: str,
        limit: int,
        lease: float,
        wanted: RowFilter,
        spent: dict[str, Row],
    ) -> list[LeasedDelivery]:
        """The leases of a dequeue where writes are pipelined (PostgreSQL):
        each round picks, leases and commits in one statement sent with its
        ``COMMIT`` (one round trip). Rows past ``max_deliveries`` are picked
        but not leased; they go to ``spent`` and a further round reaches past
        them, as the loop of :meth:`_lease` does."""
        leased: list[LeasedDelivery] = []
        for run_id in wanted.phases():
            if len(leased) >= limit or not self._lease_flights(
                wanted.params(run_id),
                worker_id=worker_id,
                limit=limit,
                lease=lease,
                spent=spent,
                leased=leased,
            ):
                break
        return leased

    def _lease_flights(
        self,
        params: Mapping[str, object],
        *,
        worker_id: str,
        limit: int,
        lease: float,
        spent: dict[str, Row],
        leased: list[LeasedDelivery],
    ) -> bool:
        """The rounds of :meth:`_lease_in_flights` for rows matching
        ``params``; False when a round failed after earlier leases (the
        dequeue then ends with those)."""
        while len(leased) < limit:
            asked = limit - len(leased) + len(spent)
            now = self._now()
            expires = now + lease
            try:
                with self._gw.write() as tx:
                    rows = tx.all_committing(
                        "queue_lease_next",
                        {
                            **params,
                            "now": now,
                            "limit": asked,
                            "worker_id": worker_id,
                            "expires": expires,
                            "max_deliveries": self.max_deliveries,
                        },
                    )
            except (StoreBusyError, StoreUnavailableError):
                if not leased:
                    raise
                return False  # the leases of the earlier rounds are committed: they go out
            fresh = 0
            for row in rows:
                if row["leased"]:
                    leased.append(_leased(row, worker_id, expires))
                    fresh += 1
                elif row["delivery_id"] not in spent:
                    spent[row["delivery_id"]] = row
                    fresh += 1
            # Fewer rows than asked for: nothing is beyond them.
            if len(rows) < asked or not fresh:
                break
        return True

    def _bury_all(self, spent: Mapping[str, Row], leased: list[LeasedDelivery]) -> None:
        for row in spent.values():
            if leased:
                # The leases are committed; a failed burial must not lose them
                # to the caller. The row stays, and a later dequeue buries it.
                with suppress(StoreBusyError, StoreUnavailableError):
                    self._bury_spent(row)
            else:
                self._bury_spent(row)

    def _bury_spent(self, row: Row) -> None:
        """Dead-letter one row that has used up its deliveries and crash its
        task, in one transaction that locks run, queue row, task in that
        order (the order of every run transition)."""
        with self._gw.write() as tx:
            tx.one("run_status", {"run_id": row["run_id"]})  # locks the run row
            current = tx.one("queue_get", {"delivery_id": row["delivery_id"]})
            now = self._now()
            if (
                current is None  # buried by another worker, or dropped by a stop
                or current["available_at"] > now
                or current["delivery_count"] < self.max_deliveries
            ):
                return
            self._bury(tx, current, MAX_DELIVERIES_REASON, now)
            crashed = self._crash_dead_lettered(tx, current, MAX_DELIVERIES_REASON)
        if crashed:
            # Reported only once committed: a rollback crashed nothing.
            with self._dead_lettered_lock:
                self._dead_lettered.append(TaskAttemptRef(row["task_id"], row["attempt_id"]))

    def _crash_dead_lettered(self, tx: Tx, row: Row, reason: str) -> bool:
        """Crash the row's task when its attempt is still current and unfinished
        in an active launch of a RUNNING run; whether it did."""
        task = self._task(tx, row["task_id"])
        if (
            task is None
            or not task["owned"]
            or task["run_status"] != "running"
            or task["attempt_id"] != row["attempt_id"]
            or task["status"] not in (TaskStatus.QUEUED.value, TaskStatus.RUNNING.value)
        ):
            return False
        tx.run(
            "task_crash_dead_lettered",
            {
                "task_id": row["task_id"],
                "attempt_id": row["attempt_id"],
                "error": f"dead-lettered: {reason}",
                "now": self._now(),
            },
        )
        self._bump(tx, task["run_id"], task["node_index"])
        return True

    def ack(self, delivery_id: str, worker_id: str) -> bool:
        validate_worker_id(worker_id)
        with self._gw.write() as tx:
            return tx.run("queue_ack", {"delivery_id": delivery_id, "worker_id": worker_id}) == 1

    def nack(
        self,
        delivery_id: str,
        worker_id: str,
        *,
        delay: float = 0.0,
        poison: bool = False,
        reason: str = "",
    ) -> bool:
        validate_worker_id(worker_id)
        wait = validate_seconds(delay, "delay", positive=False)
        check_string(reason, "reason")
        with self._gw.write() as tx:
            row = tx.one("queue_get", {"delivery_id": delivery_id})
            if row is None or row["lease_owner"] != worker_id:
                return False
            now = self._now()
            if poison:
                self._bury(tx, row, reason or "poison", now)
                return True
            tx.run("queue_release", {"delivery_id": delivery_id, "available_at": now + wait})
            return True

    def extend_lease(self, delivery_id: str, worker_id: str, lease_seconds: float) -> bool:
        validate_worker_id(worker_id)
        lease = validate_seconds(lease_seconds, "lease_seconds", positive=True)
        with self._gw.write() as tx:
            now = self._now()
            changed = tx.run(
                "queue_extend",
                {
                    "delivery_id": delivery_id,
                    "worker_id": worker_id,
                    "now": now,
                    "expires": now + lease,
                },
            )
            return changed == 1

    def list_dead_letters(self, run_id: str | None = None) -> list[DeadLetter]:
        with self._gw.read() as tx:
            return [_dead_letter(row) for row in tx.all("dead_letters_list", {"run_id": run_id})]

    def reinject_dead_letter(self, dead_letter_id: str) -> str | None:
        with self._gw.write() as tx:
            letter = tx.one("dead_letter_get", {"dead_letter_id": dead_letter_id})
            if letter is None or letter["reinjected_attempt_id"] is not None:
                return None
            task = self._task(tx, letter["task_id"])
            if (
                task is None
                or not task["owned"]
                or task["run_status"] != "running"
                or task["attempt_id"] != letter["attempt_id"]
                or task["generation"] != letter["generation"]
                or task["status"]
                not in (TaskStatus.QUEUED.value, TaskStatus.RUNNING.value, TaskStatus.CRASHED.value)
            ):
                return None
            # Any other row of the old attempt is dropped: only the fresh
            # attempt may be offered from now on.
            tx.run("deliveries_drop_task", {"task_id": task["task_id"]})
            queued = task["status"] == TaskStatus.QUEUED.value
            new_attempt = self._replace_attempt(
                tx,
                task,
                outcome=TaskStatus.CANCELLED if queued else TaskStatus.CRASHED,
                error=task["error"] or f"dead-lettered: {letter['reason']}",
                lost_deliveries=0,
            )
            changed = tx.run(
                "dead_letter_mark_reinjected",
                {"dead_letter_id": dead_letter_id, "attempt_id": new_attempt},
            )
            if changed != 1:  # guarded by the write lock; kept as a compare-and-set
                raise AssertionError("dead letter changed under the write lock")
            self._bump(tx, task["run_id"], task["node_index"])
            return new_attempt

    def _bury(self, tx: Tx, row: Row, reason: str, now: float) -> None:
        """Move one queue row to the dead-letter table in the caller's transaction."""
        tx.run(
            "dead_letter_insert",
            {
                "dead_letter_id": self._new_id(),
                "delivery_id": row["delivery_id"],
                "reason": reason,
                "now": now,
            },
        )
        tx.run("delivery_delete", {"delivery_id": row["delivery_id"]})


@dataclass(frozen=True, slots=True)
class RowFilter:
    """Which rows a dequeue may lease, as query parameters (JSON lists;
    ``None``: any queue, any plugin), and the run whose rows come first."""

    queues: str | None
    plugins: str | None
    prefer_run: str | None

    @classmethod
    def of(
        cls,
        queues: list[str] | None,
        plugins: Collection[str] | None,
        prefer_run: str | None,
    ) -> RowFilter:
        if isinstance(plugins, frozenset) or plugins is None:
            # A worker's served plugins, the same set at every claim: the
            # checked, sorted JSON list is made once per set.
            return _row_filter(None if queues is None else tuple(queues), plugins, prefer_run)
        return cls._made(queues, plugins, prefer_run)

    @classmethod
    def _made(
        cls,
        queues: Sequence[str] | None,
        plugins: Collection[str] | None,
        prefer_run: str | None,
    ) -> RowFilter:
        served = validate_plugin_names(plugins)
        return cls(
            None if queues is None else json.dumps(list(queues)),
            None if served is None else json.dumps(served),
            validate_run_preference(prefer_run),
        )

    def phases(self) -> tuple[str | None, ...]:
        """The ``run_id`` restriction of each pass over the queue, in order."""
        return (None,) if self.prefer_run is None else (self.prefer_run, None)

    def params(self, run_id: str | None) -> dict[str, object]:
        return {"queues": self.queues, "plugins": self.plugins, "run_id": run_id}


@functools.lru_cache(maxsize=64)
def _row_filter(
    queues: tuple[str, ...] | None, plugins: frozenset[str] | None, prefer_run: str | None
) -> RowFilter:
    return RowFilter._made(queues, plugins, prefer_run)


def _leased(row: Row, worker_id: str, expires: float) -> LeasedDelivery:
    return LeasedDelivery(
        delivery_id=row["delivery_id"],
        task_id=row["task_id"],
        attempt_id=row["attempt_id"],
        generation=row["generation"],
        run_id=row["run_id"],
        node_index=row["node_index"],
        launch_id=row["launch_id"],
        queue=row["queue"],
        priority=row["priority"],
        delivery_count=row["delivery_count"] + 1,
        worker_id=worker_id,
        lease_expires_at=expires,
        # When the row became deliverable (its available_at, read before the lease).
        offered_at=row["available_at"],
    )


def _dead_letter(row: Row) -> DeadLetter:
    return DeadLetter(
        dead_letter_id=row["dead_letter_id"],
        delivery_id=row["delivery_id"],
        task_id=row["task_id"],
        attempt_id=row["attempt_id"],
        generation=row["generation"],
        run_id=row["run_id"],
        node_index=row["node_index"],
        launch_id=row["launch_id"],
        queue=row["queue"],
        priority=row["priority"],
        delivery_count=row["delivery_count"],
        reason=row["reason"],
        dead_at=row["dead_at"],
        reinjected_attempt_id=row["reinjected_attempt_id"],
    )
