"""Planning snapshots, node launches and output resolution of the SQL store."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from dagwerk._trusted import trusted_model
from dagwerk.backends.requests import (
    check_launch_request,
    check_node_index,
    check_plans,
    check_snapshot_limits,
    check_snapshot_sources,
    requested_outputs,
)
from dagwerk.constants import LaunchCreateStatus, NodeDisposition, RunStatus, TaskStatus
from dagwerk.json import ReadOnlyDict
from dagwerk.models import (
    LaunchCreateResult,
    NodeLaunch,
    OutputRef,
    PlanningSnapshot,
    ResolvedOutput,
    TaskInputPlan,
)
from dagwerk.store import InvalidStoreValueError

from ._ahead import ClaimAheadMixin
from ._base import FreshFrontier, FreshSnapshot, loads_object
from ._completion_reads import snapshot_limit
from ._plans import remember_plan
from .gateway import Params, Row, Tx

_STALE = LaunchCreateResult(status=LaunchCreateStatus.STALE)
_SLICE = 250
"""Task rows per slice of a launch's inserts where the gateway sends writes
without waiting (see ``_create_launch``)."""


class _SnapshotReads(NamedTuple):
    """A planning snapshot's reads, made in one flight (``_snapshot_ahead``)."""

    run: Row | None
    launches: dict[int, Row]
    nodes: list[Row]
    outputs: dict[int, list[Row]]


class _LaunchReads(NamedTuple):
    """A launch's reads, made in one flight (``_launch_ahead``)."""

    run: Row | None
    nodes: list[Row]
    existing: list[Row]
    published: dict[str, int]
    others: list[Row] | None  # the claim ahead's look at the queue, if made


class LaunchesMixin(ClaimAheadMixin):
    def _launch_view(
        self, tx: Tx, launch: Row, task_ids: tuple[str, ...] | None = None
    ) -> NodeLaunch:
        if task_ids is None:
            task_ids = tuple(
                row["task_id"]
                for row in tx.all("launch_task_ids", {"launch_id": launch["launch_id"]})
            )
        complete = (
            launch["disposition"] != NodeDisposition.LAUNCHED.value
            or launch["completed"] == launch["task_count"]
        )
        # The row was written from a validated launch (try_create_node_launch),
        # so it is rebuilt without re-running the validators on every read.
        return trusted_model(
            NodeLaunch,
            {
                "id": launch["launch_id"],
                "run_id": launch["run_id"],
                "node_index": launch["node_index"],
                "plugin_name": launch["plugin"],
                "generation": launch["generation"],
                "disposition": NodeDisposition(launch["disposition"]),
                "task_ids": task_ids,
                "complete": complete,
                "error": launch["error"],
            },
        )

    def _run_head(self, tx: Tx, run_id: str) -> Row | None:
        """The run row; without its node definitions once the run's topology is
        cached (the definitions are only parsed once)."""
        if run_id in self._topologies:
            return tx.one("run_head", {"run_id": run_id})
        return tx.one("run_get", {"run_id": run_id})

    def list_node_launches(self, run_id: str) -> Mapping[int, NodeLaunch]:
        with self._gw.read() as tx:
            rows = tx.all("launches_active", {"run_id": run_id})
            # One query for the tasks of every launch, not one per launch: a
            # round trip per node made each advancement O(nodes) round trips.
            tasks: dict[str, list[str]] = {}
            for task in tx.all("launch_task_ids_of_run", {"run_id": run_id}):
                tasks.setdefault(task["launch_id"], []).append(task["task_id"])
            return {
                row["node_index"]: self._launch_view(
                    tx, row, tuple(tasks.get(row["launch_id"], ()))
                )
                for row in rows
            }

    def get_planning_snapshot(
        self,
        run_id: str,
        node_index: int,
        source_indices: Mapping[str, int],
        *,
        max_outputs_per_edge: int,
        max_outputs_total: int,
        max_routing_bytes: int,
    ) -> PlanningSnapshot:
        per_edge, total_limit, byte_limit = check_snapshot_limits(
            max_outputs_per_edge, max_outputs_total, max_routing_bytes
        )
        limit = snapshot_limit(per_edge, total_limit)
        # Read with the completions that made the node ready (see
        # store_completion_reads): no read transaction at all.
        read_ahead = (
            self._completion_reads.take_snapshot(run_id, node_index, source_indices, limit)
            if self._completion_reads.active and run_id in self._topologies
            else None
        )
        with self._gw.read() as tx:
            # A frontier just read needs no run read (once the run's topology
            # is cached: otherwise the run's node definitions are read).
            fresh = self._frontier_now(run_id) if run_id in self._topologies else None
            if read_ahead is not None:
                fresh = FreshFrontier(
                    None,
                    read_ahead.run,
                    read_ahead.nodes,
                    read_ahead.launches,
                    read_ahead.node_rows,
                )
            ahead = (
                self._snapshot_ahead(tx, run_id, node_index, source_indices, limit)
                if fresh is None
                else None
            )
            run: Row | None
            if fresh is not None:
                run = fresh.run
            elif ahead is not None:
                run = ahead.run
            else:
                run = self._run_head(tx, run_id)
            if run is None:
                raise InvalidStoreValueError(f"run {run_id!r} does not exist", field="run_id")
            check_node_index(node_index, run["node_count"], run_id)
            check_snapshot_sources(source_indices, run["node_count"])
            # Only the sources' launches: reading every launch of the run made
            # each launch O(nodes).
            sources = sorted(set(source_indices.values()))
            if fresh is not None and fresh.nodes.issuperset(sources):
                launches = {i: fresh.launches[i] for i in sources if i in fresh.launches}
            elif ahead is not None:
                launches = ahead.launches
            else:
                launches = {
                    row["node_index"]: row
                    for row in tx.all(
                        "launches_of_nodes", {"run_id": run_id, "nodes": json.dumps(sources)}
                    )
                }
            outputs_by_edge: dict[str, tuple[OutputRef, ...]] = {}
            published: dict[str, int] = {}  # every valid output read: its node
            dispositions: dict[str, NodeDisposition] = {}
            total = 0
            size = 0
            stopped = False
            for name, source in source_indices.items():
                launch = launches.get(source)
                if launch is not None:
                    dispositions[name] = NodeDisposition(launch["disposition"])
                edge: list[OutputRef] = []
                if (
                    not stopped
                    and launch is not None
                    and launch["disposition"] == NodeDisposition.LAUNCHED.value
                ):
                    # One output beyond each count limit signals overflow, so
                    # no more than that is ever read.
                    if read_ahead is not None:
                        rows = read_ahead.outputs[source]
                    elif ahead is not None:
                        rows = ahead.outputs[source]
                    else:
                        rows = tx.all(
                            "outputs_of_node",
                            {"run_id": run_id, "node_index": source, "limit": limit},
                        )
                    for row in rows:
                        published[row["output_id"]] = source
                        if len(edge) > per_edge or total > total_limit:
                            break
                        edge.append(
                            trusted_model(
                                OutputRef,
                                {
                                    "id": row["output_id"],
                                    "fields": loads_object(row["fields"]),
                                    "correlation_id": row["correlation_id"],
                                },
                            )
                        )
                        total += 1
                        size += row["routing_size"]
                        if size > byte_limit:
                            # The crossing output is kept as the overflow
                            # signal; later edges stay empty.
                            stopped = True
                            break
                outputs_by_edge[name] = tuple(edge)
            token, generation = self._token_and_generation(
                tx, run, node_index, fresh, None if ahead is None else ahead.nodes
            )
            mark = self._write_mark()
            if mark is not None:
                # Read inside a unit's write transaction: until the unit's
                # next write this is what a launch would read again.
                self._fresh_snapshot = FreshSnapshot(mark, token, run, generation, published)
            return PlanningSnapshot.model_construct(
                token=token,
                generation=generation,
                outputs_by_edge=ReadOnlyDict(outputs_by_edge),
                source_dispositions=ReadOnlyDict(dispositions),
                runtime_inputs=loads_object(run["run_input"]),
            )

    def _snapshot_ahead(
        self,
        tx: Tx,
        run_id: str,
        node_index: int,
        source_indices: Mapping[str, int],
        limit: int,
    ) -> _SnapshotReads | None:
        """Every read of a planning snapshot in one flight, where a round trip
        costs (a gateway that pipelines, PostgreSQL): the run, the sources'
        launches, the node rows of the token and each source's outputs, the
        latter read even for a source whose launch published none. ``None``
        (the caller reads one by one) unless the run's topology is cached and
        every index is one of its nodes."""
        topology = self._topologies.get(run_id) if self._gw.pipelines_writes else None
        token_nodes = self._token_nodes(run_id, node_index)
        if topology is None or token_nodes is None:
            return None
        count = len(topology.nodes)
        sources = sorted(set(source_indices.values()))
        if any(type(i) is not int or not 0 <= i < count for i in sources):
            return None
        found = tx.all_of(
            [
                ("run_head", {"run_id": run_id}),
                ("launches_of_nodes", {"run_id": run_id, "nodes": json.dumps(sources)}),
                token_nodes,
                *(
                    ("outputs_of_node", {"run_id": run_id, "node_index": i, "limit": limit})
                    for i in sources
                ),
            ]
        )
        runs, launches, nodes = found[0], found[1], found[2]
        return _SnapshotReads(
            run=runs[0] if runs else None,
            launches={row["node_index"]: row for row in launches},
            nodes=nodes,
            outputs=dict(zip(sources, found[3:], strict=True)),
        )

    def try_create_node_launch(  # noqa: PLR0917 (the seed's positional signature)
        self,
        run_id: str,
        node_index: int,
        plugin_name: str,
        snapshot_token: str,
        plans: tuple[TaskInputPlan, ...],
        zero_task_disposition: NodeDisposition | None,
        error: str = "",
    ) -> LaunchCreateResult:
        plans = tuple(plans)
        created: list[dict[str, object]] = []
        asked = (run_id, node_index, plugin_name, snapshot_token, plans, zero_task_disposition)
        with self._gw.write() as tx:
            mark = self._write_mark()
            result = self._create_launch(tx, mark, created, asked, error)
        if created and "expires" in created[0]:
            self._remember_preclaimed(created)
        elif created:
            self._remember_queued(mark, created)
        return result

    def _create_launch(
        self,
        tx: Tx,
        mark: object,
        created: list[dict[str, object]],
        asked: tuple[str, int, str, str, tuple[TaskInputPlan, ...], NodeDisposition | None],
        error: str,
    ) -> LaunchCreateResult:
        """``try_create_node_launch`` (its arguments ``asked`` and ``error``)
        inside its transaction; the task rows it inserts are appended to
        ``created``."""
        run_id, node_index, plugin_name, snapshot_token, plans, zero_task_disposition = asked
        fresh = self._fresh_snapshot
        run: Row | None
        published: Mapping[str, int] = {}
        ahead: _LaunchReads | None = None
        if fresh is not None and fresh.token == snapshot_token and fresh.mark == mark:
            # The snapshot was read in this transaction with no write
            # since: its run row, token, generation and the outputs it
            # read are still what the database holds.
            _, token, run, generation, published = fresh
        else:
            ahead = self._launch_ahead(tx, run_id, node_index, plans)
            token, generation = "", -1
            if ahead is None:
                run = self._run_head(tx, run_id)
            else:
                run, nodes, existing_rows, published, _ = ahead
                if run is not None and run["status"] == RunStatus.RUNNING.value:
                    token, generation = self._token_and_generation(tx, run, node_index, nodes=nodes)
        if run is None or run["status"] != RunStatus.RUNNING.value:
            return _STALE
        check_node_index(node_index, run["node_count"], run_id)
        check_launch_request(
            self._topology(run).nodes[node_index],
            plugin_name=plugin_name,
            token=snapshot_token,
            plans=plans,
            zero=zero_task_disposition,
            error=error,
            limits=self.limits,
        )
        if generation < 0:
            token, generation = self._token_and_generation(tx, run, node_index)
        # OR-19: a stale token wins over an existing launch.
        if snapshot_token != token:
            return _STALE
        frontier = self._frontier_now(run_id)
        if ahead is not None:
            existing = existing_rows[0] if existing_rows else None
        elif (
            frontier is not None
            and node_index in frontier.nodes
            and node_index not in frontier.launches
        ):
            # The run frontier read in this transaction, with no write
            # since, found no active launch of the node.
            existing = None
        else:
            existing = tx.one("launch_active", {"run_id": run_id, "node_index": node_index})
        if existing is not None:
            if existing["generation"] != generation:
                return _STALE
            return LaunchCreateResult(
                status=LaunchCreateStatus.ALREADY_EXISTS,
                launch=self._launch_view(tx, existing),
            )
        # Plan contents are checked against the state the fresh token covers.
        self._validate_plans(tx, run, node_index, generation, plans, known=published)
        launch_id = f"{run_id}:launch:{node_index}:{generation}"
        disposition = NodeDisposition.LAUNCHED if plans else zero_task_disposition
        assert disposition is not None  # checked by check_launch_request
        launch: dict[str, object] = {
            "launch_id": launch_id,
            "run_id": run_id,
            "node_index": node_index,
            "generation": generation,
            "plugin": plugin_name,
            "disposition": NodeDisposition(disposition).value,
            "error": error,
            "task_count": len(plans),
        }
        # Writes whose results nothing reads are sent without waiting (one
        # round trip for the whole launch on PostgreSQL, at its commit). They
        # write different tables and read nothing another writes, so each
        # slice's go together (Tx.many_of: one statement on PostgreSQL).
        writes: list[tuple[str, Iterable[Params]]] = [("launch_insert", [launch])]
        ids = self._new_ids(2 * len(plans))
        rows: list[dict[str, object]] = []
        if plans:
            now = self._now()
            queue, priority = self._route(tx, run_id, node_index)
            # Where writes are sent without waiting (PostgreSQL), the rows go
            # in slices: the server inserts one while the next is built.
            step = _SLICE if self._gw.pipelines_writes else len(plans)
            sliced = step < len(plans)
            looked = None if ahead is None else ahead.others
            for start in range(0, len(plans), step):
                part = [
                    {
                        "task_id": f"{run_id}:{node_index}:{generation}:{n}",
                        "run_id": run_id,
                        "node_index": node_index,
                        "generation": generation,
                        "launch_id": launch_id,
                        "status": TaskStatus.QUEUED.value,
                        "attempt_id": ids[2 * n],
                        "plan": plans[n].model_dump_json(),
                        "delivery_id": ids[2 * n + 1],
                    }
                    for n in range(start, min(start + step, len(plans)))
                ]
                rows.extend(part)
                if len(part) == len(plans) and self._preclaim(
                    tx, part, (queue, priority), now, plugin_name, looked
                ):
                    # Taken by the unit's claim ahead as they are written.
                    writes.append(("task_insert_claimed", part))
                    writes.append(("delivery_insert_leased", part))
                    continue
                # Made as they are written: a launch not sent in slices
                # (SQLite) would otherwise hold every row twice.
                deliveries = (
                    {**row, "now": now, "queue": queue, "priority": priority, "delivery_count": 0}
                    for row in part
                )
                writes.append(("task_insert", part))
                writes.append(("delivery_insert", deliveries))
                if sliced:
                    tx.many_of(writes)
                    writes = []
            created.extend(rows)
            for row, plan in zip(rows, plans, strict=True):
                if type(plan) is TaskInputPlan:
                    remember_plan(str(row["plan"]), plan)
        writes.append(("node_bump", [{"run_id": run_id, "node_index": node_index}]))
        tx.many_of(writes)
        # The view of the row just written, without reading it back.
        written = {**launch, "completed": 0}
        view = self._launch_view(tx, written, tuple(str(row["task_id"]) for row in rows))
        return trusted_model(
            LaunchCreateResult, {"status": LaunchCreateStatus.CREATED, "launch": view}
        )

    def _launch_ahead(
        self, tx: Tx, run_id: str, node_index: int, plans: tuple[TaskInputPlan, ...]
    ) -> _LaunchReads | None:
        """The reads of a launch in one flight, where a round trip costs (a
        gateway that pipelines, PostgreSQL): the run (its lock preludes
        first), the node rows of the token, the node's active launch and the
        outputs the plans name. ``None`` (the caller reads one by one) unless
        the run's topology is cached and ``node_index`` is one of its nodes.
        The outputs come back as ``known`` for :meth:`_validate_plans`: read
        under the run's lock in this transaction, with no write since."""
        token_nodes = self._token_nodes(run_id, node_index) if self._gw.pipelines_writes else None
        if token_nodes is None:
            return None
        try:
            wanted = sorted(requested_outputs(plans))
        except (InvalidStoreValueError, TypeError):
            return None  # refused with the checks' own error, after the run read
        queries: list[tuple[str, Params]] = [
            ("run_head", {"run_id": run_id}),
            token_nodes,
            ("launch_active", {"run_id": run_id, "node_index": node_index}),
        ]
        if wanted:
            queries.append(("outputs_valid_by_ids", {"run_id": run_id, "ids": json.dumps(wanted)}))
        look = self._preclaim_look(len(plans), self._now())
        if look is not None:
            queries.append(look)
        found = tx.all_of(queries)
        published = {row["output_id"]: row["node_index"] for row in found[3]} if wanted else {}
        return _LaunchReads(
            found[0][0] if found[0] else None,
            found[1],
            found[2],
            published,
            found[-1] if look is not None else None,
        )

    def _validate_plans(
        self,
        tx: Tx,
        run: Row,
        node_index: int,
        generation: int,
        plans: tuple[TaskInputPlan, ...],
        *,
        known: Mapping[str, int],
    ) -> None:
        """Check the plans against the node's edges and generation and the
        outputs they name; ``known`` maps output IDs to their node for
        outputs already read in this transaction with no write since."""
        wanted = requested_outputs(plans)
        # One query for every referenced output, not one per plan.
        published = known
        if not wanted <= known.keys():
            published = {
                row["output_id"]: row["node_index"]
                for row in tx.all(
                    "outputs_valid_by_ids",
                    {"run_id": run["run_id"], "ids": json.dumps(sorted(wanted))},
                )
            }
        check_plans(self._topology(run), node_index, generation, plans, published_by=published.get)

    # -- outputs ------------------------------------------------------------------------

    def resolve_outputs(
        self, run_id: str, output_ids: tuple[str, ...]
    ) -> Mapping[str, ResolvedOutput]:
        ids = [output_id for output_id in output_ids if isinstance(output_id, str)]
        if not ids:
            return {}
        with self._gw.read() as tx:
            found = {
                row["output_id"]: resolved_output(row["output_id"], row["fields"], row["data"])
                for row in tx.all(
                    "outputs_resolve", {"run_id": run_id, "ids": json.dumps(sorted(set(ids)))}
                )
            }
            # Keyed in request order, like the reference store.
            return {output_id: found[output_id] for output_id in output_ids if output_id in found}

    def resolve_recent_outputs(
        self, run_id: str, output_ids: tuple[str, ...]
    ) -> Mapping[str, ResolvedOutput]:
        """``resolve_outputs`` for a task this worker claimed: when this store
        object itself committed every one of the outputs lately, they come
        from memory (``_recent.py`` says why that is safe for a claimed
        task, and only for one), else from the table."""
        ids = tuple(dict.fromkeys(oid for oid in output_ids if isinstance(oid, str)))
        texts = self._recent_outputs.get(run_id, ids) if ids else None
        if texts is None:
            return self.resolve_outputs(run_id, output_ids)
        return {oid: resolved_output(oid, *texts[oid]) for oid in output_ids if oid in texts}

    def get_run_outputs(self, run_id: str) -> Mapping[int, tuple[ResolvedOutput, ...]]:
        with self._gw.read() as tx:
            rows = tx.all("outputs_of_run", {"run_id": run_id})
        found: dict[int, list[ResolvedOutput]] = {}
        for row in rows:
            found.setdefault(row["node_index"], []).append(
                resolved_output(row["output_id"], row["fields"], row["data"])
            )
        return {index: tuple(outputs) for index, outputs in found.items()}

    def get_output_ids(self, run_id: str, node_index: int) -> tuple[str, ...]:
        with self._gw.read() as tx:
            rows = tx.all("output_ids_of_node", {"run_id": run_id, "node_index": node_index})
            return tuple(row["output_id"] for row in rows)


def resolved_output(output_id: str, fields: str, data: str) -> ResolvedOutput:
    """A stored output's resolved form (parsed afresh: plugins get their own copy)."""
    return trusted_model(
        ResolvedOutput,
        {
            "id": output_id,
            "fields": loads_object(fields),
            "data": ReadOnlyDict(json.loads(data)),
        },
    )
