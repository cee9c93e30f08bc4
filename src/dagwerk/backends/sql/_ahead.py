"""Launches that claim their tasks for the claim ahead of their unit.

A worker completes a batch and claims its next one in one unit of work
(SQLite; see ``dagwerk.runtime.batch``). Before the completions it tells the
store what it will claim (:meth:`ClaimAheadMixin.expect_claim`); a launch of
that unit then inserts the tasks the claim would take first already claimed:
each task RUNNING with the worker recorded, its delivery leased to the worker
(``delivery_count`` 1). The rows end as the claim would have left them, two
updates (and their index changes) fewer per task. The claim ahead at the
unit's end hands them over before anything else
(:meth:`ClaimAheadMixin._take_preclaimed`).

On PostgreSQL, which has no units, the worker announces the claim before
its completions just the same; the launches its reconciles make on that
thread claim their tasks as they commit, and the thread's next claim (the
claim ahead right after the reconciles) hands them over first.

A launch claims its new tasks only where a claim at that moment would: the
worker's queues hold the launch's queue, the claim has room for them and for
every other row available now (so the claim's order, priority first, then
availability, then creation, could not prefer a row left behind), and the
task's run is RUNNING (the launch checks it). The claim ahead reads the
queue again only when something may be left for it: a row was available
beside the launch's, or the unit wrote since the last launch that claimed.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from dagwerk.backends.requests import check_claim
from dagwerk.constants import TaskStatus
from dagwerk.store import LeasedDelivery

from ._base import SqlStoreBase, queued_task_row
from ._queue import RowFilter
from .gateway import Params, Row, Tx

__all__ = ["OUTSIDE_UNITS", "ClaimAheadMixin", "ClaimIntent", "Preclaimed"]

OUTSIDE_UNITS = object()
"""The serial of a claim intent on a store without units of work: it lasts
until the thread's next claim."""


@dataclass(eq=False)
class ClaimIntent:
    """What the claim ahead of one unit of work will ask for, and what the
    unit's launches have claimed for it so far."""

    worker_id: str
    lease_seconds: float
    queues: frozenset[str] | None
    plugins: frozenset[str] | None
    wanted: RowFilter
    room: int
    """Tasks the claim may still take."""
    serial: object
    """The unit's serial (``unit_serial``): the intent is its unit's only
    (:data:`OUTSIDE_UNITS` on a store without units)."""
    claimed: list[tuple[LeasedDelivery, dict[str, object]]] = field(default_factory=list)
    """Each claimed task's lease and its row as the claim reads it."""
    mark: object = None
    """The write mark after the last launch that claimed."""
    settled: bool = False
    """The last launch that claimed saw no other row available."""
    crowded: bool = False
    """Rows available beside the launches fill the room: no later launch of
    the unit claims (nor looks at the queue again to find that out)."""


class ClaimAheadMixin(SqlStoreBase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Per thread, what its unit's claim ahead will ask.
        self._claim_intents: dict[int, ClaimIntent] = {}
        # Threads whose last claim handed over all its launches found
        # available (see handed_over_all_available).
        self._handed_all: set[int] = set()

    def expect_claim(
        self,
        worker_id: str,
        *,
        limit: int,
        lease_seconds: float,
        queues: Sequence[str] | None = None,
        plugins: Collection[str] | None = None,
    ) -> bool:
        """Inside the calling thread's unit of work, on a store with one
        writer (SQLite): the unit will end with ``claim_deliveries`` with
        these arguments (and no run preference), so its launches may claim
        their tasks for it. On a store with row locks (PostgreSQL), which has
        no units, the same holds for the launches this thread makes before
        its next ``claim_deliveries``: each commits its claimed tasks with
        it, and that claim hands them over. True when noted; False elsewhere
        (nothing changes)."""
        serial: object
        if not self._gw.serialises_writers:
            # Row locks, no units (PostgreSQL): the launches that follow on
            # this thread, each committing on its own, claim for the
            # thread's next claim.
            serial = OUTSIDE_UNITS
        else:
            serial = self._gw.unit_serial()
            if serial is None:
                return False
        lease, names, _ = check_claim(worker_id, limit, lease_seconds, queues, 0.0)
        if names == []:
            return False
        wanted = RowFilter.of(names, plugins, None)
        self._claim_intents[threading.get_ident()] = ClaimIntent(
            worker_id=worker_id,
            lease_seconds=lease,
            queues=None if names is None else frozenset(names),
            plugins=None if plugins is None else frozenset(plugins),
            wanted=wanted,
            room=limit,
            serial=serial,
        )
        return True

    def _intent_now(self) -> ClaimIntent | None:
        """The claim intent of the calling thread's current unit, if any."""
        if not self._claim_intents:
            return None
        intent = self._claim_intents.get(threading.get_ident())
        if intent is None:
            return None
        if intent.serial is not OUTSIDE_UNITS and self._gw.unit_serial() != intent.serial:
            return None
        return intent

    def _preclaim_look(self, count: int, now: float) -> tuple[str, Params] | None:
        """The look at the queue :meth:`_preclaim` makes for a launch of
        ``count`` tasks, for a caller that sends it ahead with other reads in
        the launch's transaction; ``None`` when the claim ahead would not look."""
        intent = self._intent_now()
        if intent is None or intent.crowded or not 0 < count <= intent.room:
            return None
        return _look(intent, now)

    def _preclaim(  # noqa: PLR0917 (private helper)
        self,
        tx: Tx,
        rows: list[dict[str, object]],
        route: tuple[str, int],
        now: float,
        plugin: str,
        looked: list[Row] | None = None,
    ) -> bool:
        """Whether the unit's claim ahead takes a launch's new task ``rows``
        (all routed to ``route``, queue and priority, of a node of ``plugin``)
        now. If so each row
        gets what ``task_insert_claimed`` and ``delivery_insert_leased``
        take besides (``status``, ``worker_id``, ``started_at``, ``expires``)
        and its route;
        the caller inserts them with those and hands them to
        :meth:`_remember_preclaimed` once the launch's write has ended.
        ``looked``: the rows of :meth:`_preclaim_look`, read earlier in the
        launch's transaction (else the look is made here)."""
        intent = self._intent_now()
        if intent is None or intent.crowded or not rows or len(rows) > intent.room:
            return False
        queue, priority = route
        if intent.queues is not None and queue not in intent.queues:
            return False
        if intent.plugins is not None and plugin not in intent.plugins:
            return False
        # Every row available now, up to the room left, is the claim's too:
        # with room for all of them and the new rows, none is passed over.
        others = looked if looked is not None else tx.all(*_look(intent, now))
        if len(others) + len(rows) > intent.room:
            # Once available rows fill the room, no later launch of the unit
            # can claim: they need not look (not claiming is always safe, the
            # claim ahead reads the queue itself).
            intent.crowded = len(others) >= intent.room
            return False
        expires = now + intent.lease_seconds
        for row in rows:
            row.update(
                status=TaskStatus.RUNNING.value,
                worker_id=intent.worker_id,
                started_at=now,
                expires=expires,
                queue=queue,
                priority=priority,
            )
        intent.settled = not others
        return True

    def _remember_preclaimed(self, rows: list[dict[str, object]]) -> None:
        """After the write of a launch that claimed ``rows`` (see
        :meth:`_preclaim`) ended: keep them for the unit's claim ahead."""
        intent = self._intent_now()
        if intent is None:
            return
        for row in rows:
            leased = LeasedDelivery(
                delivery_id=cast(str, row["delivery_id"]),
                task_id=cast(str, row["task_id"]),
                attempt_id=cast(str, row["attempt_id"]),
                generation=cast(int, row["generation"]),
                run_id=cast(str, row["run_id"]),
                node_index=cast(int, row["node_index"]),
                launch_id=cast(str, row["launch_id"]),
                queue=cast(str, row["queue"]),
                priority=cast(int, row["priority"]),
                delivery_count=1,
                worker_id=intent.worker_id,
                lease_expires_at=cast(float, row["expires"]),
                # Enqueued and claimed in one write.
                offered_at=cast(float, row["started_at"]),
            )
            # The launch's size comes along as a claim reads it (alone_in_launch).
            kept = {**queued_task_row(row), "launch_task_count": len(rows)}
            intent.claimed.append((leased, kept))
        intent.room -= len(rows)
        intent.mark = self._write_mark()

    def forget_claimed_ahead(self) -> None:
        """Forget what the calling thread's launches claimed for its next
        claim, after the transaction that made them rolled back: the claim
        then reads the queue itself."""
        self._claim_intents.pop(threading.get_ident(), None)

    def handed_over_all_available(self) -> bool:
        return threading.get_ident() in self._handed_all

    def _note_handed_over(self, pre: Preclaimed | None) -> None:
        """Remember, for the calling thread's claim, whether it handed over
        everything available (``pre`` settled); ``None``: no hand-over."""
        thread = threading.get_ident()
        if pre is not None and pre.settled:
            self._handed_all.add(thread)
        else:
            self._handed_all.discard(thread)

    def _take_preclaimed(self, worker_id: str, limit: int) -> Preclaimed:
        """What the unit's launches claimed for ``worker_id``'s claim ahead
        of at most ``limit`` rows. The intent ends here."""
        intent = self._intent_now()
        self._claim_intents.pop(threading.get_ident(), None)
        if intent is None or intent.worker_id != worker_id or not intent.claimed:
            return Preclaimed([], limit, current=True)
        # Outside units each launch committed its claimed rows as a claim
        # commits its own: they are what the claim hands over.
        current = intent.serial is OUTSIDE_UNITS or (
            intent.mark is not None and intent.mark == self._write_mark()
        )
        rest = max(0, min(limit, intent.room + len(intent.claimed)) - len(intent.claimed))
        settled = current and intent.settled
        if settled:
            rest = 0  # nothing was available beside them, nothing written since
        return Preclaimed(intent.claimed, rest, current=current, settled=settled)


@dataclass(frozen=True)
class Preclaimed:
    """The tasks a unit's launches claimed for its claim ahead."""

    claimed: list[tuple[LeasedDelivery, dict[str, object]]]
    """Each task's lease and its row as a claim reads it, in claim order."""
    rest: int
    """How many more rows the claim may take by reading the queue."""
    current: bool
    """Nothing was written since the last of them: no need to read them again."""
    settled: bool = False
    """Besides them nothing was available when the last of them was claimed,
    and nothing was written since: the claim takes nothing else."""


def _look(intent: ClaimIntent, now: float) -> tuple[str, Params]:
    """The claim ahead's look at what else is available: every row it could
    take, up to the room it has left."""
    return ("queue_candidates", {**intent.wanted.params(None), "now": now, "limit": intent.room})
