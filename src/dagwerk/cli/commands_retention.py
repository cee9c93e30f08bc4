"""``gc``: delete old finished runs, and the age options it shares with ``worker``."""

from __future__ import annotations

import click

from dagwerk.cli.app import InvalidInputError
from dagwerk.cli.commands_common import db_option, echo_json, json_option, open_engine
from dagwerk.constants import RUN_TERMINAL_STATUSES, RunStatus
from dagwerk.runtime.retention import RetentionConfigError, RetentionSummary, parse_age
from dagwerk.store_retention import DEFAULT_RETENTION_BATCH, MAX_RETENTION_BATCH

__all__ = ["age_seconds", "gc"]

_TERMINAL = [status.value for status in RunStatus if status in RUN_TERMINAL_STATUSES]


def age_seconds(text: str, option: str) -> float:
    """``text`` (``30d``, ``12h``, ``90m``, ``45s``, ``2w``) as seconds; anything
    else is invalid input naming ``option``."""
    try:
        return parse_age(text)
    except RetentionConfigError as exc:
        raise InvalidInputError(
            f"{option} must be an age such as 30d, 12h, 90m or 45s, got {text!r}"
        ) from exc


def _statuses(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in _TERMINAL]
    if unknown or not names:
        raise InvalidInputError(
            f"--status takes terminal statuses separated by commas ({','.join(_TERMINAL)}), "
            f"got {text!r}"
        )
    return names


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _describe(summary: RetentionSummary) -> str:
    runs = _plural(summary.runs, "run")
    if summary.dry_run:
        text = f"would delete {runs} (nothing deleted: --dry-run)"
    else:
        details = [
            f"{count} {kind.replace('_', ' ')}"
            for kind, count in sorted(summary.rows.items())
            if kind != "runs"
        ]
        text = f"deleted {runs}" + (f" ({', '.join(details)})" if details else "")
    if summary.passed:
        text += f"; kept {_plural(summary.passed, 'old run')} whose child runs are not all finished"
    return text


@click.command()
@click.option(
    "--older-than",
    required=True,
    metavar="AGE",
    help="Delete runs that finished longer ago than this (30d, 12h, 90m, 45s, 2w).",
)
@click.option(
    "--status",
    "status_text",
    metavar="LIST",
    help=f"Only runs that ended so, comma-separated (default: all of {','.join(_TERMINAL)}).",
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option(
    "--batch-size",
    type=click.IntRange(1, MAX_RETENTION_BATCH),
    default=DEFAULT_RETENTION_BATCH,
    show_default=True,
    help="Runs deleted per transaction.",
)
@db_option
@json_option
def gc(
    *,
    older_than: str,
    status_text: str | None,
    dry_run: bool,
    batch_size: int,
    db: str,
    as_json: bool,
) -> None:
    """Delete finished runs older than --older-than, with everything stored for them.

    A run goes with its tasks, attempts, outputs, waits, queue and dead-letter
    rows and budget accounts. A parent run takes its child runs with it; a
    child run is deleted only with its parent, and only once every run of
    the family has finished. Runs still pending, running or waiting are never
    touched. Deletes a batch at a time, so workers keep running; several gc
    commands may run at once.

    \b
    Examples:
      dagwerk gc --older-than 30d --dry-run
      dagwerk gc --older-than 7d --status completed,cancelled
    """
    seconds = age_seconds(older_than, "--older-than")
    statuses = _statuses(status_text)
    with open_engine(db, create=False) as engine:
        summary = engine.delete_runs(
            seconds, statuses=statuses, dry_run=dry_run, batch_size=batch_size
        )
    if as_json:
        echo_json(
            {
                "dry_run": summary.dry_run,
                "older_than_seconds": seconds,
                "statuses": statuses or _TERMINAL,
                "runs": summary.runs,
                "rows": dict(sorted(summary.rows.items())),
                "kept_unfinished_lineages": summary.passed,
                "batches": summary.batches,
            }
        )
        return
    click.echo(_describe(summary))
