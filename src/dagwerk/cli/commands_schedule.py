"""Commands of schedules: ``schedule add|list|show|pause|resume|delete|sync``
and ``backfill``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from dagwerk.cli.app import safe_line
from dagwerk.cli.commands_common import (
    db_option,
    echo_json,
    json_option,
    load_pipeline_plugins,
    no_plugin_check_option,
    open_engine,
    parse_json_argument,
    plugins_option,
    render_table,
)

if TYPE_CHECKING:
    from dagwerk.engine import Engine
    from dagwerk.store import ScheduleRecord

__all__ = ["backfill", "schedule"]

_CATCHUP = click.Choice(["skip", "latest", "all"])
_OVERLAP = click.Choice(["allow", "skip", "cancel_previous"])
SHOWN_TICKS = 5
SHOWN_RUNS = 10


@click.group()
def schedule() -> None:
    """Start runs of a pipeline on a schedule (cron or a fixed interval).

    Every `dagwerk worker` (and `dagwerk serve`) takes part in firing
    schedules; one process at a time holds the scheduling lease.
    """


def _ticks_text(engine: Engine, record: ScheduleRecord) -> list[str]:
    from dagwerk.scheduling.triggers import format_tick

    zone = record.definition.zone
    return [format_tick(tick, zone) for tick in engine.next_ticks(record.name, SHOWN_TICKS)]


def _record_json(engine: Engine, record: ScheduleRecord, *, details: bool) -> dict[str, Any]:
    from dagwerk.json import thaw_json
    from dagwerk.scheduling.triggers import format_tick

    definition = record.definition
    zone = definition.zone
    document: dict[str, Any] = {
        "name": record.name,
        "pipeline": definition.pipeline,
        "pipeline_name": definition.pipeline_name,
        "cron": definition.cron,
        "every_seconds": definition.every,
        "timezone": definition.timezone,
        "start": None if definition.start_at is None else format_tick(definition.start_at, zone),
        "end": None if definition.end_at is None else format_tick(definition.end_at, zone),
        "catchup": definition.catchup.value,
        "catchup_limit": definition.catchup_limit,
        "overlap": definition.overlap.value,
        "paused": record.paused,
        "input": thaw_json(definition.run_input),
        "next_ticks": [] if record.paused else _ticks_text(engine, record),
    }
    if details:
        document["last_runs"] = [
            {
                "tick": format_tick(fire.tick, zone),
                "run_id": fire.run_id,
                "source": fire.source.value,
                "status": _status(engine, fire.run_id),
            }
            for fire in engine.schedule_fires(record.name, SHOWN_RUNS)
        ]
    return document


def _status(engine: Engine, run_id: str | None) -> str:
    if run_id is None:
        return "skipped"
    record = engine.get_run(run_id)
    return "-" if record is None else record.status.value


@schedule.command("add")
@click.argument("name")
@click.argument("pipeline_file", metavar="PIPELINE", type=click.Path(dir_okay=False))
@click.option("--cron", metavar="EXPR", help="A 5-field cron expression or @hourly, @daily, ...")
@click.option("--every", metavar="DURATION", help="A fixed interval instead: 30s, 10m, 2h, 1d.")
@click.option("--input", "input_text", metavar="JSON", help="Run input of each run (JSON object).")
@click.option("--timezone", default="UTC", show_default=True, help="IANA zone of --cron.")
@click.option("--start", metavar="WHEN", help="No tick before this date or time (ISO 8601).")
@click.option("--end", metavar="WHEN", help="No tick after this date or time (ISO 8601).")
@click.option("--catchup", type=_CATCHUP, default="skip", show_default=True)
@click.option("--catchup-limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--overlap", type=_OVERLAP, default="allow", show_default=True)
@click.option("--replace", is_flag=True, help="Replace a schedule of the same name.")
@db_option
@plugins_option
@no_plugin_check_option
@json_option
def add(
    *,
    name: str,
    pipeline_file: str,
    cron: str | None,
    every: str | None,
    input_text: str | None,
    timezone: str,
    start: str | None,
    end: str | None,
    catchup: str,
    catchup_limit: int,
    overlap: str,
    replace: bool,
    db: str,
    plugin_modules: tuple[str, ...],
    plugin_check: bool,
    as_json: bool,
) -> None:
    """Add schedule NAME: a run of the pipeline file PIPELINE at each tick.

    Each run gets input.scheduled_for, the tick in ISO 8601 with the zone's
    offset. --catchup says which ticks missed while no worker ran still fire
    (skip: none; latest: the newest; all: each, at most --catchup-limit);
    --overlap what a tick does while the previous run is unfinished.

    \b
    Examples:
      dagwerk schedule add nightly etl.yaml --cron "0 2 * * *" --timezone Europe/Berlin
      dagwerk schedule add poll etl.yaml --every 30s --overlap skip
    """
    from dagwerk.cli.app import InvalidInputError
    from dagwerk.engine import EngineRegistry
    from dagwerk.pipeline_file import load_pipeline

    run_input = None
    if input_text is not None:
        parsed = parse_json_argument(input_text, "--input")
        if not isinstance(parsed, dict):
            raise InvalidInputError("--input must be a JSON object")
        run_input = parsed
    pipeline = load_pipeline(pipeline_file)
    if plugin_check:
        load_pipeline_plugins(pipeline, EngineRegistry(), plugin_modules)
    with open_engine(db) as engine:
        record = engine.schedule(
            name,
            pipeline_file,
            cron=cron,
            every=every,
            input=run_input,
            timezone=timezone,
            start=start,
            end=end,
            catchup=catchup,
            catchup_limit=catchup_limit,
            overlap=overlap,
            replace=replace,
        )
        if as_json:
            echo_json(_record_json(engine, record, details=False))
            return
        ticks = _ticks_text(engine, record)
    click.echo(safe_line(f"schedule {record.name}: {record.definition.describe()}"))
    if ticks:
        click.echo(f"  next: {ticks[0]}")


@schedule.command("list")
@db_option
@json_option
def list_(db: str, as_json: bool) -> None:
    """List schedules with their next tick."""
    with open_engine(db, create=False) as engine:
        records = engine.list_schedules()
        documents = [_record_json(engine, record, details=False) for record in records]
    if as_json:
        echo_json(documents)
        return
    rows = [
        (
            doc["name"],
            doc["pipeline_name"] or doc["pipeline"],
            f"cron {doc['cron']}" if doc["cron"] else f"every {doc['every_seconds']}s",
            doc["timezone"],
            "paused" if doc["paused"] else "active",
            doc["next_ticks"][0] if doc["next_ticks"] else "-",
        )
        for doc in documents
    ]
    render_table("schedules", ("name", "pipeline", "when", "zone", "state", "next"), rows)


@schedule.command("show")
@click.argument("name")
@db_option
@json_option
def show(name: str, db: str, as_json: bool) -> None:
    """Show a schedule, its next 5 ticks and its last runs."""
    with open_engine(db, create=False) as engine:
        doc = _record_json(engine, engine.get_schedule(name), details=True)
    if as_json:
        echo_json(doc)
        return
    when = f"cron {doc['cron']}" if doc["cron"] else f"every {doc['every_seconds']}s"
    lines = [
        f"schedule {doc['name']} ({'paused' if doc['paused'] else 'active'})",
        f"  pipeline: {doc['pipeline']}",
        f"  when: {when} in {doc['timezone']}",
        f"  catchup: {doc['catchup']} (limit {doc['catchup_limit']}); overlap: {doc['overlap']}",
    ]
    if doc["start"] or doc["end"]:
        lines.append(f"  window: {doc['start'] or '-'} .. {doc['end'] or '-'}")
    lines.append("  next ticks:" + ("" if doc["next_ticks"] else " -"))
    lines.extend(f"    {tick}" for tick in doc["next_ticks"])
    for line in lines:
        click.echo(safe_line(line))
    rows = [(run["tick"], run["run_id"], run["source"], run["status"]) for run in doc["last_runs"]]
    render_table("last runs", ("tick", "run", "source", "status"), rows)


def _simple(verb: str, doc: str) -> click.Command:
    @click.argument("name")
    @db_option
    def command(name: str, db: str) -> None:
        with open_engine(db, create=False) as engine:
            if verb == "pause":
                engine.pause_schedule(name)
            elif verb == "resume":
                engine.resume_schedule(name)
            else:
                engine.delete_schedule(name)
        done = {"pause": "paused", "resume": "resumed", "delete": "deleted"}[verb]
        click.echo(safe_line(f"schedule {name}: {done}"))

    command.__doc__ = doc
    return schedule.command(verb)(command)


_simple("pause", "Stop a schedule's ticks (its runs go on).")
_simple("resume", "Start a paused schedule again; ticks of the pause do not fire.")
_simple("delete", "Delete a schedule and its tick records; its runs stay.")


@schedule.command("sync")
@click.argument("pipeline_file", metavar="FILE", type=click.Path(dir_okay=False))
@db_option
@json_option
def sync(pipeline_file: str, db: str, as_json: bool) -> None:
    """Apply the `schedules:` a pipeline file declares: add new schedules,
    replace changed ones; others in the database are left alone.

    \b
    Example (in etl.yaml):
      schedules:
        - name: nightly
          cron: "0 2 * * *"
          timezone: Europe/Berlin
    """
    with open_engine(db) as engine:
        report = engine.sync_schedules(pipeline_file)
    if as_json:
        echo_json(
            {
                "added": list(report.added),
                "updated": list(report.updated),
                "unchanged": list(report.unchanged),
            }
        )
        return
    for label, names in (
        ("added", report.added),
        ("updated", report.updated),
        ("unchanged", report.unchanged),
    ):
        for found in names:
            click.echo(safe_line(f"{label}: {found}"))
    if not (report.added or report.updated or report.unchanged):
        click.echo("the file declares no schedules")


@click.command()
@click.argument("name")
@click.option("--from", "start", required=True, metavar="WHEN", help="First date or time.")
@click.option("--to", "end", required=True, metavar="WHEN", help="Last date (whole day) or time.")
@click.option("--max-active", type=click.IntRange(1, 1_000), default=4, show_default=True)
@db_option
@json_option
def backfill(*, name: str, start: str, end: str, max_active: int, db: str, as_json: bool) -> None:
    """Create one run per tick of schedule NAME in a date range, at most
    --max-active unfinished at a time, and wait until all are finished.

    Workers (`dagwerk worker`) do the work. Ticks that already have a run (from
    the schedule or an earlier backfill) get none, so running it again after
    an interruption only fills in what is missing.

    \b
    Example:
      dagwerk backfill nightly --from 2026-01-01 --to 2026-01-31 --max-active 4
    """
    from dagwerk.engine import BackfillProgress

    last: list[tuple[int, int, int]] = []

    def progress(state: BackfillProgress) -> None:
        key = (state.created, state.active, state.remaining)
        if last and last[-1] == key:
            return
        last.append(key)
        click.echo(
            f"backfill {name}: {state.ticks} ticks, {state.created} runs created, "
            f"{state.existing} had one, {state.active} unfinished, {state.remaining} to create",
            err=True,
        )

    with open_engine(db, create=False) as engine:
        report = engine.backfill(name, start, end, max_active=max_active, on_progress=progress)
        statuses = {run_id: status.value for run_id, status in report.statuses.items()}
        zone = engine.get_schedule(name).definition.zone
    from dagwerk.scheduling.triggers import format_tick

    runs = [
        {
            "tick": format_tick(tick, zone),
            "run_id": run_id,
            "status": "skipped" if run_id is None else statuses.get(run_id, "-"),
            "created": tick in report.created,
        }
        for tick, run_id in report.runs.items()
    ]
    if as_json:
        echo_json({"schedule": name, "runs": runs})
        return
    render_table(
        f"backfill {name}",
        ("tick", "run", "status", "new"),
        [(r["tick"], r["run_id"], r["status"], "yes" if r["created"] else "") for r in runs],
    )
    click.echo(f"{len(report.created)} runs created, {len(runs) - len(report.created)} existed")
