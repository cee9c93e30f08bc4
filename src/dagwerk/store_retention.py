"""Deleting finished runs (dagwerk extension): the retention protocol, its
validated request and what one batch deleted.

A *lineage* is a run that is not a child of a stored run (its *root* here)
with every run below it (children, their children, ...). Retention deletes
whole lineages: a root finished before the cut-off with a status asked for,
whose runs are all terminal, goes with every row of every run below it; a
child run is never deleted on its own, and a run that is not terminal is
never touched. Roots are examined in the order they finished (then by run
ID), a batch at a time; each batch is one short transaction, so workers keep
running in between, and two processes deleting at once never delete a run
twice nor leave half of one behind.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Protocol, runtime_checkable

from dagwerk._store_types import InvalidStoreValueError
from dagwerk.constants import RUN_TERMINAL_STATUSES, RunStatus

__all__ = [
    "DEFAULT_RETENTION_BATCH",
    "MAX_RETENTION_BATCH",
    "Lineage",
    "LineageChoice",
    "RetentionBatch",
    "RetentionCursor",
    "RetentionRequest",
    "RunRetentionStore",
    "check_retention_request",
    "choose_lineages",
]

DEFAULT_RETENTION_BATCH: Final = 100
"""Runs one retention transaction deletes at most (whole lineages: see
:meth:`RunRetentionStore.delete_finished_runs`)."""

MAX_RETENTION_BATCH: Final = 10_000
"""The largest batch a caller may ask for."""

_TERMINAL_ORDER: Final = tuple(s for s in RunStatus if s in RUN_TERMINAL_STATUSES)


@dataclass(frozen=True, slots=True, order=True)
class RetentionCursor:
    """Where a retention pass has got to: the last root it examined (roots are
    examined by ``(finished_at, run_id)``)."""

    finished_at: float
    run_id: str


@dataclass(frozen=True, slots=True)
class RetentionRequest:
    """A checked retention request (see :func:`check_retention_request`)."""

    older_than: float
    statuses: tuple[RunStatus, ...]
    limit: int
    after: RetentionCursor | None
    dry_run: bool


def check_retention_request(
    *,
    older_than: object,
    statuses: object = None,
    limit: object = DEFAULT_RETENTION_BATCH,
    after: object = None,
    dry_run: object = False,
) -> RetentionRequest:
    """The request every backend validates the same way; a bad field raises
    :class:`~dagwerk.store.InvalidStoreValueError` naming it.

    ``older_than`` is a finite number of seconds >= 0; ``statuses`` a
    non-empty collection of terminal run statuses (values or members;
    ``None``: every terminal status); ``limit`` an int from 1 to
    :data:`MAX_RETENTION_BATCH`; ``after`` a :class:`RetentionCursor` or
    ``None``; ``dry_run`` a bool.
    """
    if isinstance(older_than, bool) or not isinstance(older_than, int | float):
        raise InvalidStoreValueError(
            f"older_than must be a number of seconds, got {older_than!r}", field="older_than"
        )
    age = float(older_than)
    if not math.isfinite(age) or age < 0:
        raise InvalidStoreValueError(
            f"older_than must be finite and >= 0, got {older_than!r}", field="older_than"
        )
    wanted = _check_statuses(statuses)
    if type(limit) is not int or not 1 <= limit <= MAX_RETENTION_BATCH:
        raise InvalidStoreValueError(
            f"limit must be an int from 1 to {MAX_RETENTION_BATCH}, got {limit!r}",
            field="limit",
            limit=MAX_RETENTION_BATCH,
        )
    if after is not None and not isinstance(after, RetentionCursor):
        raise InvalidStoreValueError("after must be a RetentionCursor or None", field="after")
    if not isinstance(dry_run, bool):
        raise InvalidStoreValueError("dry_run must be a bool", field="dry_run")
    return RetentionRequest(age, wanted, limit, after, dry_run)


def _check_statuses(statuses: object) -> tuple[RunStatus, ...]:
    if statuses is None:
        return _TERMINAL_ORDER
    if isinstance(statuses, str | RunStatus) or not isinstance(statuses, Collection):
        raise InvalidStoreValueError(
            "statuses must be a collection of terminal run statuses", field="statuses"
        )
    found: set[RunStatus] = set()
    for item in statuses:
        try:
            status = RunStatus(item)
        except ValueError:
            status = None
        if status is None or status not in RUN_TERMINAL_STATUSES:
            names = ", ".join(s.value for s in _TERMINAL_ORDER)
            raise InvalidStoreValueError(
                f"statuses may hold only terminal run statuses ({names}), got {item!r}",
                field="statuses",
            )
        found.add(status)
    if not found:
        raise InvalidStoreValueError("statuses must not be empty", field="statuses")
    return tuple(s for s in _TERMINAL_ORDER if s in found)


@dataclass(frozen=True, slots=True)
class RetentionBatch:
    """What one retention transaction deleted (for a dry run: would delete)."""

    run_ids: tuple[str, ...] = ()
    """Every run deleted, each lineage's root first."""
    rows: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Records deleted per kind (``"runs"``, ``"tasks"``, ``"attempts"``,
    ``"outputs"``, ...; the SQL stores name their tables without the
    ``dagwerk_`` prefix). A dry run counts ``"runs"`` only."""
    passed: tuple[str, ...] = ()
    """Roots examined but kept: a run of their lineage is not terminal (or,
    on PostgreSQL, another transaction holds it right now)."""
    after: RetentionCursor | None = None
    """Pass this to the next call to go on; ``None`` once no root is left to
    examine."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", MappingProxyType(dict(self.rows)))


@runtime_checkable
class RunRetentionStore(Protocol):
    """Deletes finished runs with everything that belongs to them (dagwerk
    extension; see the module docstring for the lineage rules)."""

    def delete_finished_runs(
        self,
        *,
        older_than: float,
        statuses: Collection[RunStatus | str] | None = None,
        limit: int = DEFAULT_RETENTION_BATCH,
        after: RetentionCursor | None = None,
        dry_run: bool = False,
    ) -> RetentionBatch:
        """One write transaction (a read one for ``dry_run``): examine roots
        after ``after`` that finished more than ``older_than`` seconds ago
        by the store's clock with one of ``statuses`` (default: every
        terminal status), in ``(finished_at, run_id)`` order, and delete
        each one's whole lineage when all its runs are terminal (any
        terminal status), with every row of each of its runs: tasks,
        attempts, plans, outputs, waits, recoveries, queue and dead-letter
        rows, budget accounts and holds, stalls, links.

        At most ``limit`` runs are deleted, except that a batch always takes
        its first deletable lineage whole. Validated by
        :func:`check_retention_request` before anything is read. A repeat
        deletes what is left; rows of other runs are never touched.
        """
        ...


# --- the choice every backend makes --------------------------------------------


@dataclass(frozen=True, slots=True)
class Lineage:
    """A root examined by a retention batch, with the runs of its lineage."""

    root: RetentionCursor
    runs: tuple[str, ...]
    """The root's run ID first, then every run below it."""
    deletable: bool
    """Every run of the lineage is terminal (and, where the store locks,
    held by this transaction)."""


@dataclass(frozen=True, slots=True)
class LineageChoice:
    """What :func:`choose_lineages` decided."""

    delete: tuple[Lineage, ...]
    passed: tuple[str, ...]
    after: RetentionCursor | None


def choose_lineages(lineages: Collection[Lineage], *, limit: int, exhausted: bool) -> LineageChoice:
    """The lineages of one batch to delete, from the roots it examined in
    order: deletable ones while their runs fit in ``limit`` (the first one
    always), the others passed over. ``exhausted``: no root follows those
    examined, so a batch that reaches the end says ``after=None``."""
    delete: list[Lineage] = []
    passed: list[str] = []
    total = 0
    last: RetentionCursor | None = None
    for lineage in lineages:
        if lineage.deletable:
            if delete and total + len(lineage.runs) > limit:
                return LineageChoice(tuple(delete), tuple(passed), last)
            delete.append(lineage)
            total += len(lineage.runs)
        else:
            passed.append(lineage.root.run_id)
        last = lineage.root
    return LineageChoice(tuple(delete), tuple(passed), None if exhausted else last)
