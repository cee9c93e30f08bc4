"""``dagwerk logs``: what a run's plugins logged, per attempt."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from dagwerk.cli.app import safe_line
from dagwerk.cli.commands_common import db_option, echo_json, json_option, open_engine

if TYPE_CHECKING:
    from dagwerk.store_logs import TaskLogLine

__all__ = ["FOLLOW_POLL_SECONDS", "line_json", "line_text", "logs"]

FOLLOW_POLL_SECONDS = 0.5
"""How often ``--follow`` looks for new lines."""


def line_json(line: TaskLogLine, slug: str) -> dict[str, Any]:
    """One line as the JSON object ``--json`` prints."""
    return {
        "line_id": line.line_id,
        "run_id": line.run_id,
        "task_id": line.task_id,
        "node": slug,
        "attempt": line.attempt,
        "at": line.at,
        "level": line.level,
        "logger": line.logger,
        "message": line.message,
        "traceback": line.traceback,
    }


def line_text(line: TaskLogLine, slug: str) -> list[str]:
    """One line as text: time (UTC), level, node and attempt, logger, message;
    then the traceback's lines, indented."""
    when = datetime.fromtimestamp(line.at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    head = f"{when} {line.level:<7} {slug}#{line.attempt} {line.logger}: "
    message_lines = line.message.split("\n") or [""]
    out = [safe_line(head + message_lines[0])]
    out.extend(safe_line("    " + rest) for rest in message_lines[1:])
    if line.traceback:
        out.extend(safe_line("    " + rest) for rest in line.traceback.split("\n"))
    return out


@click.command()
@click.argument("run_id", metavar="RUN")
@db_option
@click.option("--task", "task_id", metavar="TASK_ID", help="Only this task's lines.")
@click.option("--node", "node", metavar="SLUG", help="Only the lines of this node's tasks.")
@click.option("--attempt", type=click.IntRange(min=1), help="Only lines of attempt N.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the run ends.")
@json_option
def logs(
    *,
    run_id: str,
    db: str,
    task_id: str | None,
    node: str | None,
    attempt: int | None,
    follow: bool,
    as_json: bool,
) -> None:
    """Print what the run's plugins logged, attempt by attempt, in the order stored.

    Each line shows its time (UTC), level, node and attempt number, logger
    and message, with an exception's traceback below it. --json prints one
    JSON object per line. --follow keeps printing the lines of a running run
    until it is completed, failed or cancelled.

    \b
    Examples:
      dagwerk logs run-1f2e3d4c5b6a7980
      dagwerk logs run-1f2e3d4c5b6a7980 --node score --attempt 2
      dagwerk logs run-1f2e3d4c5b6a7980 --follow
      dagwerk logs run-1f2e3d4c5b6a7980 --json | jq -r 'select(.level == "ERROR") | .message'
    """
    from dagwerk.constants import RUN_TERMINAL_STATUSES

    with open_engine(db, create=False) as engine:
        slugs = [n.slug for n in engine.nodes(run_id)]
        after = 0
        pause = threading.Event()
        while True:
            # The status is read before the lines: once it is terminal, the
            # read that follows has every line its attempts stored.
            status = engine.get_run(run_id)
            terminal = status is None or status.status in RUN_TERMINAL_STATUSES
            lines = engine.logs(run_id, task_id=task_id, node=node, attempt=attempt, after=after)
            for line in lines:
                slug = slugs[line.node_index] if line.node_index < len(slugs) else "?"
                if as_json:
                    echo_json(line_json(line, slug))
                else:
                    for text in line_text(line, slug):
                        click.echo(text)
            if lines:
                after = lines[-1].line_id
            if not follow or terminal:
                return
            pause.wait(FOLLOW_POLL_SECONDS)


TAIL_LINES = 5
"""How many of a failed task's last log lines ``dagwerk show`` prints."""


def log_tail(engine: Any, run_id: str, task_id: str, attempt: int | None) -> list[TaskLogLine]:
    """The last :data:`TAIL_LINES` lines of the task's attempt (none on a
    store that keeps no task logs)."""
    from dagwerk.engine import UnsupportedOperationError

    if attempt is None:
        return []
    try:
        lines = engine.logs(run_id, task_id=task_id, attempt=attempt)
    except UnsupportedOperationError:
        return []
    return list(lines[-TAIL_LINES:])
