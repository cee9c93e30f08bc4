"""State helpers shared by the SQL store mixins (private).

Every public method of :class:`~dagwerk.backends.sql.SqlStore` opens exactly
one transaction through the gateway (``write()`` for anything that may
change state, ``read()`` otherwise) and calls these helpers inside it. Like
the memory store, a method validates everything first and writes after, so
a rejected call changes nothing; on any exception the transaction rolls back.
Status changes go through :meth:`SqlStoreBase._set_status`, which checks the
transition table and compare-and-sets on (status, attempt).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, NamedTuple

from dagwerk._fifo import FifoCache
from dagwerk.backends.requests import check_store_settings
from dagwerk.constants import FailurePolicy, RunStatus, TaskStatus
from dagwerk.json import FrozenDict, JsonValue, freeze_json, freeze_object, thaw_json
from dagwerk.limits import DEFAULT_LIMITS, Limits
from dagwerk.models import DagNode, EmittedOutput
from dagwerk.store import StoreContractError, TaskAttemptRef
from dagwerk.topology import RunTopology
from dagwerk.transitions import check_task_transition

from ._completion_reads import CompletionReads
from ._recent import RecentOutputs
from .gateway import Gateway, Params, Row, Tx

UNFINISHED = (TaskStatus.PENDING, TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.WAITING)
FAILURES = (TaskStatus.FAILED, TaskStatus.CRASHED)


# Encoders made once: json.dumps with options builds a new encoder per call.
COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""``json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False)``."""
COMPACT_ASCII_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""``json.dumps(v, separators=(",", ":"), allow_nan=False)``."""
TEXT_JSON = json.JSONEncoder(ensure_ascii=False)
"""``json.dumps(v, ensure_ascii=False)`` (for strings and ``None``)."""


def dumps(value: object) -> str:
    """Compact JSON text of a (frozen or plain) JSON value."""
    return COMPACT_JSON.encode(thaw_json(value))


_OBJECT_TEXT_MAX = 512
_OBJECTS: FifoCache[str, FrozenDict] = FifoCache(4096)


def loads_object(text: str) -> FrozenDict:
    """``freeze_object(json.loads(text))`` of a stored object.

    Short texts are remembered (the latest 4,096 of at most
    ``_OBJECT_TEXT_MAX`` characters):
    output fields repeat a lot (the tasks of a node often emit the same
    fields, and a join reads every one of them), and a frozen object can be
    shared by every reader.
    """
    if len(text) > _OBJECT_TEXT_MAX:
        return freeze_object(json.loads(text))
    found = _OBJECTS.get(text)
    if found is None:
        found = _OBJECTS[text] = freeze_object(json.loads(text))
    return found


def loads_value(text: str) -> JsonValue:
    return freeze_json(json.loads(text))


class FreshSnapshot(NamedTuple):
    """A planning snapshot's reads, taken inside a unit of work's write
    transaction at write mark ``mark`` (see ``try_create_node_launch``)."""

    mark: object
    token: str
    run: Row
    generation: int
    published: dict[str, int]  # every valid output read: its node


class FreshFrontier(NamedTuple):
    """A run frontier's reads, taken inside a unit of work's write
    transaction at write mark ``mark`` (see ``get_planning_snapshot``)."""

    mark: object
    run: Row  # with run_head's columns
    nodes: frozenset[int]  # the node indices read
    launches: dict[int, Row]  # their active launches (frontier_of_nodes rows)
    node_rows: dict[int, Row]  # every existing one's row (node_generation, revision)


FRESH_TASKS = 256
"""Tasks of a unit's launches kept for a claim in the same unit, at most."""


class FreshTasks(NamedTuple):
    """QUEUED tasks the launches of a unit of work inserted, as a claim's
    ``tasks_claimable_many`` would read them, valid at write mark ``mark``
    (see ``_remember_queued``)."""

    mark: object
    rows: dict[str, dict[str, object]]


class SqlStoreBase:
    """Settings, caches and the helpers the mixins share."""

    def __init__(
        self,
        gateway: Gateway,
        *,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
        max_deliveries: int = 3,
        default_queue: str = "default",
        default_priority: int = 0,
    ) -> None:
        check_store_settings(max_deliveries, default_queue, default_priority)
        self.limits: Limits = limits if limits is not None else DEFAULT_LIMITS
        self.max_deliveries = max_deliveries
        self.default_queue = default_queue
        self.default_priority = default_priority
        self._clock = clock
        self._gw = gateway
        # Stored node definitions never change, so parsed copies are cached
        # per run (runs are never deleted), for the most recent runs only.
        self._nodes_cache: FifoCache[str, tuple[DagNode, ...]] = FifoCache()
        # The run's queue and priority, written once by create_run.
        self._run_routes: FifoCache[str, tuple[str, int]] = FifoCache()
        self._topologies: FifoCache[str, RunTopology] = FifoCache()
        self._policies: FifoCache[str, FailurePolicy] = FifoCache()
        # The last planning snapshot read inside a unit of work's write
        # transaction, with the gateway's write mark then: the launch that
        # follows it in the same transaction reuses its reads.
        self._fresh_snapshot: FreshSnapshot | None = None
        # Likewise the last run frontier, for the snapshot that follows it,
        # and the tasks the last launches inserted, for the claim ahead.
        self._fresh_frontier: FreshFrontier | None = None
        self._fresh_tasks: FreshTasks | None = None
        # Each thread's reads made with its completions, for the reconcile
        # after them (see _completion_reads).
        self._completion_reads = CompletionReads()
        # Started runs without budget accounts (they never get any later).
        self._unbudgeted: FifoCache[str, bool] = FifoCache()
        # Tasks this process's dequeues crashed by dead-lettering (drained by
        # take_dead_lettered); appended only after the commit.
        self._dead_lettered: list[TaskAttemptRef] = []
        self._dead_lettered_lock = threading.Lock()
        # Outputs this store committed lately, for its worker's next tasks.
        self._recent_outputs = RecentOutputs()

    @property
    def gateway(self) -> Gateway:
        """The gateway this store runs its transactions on."""
        return self._gw

    # -- identities and time --------------------------------------------------

    def _new_id(self) -> str:
        # 128 random bits as 32 hex digits, like uuid4().hex without building
        # a UUID object.
        return os.urandom(16).hex()

    def _new_ids(self, count: int) -> list[str]:
        """``count`` IDs like :meth:`_new_id`'s from one read of the system's
        random source (a launch needs two per task)."""
        text = os.urandom(16 * count).hex()
        return [text[start : start + 32] for start in range(0, 32 * count, 32)]

    def _now(self) -> float:
        return float(self._clock())

    def _read_one(self, name: str, params: dict[str, object]) -> Row | None:
        """The first row of one query in a read transaction of its own (on
        SQLite without ``BEGIN``/``COMMIT``, see ``SqliteGateway.read_one``)."""
        return self._gw.read_one(name, params)

    def _after_commit(self, action: Callable[[], object]) -> None:
        """Run ``action`` once what this thread has written so far is
        committed: at once, unless a unit of work of the gateway holds the
        writes (then at its commit, and never if it rolls back)."""
        if not self._gw.after_commit(action):
            action()

    def _frontier_now(self, run_id: str) -> FreshFrontier | None:
        """The run frontier of ``run_id`` read in the current unit's write
        transaction with no write ended since, else ``None``."""
        fresh, mark = self._fresh_frontier, self._write_mark()
        if fresh is None or mark is None or fresh.mark != mark or fresh.run["run_id"] != run_id:
            return None
        return fresh

    def _remember_queued(self, before: object, rows: list[dict[str, object]]) -> None:
        """After a launch inside a unit of work inserted the QUEUED task
        ``rows`` (its write began at mark ``before``): keep them, at most
        :data:`FRESH_TASKS` with those of the launches just before it (no
        other write between), for a claim before the unit's next write."""
        after = self._write_mark()
        if before is None or after is None:
            return
        fresh = self._fresh_tasks
        kept = dict(fresh.rows) if fresh is not None and fresh.mark == before else {}
        for row in rows[: max(0, FRESH_TASKS - len(kept))]:
            kept[str(row["task_id"])] = queued_task_row(row)
        self._fresh_tasks = FreshTasks(after, kept)

    def _fresh_queued(self) -> dict[str, dict[str, object]]:
        """The tasks kept by :meth:`_remember_queued`, while no write has
        ended since (else none)."""
        fresh, mark = self._fresh_tasks, self._write_mark()
        if fresh is None or mark is None or fresh.mark != mark:
            return {}
        return fresh.rows

    def _write_mark(self) -> object:
        """The gateway's write mark (SQLite's units of work), else ``None``."""
        return self._gw.write_mark()

    # -- run definition ---------------------------------------------------------

    def _nodes(self, run: Row) -> tuple[DagNode, ...]:
        run_id: str = run["run_id"]
        nodes = self._nodes_cache.get(run_id)
        if nodes is None:
            nodes = tuple(DagNode.model_validate(item) for item in json.loads(run["nodes"]))
            if run_id not in self._topologies:
                # The graph comes with the first parse (its nodes need no
                # second validation yet, see validate_pipeline): a worker
                # reads a run's definition at its first claim, so the run's
                # first reconcile does not pay for it. A definition that
                # fails is left to _topology, which raises in its turn.
                with suppress(ValueError):
                    self._topologies[run_id] = RunTopology.build(
                        nodes, limits=self.limits, parsed=True
                    )
            self._nodes_cache[run_id] = nodes
        return nodes

    def _topology(self, run: Row) -> RunTopology:
        # Built lazily: start_run validates a stored definition before any
        # operation that needs the graph can succeed.
        run_id: str = run["run_id"]
        topology = self._topologies.get(run_id)
        if topology is None:
            topology = RunTopology.build(list(self._nodes(run)), limits=self.limits)
            self._topologies[run_id] = topology
        return topology

    # -- lookups ------------------------------------------------------------------

    @staticmethod
    def _task(tx: Tx, task_id: str, *, completing: bool = False) -> Row | None:
        """The task with its run status and ``owned``: whether it belongs to its
        node's active launch and generation (FN-11). ``completing``: the read
        of a completion, which locks the run in completion mode on PostgreSQL
        (``queries.sql``, Locking); every other transition locks it exclusively."""
        if not isinstance(task_id, str):
            return None
        if completing:
            return tx.one("task_get_completing", {"task_id": task_id})
        return tx.one("task_get_owned", {"task_id": task_id})

    def _current(
        self, tx: Tx, task_id: str, attempt_id: str, status: TaskStatus, generation: int | None
    ) -> Row | None:
        """The task if ``attempt_id`` is its current attempt in ``status``, in the
        active launch (of ``generation`` when given) of a RUNNING run."""
        task = self._task(tx, task_id)
        if task is None or not self._matches(task, attempt_id, status, generation):
            return None
        return task

    @staticmethod
    def _matches(task: Row, attempt_id: str, status: TaskStatus, generation: int | None) -> bool:
        """The test of :meth:`_current` on a task row already read."""
        return bool(
            task["owned"]
            and task["run_status"] == "running"
            and task["status"] == status.value
            and task["attempt_id"] == attempt_id
            and (generation is None or task["generation"] == generation)
        )

    # -- mutations (callers have validated everything) ----------------------------

    def _set_status(self, tx: Tx, task: Row, new: TaskStatus, **extra: Any) -> None:
        old = TaskStatus(task["status"])
        check_task_transition(old, new)
        changed = tx.run(
            "task_set_status",
            {
                "task_id": task["task_id"],
                "old": old.value,
                "attempt_id": task["attempt_id"],
                "new": new.value,
                "error": extra.get("error", task["error"]),
                "now": self._now(),
            },
        )
        if changed != 1:
            # The write lock is held, so this means a bug, not a race.
            raise StoreContractError(f"task {task['task_id']!r} changed under the write lock")

    def _route(self, tx: Tx, run_id: str, node_index: int) -> tuple[str, int]:
        """The queue and priority of the node's deliveries: the node's own, or
        the run's where the node keeps the default."""
        nodes = self._nodes_cache.get(run_id)
        route = self._run_routes.get(run_id)
        if nodes is None or route is None:
            run = tx.one("run_get", {"run_id": run_id})
            assert run is not None
            nodes = self._nodes(run)
            route = self._run_routes[run_id] = (run["queue"], run["priority"])
        node = nodes[node_index]
        return (
            node.queue if node.queue != "default" else route[0],
            node.priority if node.priority else route[1],
        )

    def _enqueue(
        self,
        tx: Tx,
        task: Row,
        attempt_id: str,
        *,
        available_at: float | None = None,
        delivery_count: int = 0,
    ) -> None:
        """Write the outbox (queue) row for ``attempt_id`` of ``task``."""
        queue, priority = self._route(tx, task["run_id"], task["node_index"])
        tx.run(
            "delivery_insert",
            {
                "delivery_id": self._new_id(),
                "task_id": task["task_id"],
                "attempt_id": attempt_id,
                "generation": task["generation"],
                "run_id": task["run_id"],
                "node_index": task["node_index"],
                "launch_id": task["launch_id"],
                "queue": queue,
                "priority": priority,
                "now": self._now() if available_at is None else available_at,
                "delivery_count": delivery_count,
            },
        )

    def _replace_attempt(
        self,
        tx: Tx,
        task: Row,
        *,
        resumed_from: str | None = None,
        outcome: TaskStatus | None = None,
        error: str | None = None,
        available_at: float | None = None,
        delivery_count: int = 0,
        lost_deliveries: int | None = None,
    ) -> str:
        """A new QUEUED attempt with its outbox row, in the caller's transaction.

        The replaced attempt is archived with ``outcome`` (default: the task's
        status) and ``error`` (default: the task's error). The plan,
        generation and (unless ``resumed_from`` is given) the resumed-from
        wait stay.
        """
        old = TaskStatus(task["status"])
        if old is not TaskStatus.QUEUED:
            check_task_transition(old, TaskStatus.QUEUED)
        tx.run(
            "attempt_archive",
            {
                "task_id": task["task_id"],
                "status": (outcome or old).value,
                "error": error,
                "now": self._now(),
            },
        )
        attempt_id = self._new_id()
        changed = tx.run(
            "task_replace_attempt",
            {
                "task_id": task["task_id"],
                "old_status": old.value,
                "old_attempt": task["attempt_id"],
                "attempt_id": attempt_id,
                "resumed_from": resumed_from,
                "lost_deliveries": lost_deliveries,
            },
        )
        if changed != 1:
            raise StoreContractError(f"task {task['task_id']!r} changed under the write lock")
        self._enqueue(
            tx, task, attempt_id, available_at=available_at, delivery_count=delivery_count
        )
        return attempt_id

    @staticmethod
    def _bump(tx: Tx, run_id: str, node_index: int) -> None:
        # Its row count is not needed: sent without waiting on PostgreSQL.
        tx.many("node_bump", [{"run_id": run_id, "node_index": node_index}])

    def _token(self, tx: Tx, run: Row, node_index: int) -> str:
        """A token covering the run epoch, the node's generation and the state
        revision of each of its sources: any change makes it stale."""
        return self._token_and_generation(tx, run, node_index)[0]

    def _token_nodes(self, run_id: str, node_index: int) -> tuple[str, Params] | None:
        """The ``nodes_of_indices`` read :meth:`_token_and_generation` makes,
        for a caller that sends it ahead with other reads; ``None`` unless
        the run's topology is cached and ``node_index`` is one of its nodes."""
        topology = self._topologies.get(run_id)
        if topology is None or type(node_index) is not int:
            return None
        if not 0 <= node_index < len(topology.nodes):
            return None
        wanted = [node_index, *sorted(set(topology.dependencies[node_index]))]
        return ("nodes_of_indices", {"run_id": run_id, "nodes": json.dumps(wanted)})

    def _token_and_generation(
        self,
        tx: Tx,
        run: Row,
        node_index: int,
        fresh: FreshFrontier | None = None,
        nodes: list[Row] | None = None,
    ) -> tuple[str, int]:
        """:meth:`_token` and the node's generation, from the rows of the node
        and its sources only (reading every node made each launch O(nodes));
        from ``fresh`` (a frontier read in this transaction with no write
        since) when it read them all, else from ``nodes`` (the rows of
        :meth:`_token_nodes`, read in this transaction) when given."""
        sources = sorted(set(self._topology(run).dependencies[node_index]))
        wanted = [node_index, *sources]
        if fresh is not None and fresh.nodes.issuperset(wanted):
            found = [fresh.node_rows[i] for i in wanted if i in fresh.node_rows]
            generations = {row["node_index"]: row["node_generation"] for row in found}
            revisions_by = {row["node_index"]: row["revision"] for row in found}
        else:
            rows = (
                nodes
                if nodes is not None
                else tx.all(
                    "nodes_of_indices", {"run_id": run["run_id"], "nodes": json.dumps(wanted)}
                )
            )
            generations = {row["node_index"]: row["generation"] for row in rows}
            revisions_by = {row["node_index"]: row["revision"] for row in rows}
        revisions = ",".join(f"{s}:{revisions_by[s]}" for s in sources)
        generation: int = generations[node_index]
        token = f"{run['run_id']}|{run['epoch']}|{node_index}|{generation}|{revisions}"
        return token, generation

    # -- hooks of the child-run and budget mixins ----------------------

    def _after_terminate(self, tx: Tx, run: Row, status: RunStatus, error: str | None) -> None:
        """Called inside a run's terminal transition, after its own writes."""
        return None

    def _charges_completions(self, tx: Tx, run_id: str, run_status: str) -> bool:
        """Whether :meth:`_charge_completion` may act for the run's tasks."""
        return False

    def _charge_completion(self, tx: Tx, task: Row, outputs: tuple[EmittedOutput, ...]) -> None:
        """Called by a completion after its outputs validated, before any write;
        raises to refuse the completion."""
        return None

    @staticmethod
    def _failed_nodes(tx: Tx, run_id: str) -> set[int]:
        """Active nodes with a FAILED planning launch or a FAILED/CRASHED task."""
        return {row["node_index"] for row in tx.all("failed_nodes", {"run_id": run_id})}


def queued_task_row(inserted: dict[str, object]) -> dict[str, object]:
    """The row ``tasks_claimable_many`` reads for a task just inserted QUEUED
    by ``task_insert`` with ``inserted`` (the table's defaults for the rest;
    a test compares it with the stored row), in a RUNNING run whose launch
    and generation are current; or inserted claimed by
    ``task_insert_claimed`` (its status, ``worker_id`` and ``started_at``
    then)."""
    return {
        "task_id": inserted["task_id"],
        "run_id": inserted["run_id"],
        "node_index": inserted["node_index"],
        "generation": inserted["generation"],
        "launch_id": inserted["launch_id"],
        "status": inserted["status"],
        "attempt_id": inserted["attempt_id"],
        "plan": inserted["plan"],
        "error": None,
        "resumed_from_wait_id": None,
        "active_wait_id": None,
        "invalidated": 0,
        "completed_attempt_id": None,
        "completed_launch_complete": None,
        "failure_attempt_id": None,
        "failure_status": None,
        "attempt_number": 1,
        "worker_id": inserted.get("worker_id"),
        "lost_deliveries": 0,
        "started_at": inserted.get("started_at"),
        "finished_at": None,
        "run_status": RunStatus.RUNNING.value,
        "owned": 1,
    }
