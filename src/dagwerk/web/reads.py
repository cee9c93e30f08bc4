"""What each page and API answer shows, as JSON-ready dicts read through
:class:`~dagwerk.Engine`. The HTML templates and the JSON API render the
same dicts, so both show the same data.

Secrets never appear: a plan's secret references are listed by target name
only, and node bindings by source and key, never a resolved value.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from dagwerk.constants import (
    RUN_TERMINAL_STATUSES,
    TASK_TERMINAL_STATUSES,
    NodeDisposition,
    RunStatus,
    TaskStatus,
)
from dagwerk.engine import Engine, UnsupportedOperationError
from dagwerk.json import thaw_json
from dagwerk.models import DagNode
from dagwerk.store import AttemptRecord, NodeTaskStats, RunRecord, TaskRecord
from dagwerk.web.layout import dag_svg, gantt_svg

__all__ = [
    "MAX_LISTED_OUTPUTS",
    "MAX_LISTED_REFS",
    "MAX_TASK_PAGE_LOG_LINES",
    "dead_letters",
    "node_sources",
    "overview",
    "run_detail",
    "run_json",
    "runs_page",
    "task_detail",
    "task_logs",
    "task_page_logs",
    "tasks_json",
    "why",
]

MAX_LISTED_OUTPUTS = 20
"""Outputs shown per node on the run page and per task on the task page."""
MAX_LISTED_REFS = 50
"""Output IDs shown per planned edge of a task."""
MAX_LISTED_WAITS = 20
MAX_TASK_PAGE_LOG_LINES = 1000
"""Log lines one read of a task's logs returns unless asked for fewer."""
MAX_OVERVIEW_RUNS = 20
DAY_SECONDS = 86_400.0

# Drawn state of a node from its counts and launch, most urgent first.
_STATE_ORDER = (
    ("failed", (TaskStatus.FAILED, TaskStatus.CRASHED)),
    ("running", (TaskStatus.RUNNING,)),
    ("waiting", (TaskStatus.WAITING,)),
    ("queued", (TaskStatus.QUEUED, TaskStatus.PENDING)),
)
COUNT_LABELS = (
    (TaskStatus.QUEUED, "queued"),
    (TaskStatus.RUNNING, "running"),
    (TaskStatus.COMPLETED, "done"),
    (TaskStatus.FAILED, "failed"),
    (TaskStatus.CRASHED, "crashed"),
    (TaskStatus.WAITING, "waiting"),
    (TaskStatus.CANCELLED, "cancelled"),
)


def _status_counts(counts: Mapping[TaskStatus, int]) -> dict[str, int]:
    return {status.value: n for status, n in counts.items() if n}


def run_json(record: RunRecord, counts: Mapping[TaskStatus, int] | None = None) -> dict[str, Any]:
    """One run as the runs list and the run page show it."""
    end = record.finished_at if record.finished_at is not None else time.time()
    found: dict[str, Any] = {
        "run_id": record.run_id,
        "pipeline": record.pipeline,
        "status": record.status.value,
        "error": record.error,
        "failure_policy": record.failure_policy.value,
        "retry_count": record.retry_count,
        "created_at": record.created_at,
        "finished_at": record.finished_at,
        "duration_seconds": max(0.0, end - record.created_at) if record.created_at else None,
        "nodes_total": record.node_count,
        "nodes_settled": record.settled_nodes,
        "terminal": record.status in RUN_TERMINAL_STATUSES,
    }
    if counts is not None:
        found["tasks"] = _status_counts(counts)
    return found


def runs_page(engine: Engine, **filters: Any) -> dict[str, Any]:
    """A page of runs with their task counts; ``next`` continues it."""
    page = engine.list_runs_page(**filters)
    counts = engine.run_task_counts([run.run_id for run in page.runs])
    return {
        "runs": [run_json(run, counts.get(run.run_id, {})) for run in page.runs],
        "next": None if page.next is None else page.next.encode(),
    }


def overview(engine: Engine, health: Any = None) -> dict[str, Any]:
    """The overview page: the last day's runs by status, running and stalled
    runs, the dead-letter queue, recent workers and health."""
    since = time.time() - DAY_SECONDS
    by_status = engine.run_status_counts_since(since)
    running = engine.list_runs_page(status=RunStatus.RUNNING, limit=MAX_OVERVIEW_RUNS)
    recorded = {stall.run_id: stall for stall in engine.list_stalls()}
    stalled: list[dict[str, Any]] = []
    for record in running.runs:
        stored = recorded.get(record.run_id)
        if stored is not None:
            nodes = engine.nodes(record.run_id)
            stalled.append(
                {
                    "run_id": record.run_id,
                    "reason": stored.reason,
                    "held_nodes": [nodes[i].slug for i in stored.held_nodes if i < len(nodes)],
                }
            )
    letters = engine.list_dead_letters()
    healthy, document = (None, None) if health is None else health.check()
    return {
        "since": since,
        "runs_by_status": {s.value: by_status.get(s, 0) for s in RunStatus},
        "running": [run_json(run) for run in running.runs],
        "stalled": stalled,
        "dead_letters": {
            "total": len(letters),
            "waiting": sum(1 for d in letters if d.reinjected_attempt_id is None),
        },
        "workers": [
            {
                "worker_id": w.worker_id,
                "live": w.live,
                "seen_seconds_ago": w.seen_seconds_ago,
                "plugins": list(w.plugins),
                "queues": None if w.queues is None else list(w.queues),
            }
            for w in engine.list_workers()
        ],
        "health": None if health is None else {"healthy": healthy, **(document or {})},
    }


def node_sources(nodes: Sequence[DagNode]) -> list[list[int]]:
    """Source node indices of each node (edge order, no repeats)."""
    index = {node.slug: i for i, node in enumerate(nodes)}
    found: list[list[int]] = []
    for node in nodes:
        seen: list[int] = []
        for edge in node.edges:
            source = index.get(edge.source)
            if source is not None and source not in seen:
                seen.append(source)
        found.append(seen)
    return found


def _node_state(stats: NodeTaskStats | None, disposition: str | None, complete: bool) -> str:
    if disposition == NodeDisposition.FAILED.value:
        return "failed"
    if disposition in (NodeDisposition.SKIPPED.value, NodeDisposition.UPSTREAM_FAILED.value):
        return "skipped"
    if stats is not None:
        for state, statuses in _STATE_ORDER:
            if any(stats.counts.get(status, 0) for status in statuses):
                return state
    if complete:
        return "done"
    return "pending" if disposition is None else "queued"


def _counts_line(stats: NodeTaskStats | None) -> str:
    if stats is None or not stats.counts:
        return "no tasks"
    parts = [f"{stats.counts[s]} {label}" for s, label in COUNT_LABELS if stats.counts.get(s)]
    return " · ".join(parts) or "no tasks"


def run_detail(engine: Engine, run_id: str) -> dict[str, Any]:
    """Everything the run page shows but the "why" panel (fetched apart:
    it reads every task of the run)."""
    from dagwerk.engine import RunNotFoundError

    record = engine.get_run(run_id)
    if record is None:
        raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
    nodes = engine.nodes(run_id)
    stats = {s.node_index: s for s in engine.node_stats(run_id)}
    sources = node_sources(nodes)
    consumed = {source for found in sources for source in found}
    total: dict[TaskStatus, int] = {}
    node_rows: list[dict[str, Any]] = []
    for index, node in enumerate(nodes):
        stat = stats.get(index)
        for status, n in stat.counts.items() if stat else ():
            total[status] = total.get(status, 0) + n
        disposition = None if stat is None else stat.disposition.value
        state = _node_state(stat, disposition, stat is not None and stat.complete)
        node_rows.append(
            {
                "index": index,
                "slug": node.slug,
                "plugin": node.plugin,
                "state": state,
                "disposition": disposition,
                "error": None if stat is None else stat.error,
                "tasks": {} if stat is None else _status_counts(stat.counts),
                "tasks_total": 0 if stat is None else stat.total,
                "attempts": 0 if stat is None else stat.attempts,
                "first_started_at": None if stat is None else stat.first_started_at,
                "last_finished_at": None if stat is None else stat.last_finished_at,
                "sources": [nodes[s].slug for s in sources[index]],
                "sink": index not in consumed,
                # Where each parameter comes from, never a value (secrets!).
                "bindings": {name: b.source for name, b in node.bindings.items()},
            }
        )
    waiting = engine.list_tasks_page(run_id, status=TaskStatus.WAITING, limit=MAX_LISTED_WAITS)
    link = engine.run_link(run_id)
    outputs: dict[str, list[dict[str, Any]]] = {}
    for row in node_rows:
        if row["sink"] and record.status is RunStatus.COMPLETED:
            outputs[row["slug"]] = _node_outputs(engine, run_id, row["index"])
    return {
        "run": run_json(record, total),
        "input": thaw_json(engine.run_input(run_id)),
        "nodes": node_rows,
        "svg": dag_svg(
            [n.slug for n in nodes],
            sources,
            {row["index"]: row["state"] for row in node_rows},
            {row["index"]: _counts_line(stats.get(row["index"])) for row in node_rows},
        ),
        "gantt": gantt_svg(
            [
                (
                    row["slug"],
                    row["first_started_at"],
                    row["last_finished_at"],
                    row["attempts"],
                    row["state"],
                )
                for row in node_rows
            ],
            now=time.time() if record.finished_at is None else record.finished_at,
        ),
        "waits": [
            {
                "task_id": t.task_id,
                "node": nodes[t.node_index].slug,
                "wait_id": t.active_wait_id,
                "since": t.finished_at,
            }
            for t in waiting
        ],
        "parent": None
        if link is None
        else {
            "run_id": link.parent_run_id,
            "task_id": link.parent_task_id,
            "root_run_id": link.root_run_id,
        },
        "children": [
            {"run_id": child, "status": _status_of(engine, child)}
            for child in engine.child_runs(run_id)[:MAX_LISTED_OUTPUTS]
        ],
        "budgets": [usage.to_json() for usage in engine.budget_usage(run_id)],
        "outputs": outputs,
        "failed_nodes": [row["slug"] for row in node_rows if row["state"] == "failed"],
    }


def _status_of(engine: Engine, run_id: str) -> str | None:
    record = engine.get_run(run_id)
    return None if record is None else record.status.value


def _node_outputs(engine: Engine, run_id: str, index: int) -> list[dict[str, Any]]:
    return [
        {"id": o.id, "fields": thaw_json(o.fields), "data": thaw_json(o.data)}
        for o in engine.node_outputs(run_id, index, limit=MAX_LISTED_OUTPUTS)
    ]


def why(engine: Engine, run_id: str) -> dict[str, Any]:
    """Why each node has (not) run, and the stall if any (``show --why``)."""
    diagnosis = engine.diagnose(run_id)
    return {
        "run_id": run_id,
        "status": diagnosis.status.value,
        "stalled": diagnosis.stalled,
        "stall": None if diagnosis.stall is None else diagnosis.stall.reason,
        "nodes": [
            {"node": n.slug, "state": n.state.value, "reason": n.reason} for n in diagnosis.nodes
        ],
    }


def _task_json(task: TaskRecord, nodes: Sequence[DagNode]) -> dict[str, Any]:
    return {
        "task_id": task.task_id,
        "run_id": task.run_id,
        "node": nodes[task.node_index].slug if task.node_index < len(nodes) else None,
        "status": task.status.value,
        "attempt": task.attempt_number,
        "attempt_id": task.attempt_id,
        "generation": task.generation,
        "error": task.error,
        "waiting_on": task.active_wait_id,
        "started_at": task.started_at,
        "finished_at": task.finished_at,
        "invalidated": task.invalidated,
    }


def tasks_json(engine: Engine, run_id: str, tasks: Sequence[TaskRecord]) -> list[dict[str, Any]]:
    nodes = engine.nodes(run_id)
    return [_task_json(task, nodes) for task in tasks]


def _attempt_json(attempt: AttemptRecord) -> dict[str, Any]:
    return {
        "attempt_id": attempt.attempt_id,
        "number": attempt.number,
        "outcome": None if attempt.status is None else attempt.status.value,
        "error": attempt.error,
        "worker_id": attempt.worker_id,
        "resumed_from_wait_id": attempt.resumed_from_wait_id,
        "started_at": attempt.started_at,
        "finished_at": attempt.finished_at,
        "traceback": attempt.traceback,
    }


def task_detail(engine: Engine, task_id: str) -> dict[str, Any] | None:
    """The task page: its plan, outputs, attempts, recorded steps, waits and
    dead letters."""
    task = engine.get_task(task_id)
    if task is None:
        return None
    nodes = engine.nodes(task.run_id)
    journal = engine.task_journal(task_id)
    plan = task.plan
    return {
        "task": _task_json(task, nodes),
        "plan": {
            "edges": [
                {
                    "edge": edge.edge,
                    "source": nodes[edge.source_index].slug,
                    "role": edge.role.value,
                    "output_count": len(edge.output_ids),
                    "output_ids": list(edge.output_ids[:MAX_LISTED_REFS]),
                }
                for edge in plan.edges
            ],
            "parameters": thaw_json(plan.parameters),
            # Only where a secret goes, never which secret or its value.
            "secret_targets": sorted(plan.secret_refs),
            "correlation_id": plan.correlation_id,
        },
        "outputs": [
            {"id": o.id, "fields": thaw_json(o.fields), "data": thaw_json(o.data)}
            for o in engine.task_outputs(task_id)[:MAX_LISTED_OUTPUTS]
        ],
        "attempts": [_attempt_json(a) for a in engine.list_attempts(task_id)],
        "steps": [
            {
                "name": step.name,
                "attempt_id": step.attempt_id,
                "recorded_at": step.recorded_at,
                "result": thaw_json(step.result),
            }
            for step in (() if journal is None else journal.steps)
        ],
        "waits": [
            {
                "wait_id": w.wait_id,
                "state": w.state,
                "attempt_id": w.attempt_id,
                "waited_at": w.waited_at,
                "resumed_attempt_id": w.resumed_attempt_id,
                "response": thaw_json(w.response),
            }
            for w in engine.task_waits(task_id)
        ],
        "dead_letters": [
            _letter_json(d, nodes)
            for d in engine.list_dead_letters(task.run_id)
            if d.task_id == task_id
        ],
    }


def task_page_logs(engine: Engine, task_id: str) -> dict[str, Any] | None:
    """The task page's first log lines (:func:`task_logs`); ``None`` for a
    store that keeps no task logs."""
    try:
        found = task_logs(engine, task_id)
    except UnsupportedOperationError:
        return None  # the store keeps no task logs
    if found is not None:
        # The page follows on while the task runs or lines remain unread.
        found["follow"] = found["running"] or len(found["lines"]) == MAX_TASK_PAGE_LOG_LINES
    return found


def task_logs(
    engine: Engine,
    task_id: str,
    *,
    after: int = 0,
    attempt: int | None = None,
    limit: int = MAX_TASK_PAGE_LOG_LINES,
) -> dict[str, Any] | None:
    """The task's log lines after line ``after`` (of one attempt number where
    given, at most ``limit``), ``next`` (the last line's ID, to pass as
    ``after``) and ``running`` (the task is not terminal: more may come);
    ``None`` for an unknown task. Raises ``UnsupportedOperationError`` for a
    store that keeps no task logs."""
    task = engine.get_task(task_id)
    if task is None:
        return None
    lines = engine.logs(task.run_id, task_id=task_id, attempt=attempt, after=after, limit=limit)
    return {
        "lines": [
            {
                "line_id": line.line_id,
                "attempt": line.attempt,
                "at": line.at,
                "level": line.level,
                "logger": line.logger,
                "message": line.message,
                "traceback": line.traceback,
            }
            for line in lines
        ],
        "next": lines[-1].line_id if lines else after,
        "running": task.status not in TASK_TERMINAL_STATUSES,
    }


def _letter_json(letter: Any, nodes: Sequence[DagNode] | None = None) -> dict[str, Any]:
    node = None
    if nodes is not None and letter.node_index < len(nodes):
        node = nodes[letter.node_index].slug
    return {
        "dead_letter_id": letter.dead_letter_id,
        "run_id": letter.run_id,
        "task_id": letter.task_id,
        "attempt_id": letter.attempt_id,
        "node": node,
        "queue": letter.queue,
        "delivery_count": letter.delivery_count,
        "reason": letter.reason,
        "dead_at": letter.dead_at,
        "reinjected_attempt_id": letter.reinjected_attempt_id,
    }


def dead_letters(engine: Engine, run_id: str | None = None) -> list[dict[str, Any]]:
    """Dead letters, newest first."""
    found = []
    cache: dict[str, Sequence[DagNode]] = {}
    for letter in reversed(engine.list_dead_letters(run_id)):
        if letter.run_id not in cache:
            cache[letter.run_id] = engine.nodes(letter.run_id)
        found.append(_letter_json(letter, cache[letter.run_id]))
    return found
