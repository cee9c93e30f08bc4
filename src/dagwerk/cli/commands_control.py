"""Commands that change runs: ``cancel``, ``retry``, ``rerun``, ``resume`` and ``dlq``."""

from __future__ import annotations

import click

from dagwerk.cli.app import CliError, safe_line
from dagwerk.cli.commands_common import (
    db_option,
    echo_json,
    format_time,
    json_option,
    open_engine,
    parse_json_argument,
    render_table,
)

__all__ = ["cancel", "dlq", "rerun", "resume", "retry"]


@click.command()
@click.argument("run_id", metavar="RUN")
@db_option
@click.option("--reason", help="Recorded as the run's error.")
def cancel(run_id: str, db: str, reason: str | None) -> None:
    """Cancel a pending or running run (its waits and unfinished tasks too).

    Workers running its tasks see the cancellation and abort them.

    \b
    Example:
      dagwerk cancel run-1f2e3d4c5b6a7980 --reason "wrong input"
    """
    with open_engine(db, create=False) as engine:
        if not engine.cancel(run_id, reason=reason):
            record = engine.get_run(run_id)
            status = record.status.value if record is not None else "missing"
            raise CliError(f"run {run_id} was not cancelled: it is already {status}")
    click.echo(f"run {run_id}: cancelled")


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option(
    "--from",
    "boundary",
    multiple=True,
    metavar="SLUG",
    help="Retry from this failed node (and its descendants); repeatable.",
)
@db_option
@json_option
def retry(run_id: str, boundary: tuple[str, ...], db: str, as_json: bool) -> None:
    """Reopen a failed, crashed or cancelled run; its failed work is queued again.

    Successful nodes keep their outputs; failed nodes and everything
    downstream run again as a new generation once a worker serves them.

    \b
    Examples:
      dagwerk retry run-1f2e3d4c5b6a7980
      dagwerk retry run-1f2e3d4c5b6a7980 --from store
    """
    with open_engine(db, create=False) as engine:
        result = engine.retry(run_id, boundary=list(boundary) or None)
        nodes = engine.nodes(run_id)
    slugs = [nodes[index].slug for index in result.affected_nodes]
    if as_json:
        echo_json({"run_id": run_id, "retry_count": result.retry_count, "nodes": slugs})
        return
    what = f"node {slugs[0]}" if len(slugs) == 1 else f"{len(slugs)} nodes ({', '.join(slugs)})"
    kept = len(nodes) - len(slugs)
    kept_text = ""
    if kept == 1:
        kept_text = "; the other node keeps its outputs"
    elif kept > 1:
        kept_text = f"; the other {kept} nodes keep their outputs"
    click.echo(
        safe_line(
            f"run {run_id}: reopened (retry {result.retry_count}); {what} will run again{kept_text}"
        )
    )
    click.echo(
        f"next: start a worker to run them (dagwerk worker --pipeline FILE [--burst]); "
        f"then: dagwerk show {run_id}"
    )


@click.command()
@click.argument("run_id", metavar="RUN")
@click.option("--node", "nodes", multiple=True, required=True, metavar="SLUG", help="Repeatable.")
@db_option
def rerun(run_id: str, nodes: tuple[str, ...], db: str) -> None:
    """Run nodes and everything downstream of them again, even in a completed run.

    \b
    Example:
      dagwerk rerun run-1f2e3d4c5b6a7980 --node report
    """
    with open_engine(db, create=False) as engine:
        engine.rerun(run_id, list(nodes))
    click.echo(f"run {run_id}: re-running {', '.join(nodes)} and their descendants")


@click.command()
@click.argument("task_id", metavar="TASK")
@click.argument("wait_id", metavar="WAIT_ID")
@click.option("--response", metavar="JSON", help="JSON stored for the resumed attempt.")
@db_option
@json_option
def resume(task_id: str, wait_id: str, response: str | None, db: str, as_json: bool) -> None:
    """Resume a waiting task; a worker runs its next attempt.

    `dagwerk show RUN` lists waiting tasks with their wait IDs. Repeating the
    command is safe: it prints the first resume's result and queues nothing
    (the first response stays).

    \b
    Examples:
      dagwerk resume 8c1d...-task approval:8c1d... --response '{"approved": true}'
      dagwerk resume 8c1d...-task approval:8c1d... --json
    """
    value = parse_json_argument(response, "--response") if response is not None else None
    with open_engine(db, create=False) as engine:
        result = engine.resume(task_id, wait_id, response=value)
    if as_json:
        echo_json(
            {
                "task_id": result.task_id,
                "wait_id": result.wait_id,
                "run_id": result.run_id,
                "node_index": result.node_index,
                "generation": result.generation,
                "waiting_attempt_id": result.waiting_attempt_id,
                "resumed_attempt_id": result.resumed_attempt_id,
            }
        )
        return
    click.echo(f"task {task_id}: resumed from {wait_id} as attempt {result.resumed_attempt_id}")


@click.group()
def dlq() -> None:
    """Inspect and re-inject the dead-letter queue.

    \b
    Examples:
      dagwerk dlq list
      dagwerk dlq reinject 5b0c2f...
    """


@dlq.command("list")
@click.option("--run", "run_id", metavar="RUN", help="Only this run's dead letters.")
@db_option
@json_option
def dlq_list(run_id: str | None, db: str, as_json: bool) -> None:
    """List dead letters in the order they were parked.

    \b
    Example:
      dagwerk dlq list --json
    """
    with open_engine(db, create=False) as engine:
        letters = engine.list_dead_letters(run_id)
    if as_json:
        echo_json(
            [
                {
                    "dead_letter_id": d.dead_letter_id,
                    "run_id": d.run_id,
                    "task_id": d.task_id,
                    "attempt_id": d.attempt_id,
                    "queue": d.queue,
                    "delivery_count": d.delivery_count,
                    "reason": d.reason,
                    "dead_at": d.dead_at,
                    "reinjected_attempt_id": d.reinjected_attempt_id,
                }
                for d in letters
            ]
        )
        return
    render_table(
        "dead letters",
        ("id", "run", "task", "deliveries", "reason", "parked", "reinjected as"),
        [
            (
                d.dead_letter_id,
                d.run_id,
                d.task_id,
                d.delivery_count,
                d.reason,
                format_time(d.dead_at),
                d.reinjected_attempt_id,
            )
            for d in letters
        ],
    )


@dlq.command("reinject")
@click.argument("dead_letter_id", metavar="ID")
@db_option
def dlq_reinject(dead_letter_id: str, db: str) -> None:
    """Give a dead letter's task a fresh attempt on the queue.

    \b
    Example:
      dagwerk dlq reinject 5b0c2f...
    """
    with open_engine(db, create=False) as engine:
        attempt = engine.reinject(dead_letter_id)
    if attempt is None:
        raise CliError(
            safe_line(
                f"dead letter {dead_letter_id} was not re-injected: it is unknown, already "
                "re-injected, or its task or run has moved on"
            )
        )
    click.echo(f"dead letter {dead_letter_id}: re-injected as attempt {attempt}")
