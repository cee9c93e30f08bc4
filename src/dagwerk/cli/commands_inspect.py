"""Commands that read runs: ``runs``, ``show`` and ``outputs``."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

import click

from dagwerk.cli.app import safe_line
from dagwerk.cli.commands_common import (
    DEFAULT_DB,
    db_option,
    echo_json,
    format_time,
    json_option,
    json_text,
    last_nodes,
    open_engine,
    render_table,
)
from dagwerk.cli.commands_logs import line_json, line_text, log_tail
from dagwerk.cli.composite import describe_composite, render_composite
from dagwerk.cli.journal_view import add_journals, render_journals
from dagwerk.constants import TaskStatus

if TYPE_CHECKING:
    from dagwerk.engine import Engine
    from dagwerk.store import TaskRecord
    from dagwerk.store_logs import TaskLogLine

__all__ = ["outputs", "runs", "show"]

_STATUSES = ["pending", "running", "completed", "failed", "crashed", "cancelled"]
_TASK_STATUSES = [status.value for status in TaskStatus]


@click.command()
@db_option
@click.option("--status", type=click.Choice(_STATUSES), help="Only runs with this status.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--stalled", is_flag=True, help="Only RUNNING runs that are stalled, with why.")
@click.option("--schedule", metavar="NAME", help="Only runs of this schedule, newest tick first.")
@json_option
def runs(
    *,
    db: str,
    status: str | None,
    limit: int,
    as_json: bool,
    stalled: bool = False,
    schedule: str | None = None,
) -> None:
    """List runs, newest first.

    \b
    Examples:
      dagwerk runs
      dagwerk runs --status failed --json
      dagwerk runs --stalled
      dagwerk runs --schedule nightly
    """
    if stalled:
        from dagwerk.cli.commands_gated import echo_stalled

        with open_engine(db, create=False) as engine:
            echo_stalled(engine, limit, as_json)
        return
    with open_engine(db, create=False) as engine:
        records = engine.list_runs(status=status, limit=limit, schedule=schedule)
    if as_json:
        echo_json([_run_json(record) for record in records])
        return
    rows = [
        (
            r.run_id,
            r.pipeline,
            r.status.value,
            f"{r.settled_nodes}/{r.node_count}",
            r.retry_count,
            format_time(getattr(r, "created_at", None)),
            r.error,
        )
        for r in records
    ]
    render_table(
        "runs", ("run", "pipeline", "status", "nodes", "retries", "created", "error"), rows
    )


def _run_json(record: Any) -> dict[str, Any]:
    return {
        "run_id": record.run_id,
        "pipeline": record.pipeline,
        "status": record.status.value,
        "failure_policy": record.failure_policy.value,
        "retry_count": record.retry_count,
        "error": record.error,
        "node_count": record.node_count,
        "settled_nodes": record.settled_nodes,
        "created_at": getattr(record, "created_at", None),
        "finished_at": getattr(record, "finished_at", None),
    }


def _attempts(engine: Engine, task: TaskRecord) -> list[dict[str, Any]] | None:
    from dagwerk.engine import UnsupportedOperationError

    try:
        attempts = engine.list_attempts(task.task_id)
    except UnsupportedOperationError:
        return None
    return [
        {
            "attempt_id": a.attempt_id,
            "number": a.number,
            # An unfinished current attempt has no outcome yet: its state is
            # the task's (queued, running or waiting).
            "status": (
                a.status.value
                if a.status is not None
                else task.status.value
                if a.attempt_id == task.attempt_id
                else None
            ),
            "error": a.error,
            "worker_id": a.worker_id,
            "resumed_from_wait_id": a.resumed_from_wait_id,
            "started_at": a.started_at,
            "finished_at": a.finished_at,
            "traceback": a.traceback,
        }
        for a in attempts
    ]


def describe_run(engine: Engine, run_id: str) -> dict[str, Any]:
    """Everything ``show`` prints, as one JSON-ready dict."""
    from dagwerk.engine import RunNotFoundError

    record = engine.get_run(run_id)
    if record is None:
        raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
    nodes = engine.nodes(run_id)
    launches = engine.node_launches(run_id)
    tasks = engine.list_tasks(run_id)
    per_node: dict[int, dict[str, int]] = {}
    for task in tasks:
        counts = per_node.setdefault(task.node_index, {})
        counts[task.status.value] = counts.get(task.status.value, 0) + 1
    node_rows = []
    for index, node in enumerate(nodes):
        launch = launches.get(index)
        node_rows.append(
            {
                "slug": node.slug,
                "plugin": node.plugin,
                "input_mode": node.input_mode.value if node.input_mode else "-",
                "disposition": launch.disposition.value if launch is not None else None,
                "generation": launch.generation if launch is not None else None,
                "complete": launch.complete if launch is not None else False,
                "error": (launch.error or None) if launch is not None else None,
                "tasks": per_node.get(index, {}),
            }
        )
    task_rows = []
    tails = 0
    for task in tasks:
        tail = None
        if task.status in (TaskStatus.FAILED, TaskStatus.CRASHED) and tails < MAX_LISTED:
            # A failed task's last log lines, next to its error.
            tails += 1
            slug = nodes[task.node_index].slug
            lines = log_tail(engine, run_id, task.task_id, task.attempt_number)
            tail = [line_json(line, slug) for line in lines]
        task_rows.append(
            {
                "task_id": task.task_id,
                "node": nodes[task.node_index].slug,
                "status": task.status.value,
                "attempt_id": task.attempt_id,
                "attempt": getattr(task, "attempt_number", None),
                "generation": task.generation,
                "error": task.error,
                "waiting_on": task.active_wait_id,
                "resumed_from_wait_id": task.resumed_from_wait_id,
                "started_at": task.started_at,
                "finished_at": task.finished_at,
                "attempts": _attempts(engine, task),
                "log_tail": tail,
            }
        )
    add_journals(engine, run_id, task_rows)
    letters = [
        {
            "dead_letter_id": d.dead_letter_id,
            "task_id": d.task_id,
            "reason": d.reason,
            "reinjected_attempt_id": d.reinjected_attempt_id,
        }
        for d in engine.list_dead_letters(run_id)
    ]
    return {
        **describe_composite(engine, run_id),
        "run": _run_json(record),
        "nodes": node_rows,
        "tasks": task_rows,
        "waits": [
            {"task_id": t["task_id"], "node": t["node"], "wait_id": t["waiting_on"]}
            for t in task_rows
            if t["waiting_on"]
        ],
        "dead_letters": letters,
    }


MAX_LISTED = 10
"""The summary of ``show`` lists at most this many waits and failed attempts."""


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 0.1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s"


def _run_line(run: dict[str, Any]) -> str:
    name = f" ({run['pipeline']})" if run.get("pipeline") else ""
    took = ""
    if run["finished_at"] is not None and run["created_at"]:
        took = f", took {_duration(run['finished_at'] - run['created_at'])}"
    return (
        f"run {run['run_id']}{name}: {run['status']} "
        f"(nodes {run['settled_nodes']}/{run['node_count']}, "
        f"policy {run['failure_policy']}, retries {run['retry_count']}), "
        f"created {format_time(run['created_at'])}{took}"
    )


def _more(count: int, what: str, command: str) -> None:
    if count > 0:
        click.echo(safe_line(f"... and {count} more {what}: {command}"))


@click.command()
@click.argument("run_id", metavar="RUN")
@db_option
@click.option("--why", is_flag=True, help="Explain per node why it has (not) run.")
@click.option("--tasks", "list_tasks", is_flag=True, help="List the tasks, one per line.")
@click.option(
    "--node",
    "node_filter",
    multiple=True,
    metavar="SLUG",
    help="With --tasks (or --json): only this node's tasks; repeatable.",
)
@click.option(
    "--status",
    "status_filter",
    multiple=True,
    type=click.Choice(_TASK_STATUSES),
    help="With --tasks (or --json): only tasks with this status; repeatable.",
)
@json_option
def show(
    *,
    run_id: str,
    db: str,
    as_json: bool,
    why: bool = False,
    list_tasks: bool = False,
    node_filter: tuple[str, ...] = (),
    status_filter: tuple[str, ...] = (),
) -> None:
    """Show a run: its nodes with their task counts, waits, failures and dead letters.

    The summary has one line per node; --tasks lists the tasks (filtered with
    --node and --status), each with its attempt, when that attempt started
    (UTC) and how long it took, and its error or wait. --json prints
    everything (all tasks unless filtered; times as epoch seconds).

    \b
    Examples:
      dagwerk show run-1f2e3d4c5b6a7980
      dagwerk show run-1f2e3d4c5b6a7980 --tasks --node score --status failed
      dagwerk show run-1f2e3d4c5b6a7980 --json | jq '.tasks[] | select(.error)'
      dagwerk show run-1f2e3d4c5b6a7980 --why
    """
    if why:
        from dagwerk.cli.commands_gated import show_why

        with open_engine(db, create=False) as engine:
            show_why(engine, run_id, as_json)
        return
    with open_engine(db, create=False) as engine:
        described = describe_run(engine, run_id)
    slugs = [node["slug"] for node in described["nodes"]]
    unknown = [slug for slug in node_filter if slug not in slugs]
    if unknown:
        from dagwerk.engine import UnknownNodeError

        raise UnknownNodeError(
            f"run {run_id!r} has no node {unknown[0]!r} (nodes: {', '.join(slugs)})",
            field="nodes",
        )
    tasks = [
        task
        for task in described["tasks"]
        if (not node_filter or task["node"] in node_filter)
        and (not status_filter or task["status"] in status_filter)
    ]
    if as_json:
        echo_json({**described, "tasks": tasks})
        return
    run = described["run"]
    click.echo(safe_line(_run_line(run)))
    if run["error"]:
        click.echo(safe_line(f"error: {run['error']}"))
    if list_tasks or node_filter or status_filter:
        _print_tasks(tasks)
        return
    _print_summary(described, db)


def _as_line(item: dict[str, Any]) -> TaskLogLine:
    from dagwerk.store_logs import TaskLogLine

    return TaskLogLine(
        run_id=item["run_id"],
        task_id=item["task_id"],
        node_index=0,
        attempt=item["attempt"],
        at=item["at"],
        level=item["level"],
        logger=item["logger"],
        message=item["message"],
        traceback=item["traceback"],
        line_id=item["line_id"],
    )


def _took(task: dict[str, Any]) -> str:
    """How long the task's current attempt ran, once it settled."""
    started, finished = task["started_at"], task["finished_at"]
    return "-" if started is None or finished is None else _duration(finished - started)


def _print_tasks(tasks: list[dict[str, Any]]) -> None:
    render_table(
        "tasks",
        ("task", "node", "status", "attempt", "started", "took", "error / wait"),
        [
            (
                t["task_id"],
                t["node"],
                t["status"],
                t["attempt"] if t["attempt"] is not None else t["attempt_id"],
                format_time(t["started_at"]),
                _took(t),
                t["error"] or (f"waiting on {t['waiting_on']}" if t["waiting_on"] else None),
            )
            for t in tasks
        ],
    )


def _print_summary(described: dict[str, Any], db: str) -> None:
    run_id = described["run"]["run_id"]
    where = "" if db == DEFAULT_DB else f" --db {shlex.quote(db)}"
    render_table(
        "nodes",
        ("node", "plugin", "mode", "disposition", "gen", "tasks"),
        [
            (
                n["slug"],
                n["plugin"],
                n["input_mode"],
                n["disposition"] or "not launched",
                n["generation"],
                ", ".join(f"{count} {status}" for status, count in n["tasks"].items()) or "-",
            )
            for n in described["nodes"]
        ],
    )
    failed_attempts = [
        (t["task_id"], t["node"], a["number"], a["status"], a["error"])
        for t in described["tasks"]
        for a in (t["attempts"] or [])
        if a["error"]
    ]
    if failed_attempts:
        render_table(
            "failed attempts",
            ("task", "node", "attempt", "status", "error"),
            failed_attempts[:MAX_LISTED],
        )
        _more(
            len(failed_attempts) - MAX_LISTED,
            "failed attempts",
            f"dagwerk show {run_id} --json{where}",
        )
    for task in described["tasks"]:
        if task.get("log_tail"):
            click.echo(
                safe_line(
                    f"last log lines of task {task['task_id']} ({task['node']}, "
                    f"attempt {task['attempt']}): dagwerk logs {run_id} --task "
                    f"{task['task_id']}{where}"
                )
            )
            for item in task["log_tail"]:
                for text in line_text(_as_line(item), task["node"]):
                    click.echo("  " + text)
    waits = described["waits"]
    for wait in waits[:MAX_LISTED]:
        click.echo(
            safe_line(
                f"waiting: task {wait['task_id']} ({wait['node']}) on {wait['wait_id']}; "
                f"resume: dagwerk resume {wait['task_id']} {wait['wait_id']}{where} "
                "--response JSON"
            )
        )
    _more(
        len(waits) - MAX_LISTED,
        "waiting tasks",
        f"dagwerk show {run_id} --tasks --status waiting{where}",
    )
    if described["dead_letters"]:
        render_table(
            "dead letters",
            ("id", "task", "reason", "reinjected as"),
            [
                (d["dead_letter_id"], d["task_id"], d["reason"], d["reinjected_attempt_id"])
                for d in described["dead_letters"]
            ],
        )
    _more(
        render_journals(described["tasks"]),
        "recorded steps and waits",
        f"dagwerk show {run_id} --json{where}",
    )
    render_composite(described)
    if described["tasks"]:
        click.echo(f"tasks: dagwerk show {run_id} --tasks [--node SLUG] [--status STATUS]{where}")


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option(
    "--node",
    "slugs",
    multiple=True,
    metavar="SLUG",
    help="This node's outputs (repeatable; default: the last nodes, which no node reads).",
)
@db_option
@json_option
def outputs(run_id: str, slugs: tuple[str, ...], db: str, as_json: bool) -> None:
    """Print the outputs nodes of a run published, as JSON.

    Each output is one line: its fields (what edges route on) and, when it
    has any, its data. Works on a run in any state; a node that has not run
    yet has no outputs.

    \b
    Examples:
      dagwerk outputs run-1f2e3d4c5b6a7980
      dagwerk outputs run-1f2e3d4c5b6a7980 --node score --json
    """
    from dagwerk.engine import UnknownNodeError

    with open_engine(db, create=False) as engine:
        result = engine.result(run_id)
        nodes = engine.nodes(run_id)
    known = [node.slug for node in nodes]
    unknown = [slug for slug in slugs if slug not in known]
    if unknown:
        raise UnknownNodeError(
            f"run {run_id!r} has no node {unknown[0]!r} (nodes: {', '.join(known)})",
            field="nodes",
        )
    chosen = list(dict.fromkeys(slugs)) or last_nodes(nodes)
    published = {slug: result.outputs.get(slug, ()) for slug in chosen}
    if as_json:
        echo_json(
            {
                "run_id": run_id,
                "status": result.status.value,
                "outputs": {
                    slug: [{"id": out.id, "fields": out.fields, "data": out.data} for out in values]
                    for slug, values in published.items()
                },
            }
        )
        return
    click.echo(safe_line(f"run {run_id}: {result.status.value}"))
    for slug, values in published.items():
        count = f"{len(values)} output" + ("" if len(values) == 1 else "s")
        click.echo(safe_line(f"{slug} ({count}):"))
        for out in values:
            data = f"  data: {json_text(out.data)}" if out.data else ""
            click.echo(safe_line(f"  {json_text(out.fields)}{data}"))
