"""Commands that start work: ``run``, ``submit`` and ``worker``."""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from dagwerk.cli.app import EXIT_INVALID, InvalidInputError, cli_error, safe_line
from dagwerk.cli.commands_common import (
    DEFAULT_DB,
    db_option,
    debug_option,
    echo_json,
    exit_code_for,
    is_terminal,
    json_option,
    json_text,
    last_nodes,
    load_pipeline_plugins,
    log_level_option,
    no_plugin_check_option,
    open_engine,
    plugins_option,
    read_run_input,
    task_logging,
)
from dagwerk.constants import (
    DEFAULT_BURST_HORIZON,
    DEFAULT_CLAIM_AHEAD,
    DEFAULT_CONCURRENCY,
    MAX_CLAIM_AHEAD,
    RUN_TERMINAL_STATUSES,
    TaskStatus,
)
from dagwerk.errors import DagwerkError
from dagwerk.store_logs import DEFAULT_TASK_LOG_MAX_BYTES, DEFAULT_TASK_LOG_MAX_LINES

if TYPE_CHECKING:
    from dagwerk.engine import Engine, RunProgress, RunResult
    from dagwerk.pipeline_file import Pipeline

__all__ = ["run", "submit", "worker"]

_PIPELINE = click.Path(dir_okay=False, path_type=str)
_EXECUTORS = click.Choice(["thread", "process", "async"])

EXIT_INTERRUPTED = 130
"""``run`` stopped by Ctrl-C (128 + SIGINT, as shells report it)."""

WORKER_IDLE_WAIT = 0.5
"""Seconds an idle ``dagwerk worker`` waits between looks at an empty queue
(new work wakes it at once; a delivery due sooner cuts the wait). A stop
waits for the look in flight."""


def _queue_option(fn: click.decorators.FC) -> click.decorators.FC:
    return click.option(
        "--queue",
        "queues",
        multiple=True,
        metavar="NAME",
        help="Serve only this queue (a node's 'queue:'); repeatable. Default: every queue.",
    )(fn)


def _input_options(fn: click.decorators.FC) -> click.decorators.FC:
    fn = click.option(
        "--input-file", type=click.Path(dir_okay=False), help="Read the run input (JSON) from F."
    )(fn)
    return click.option(
        "--input", "input_text", metavar="JSON", help="Run input as a JSON object."
    )(fn)


def _print_result(result: RunResult, pipeline: Pipeline) -> None:
    task_count = sum(len(outputs) for outputs in result.outputs.values())
    click.echo(f"run {result.run_id}: {result.status.value} ({task_count} outputs)")
    if result.error:
        click.echo(f"  error: {safe_line(result.error)}")
    for slug in last_nodes(pipeline.nodes):
        outputs = result.outputs.get(slug, ())
        for output in outputs[:5]:
            click.echo(safe_line(f"  {slug} -> {json_text(output.fields)}"))
        if len(outputs) > 5:
            click.echo(
                f"  {slug} -> ... {len(outputs) - 5} more "
                f"(dagwerk outputs {result.run_id} --node {slug})"
            )
    if not result.ok:
        click.echo(f"  inspect: dagwerk show {result.run_id}; retry: dagwerk retry {result.run_id}")


MAX_WAIT_NOTICES = 10
"""``run`` names at most this many waiting tasks; ``show --tasks`` lists them all."""


def _db_argument(db: str) -> str:
    return "" if db == DEFAULT_DB else f" --db {shlex.quote(db)}"


class _WaitNotices:
    """Says, once per wait, which task waits and the command that resumes it."""

    def __init__(self, engine: Engine, db: str, echo: Callable[[str], None]) -> None:
        self._engine = engine
        self._db = db
        self._echo = echo
        self._seen: set[tuple[str, str]] = set()
        self._counts: object = None

    def __call__(self, progress: RunProgress) -> None:
        counts = dict(progress.tasks)
        if counts == self._counts:
            return
        self._counts = counts
        if not progress.count(TaskStatus.WAITING):
            return
        nodes = self._engine.nodes(progress.run_id)
        waiting = [
            task
            for task in self._engine.list_tasks(progress.run_id)
            if task.status is TaskStatus.WAITING and task.active_wait_id
        ]
        new = [t for t in waiting if (t.task_id, t.active_wait_id) not in self._seen]
        shown = len(self._seen)
        for task in new:
            wait_id = str(task.active_wait_id)
            self._seen.add((task.task_id, wait_id))
            if shown >= MAX_WAIT_NOTICES:
                continue
            shown += 1
            command = (
                f"dagwerk resume {shlex.quote(task.task_id)} {shlex.quote(wait_id)}"
                f"{_db_argument(self._db)}"
            )
            self._echo(
                safe_line(
                    f"waiting: task {task.task_id} (node {nodes[task.node_index].slug}) "
                    f"on {wait_id}; resume it from another terminal: {command} "
                    "(add --response JSON to answer)"
                )
            )
        hidden = len(self._seen) - shown
        if new and hidden > 0:
            self._echo(
                f"waiting: {hidden} more tasks wait; list them: dagwerk show "
                f"{progress.run_id} --tasks --status waiting{_db_argument(self._db)}"
            )


class _PlainProgress:
    """Prints the progress line whenever it changes (pipes, files, CI logs)."""

    def __init__(self, err: bool, waits: _WaitNotices) -> None:
        self._last = ""
        self._err = err
        self._waits = waits

    def __call__(self, progress: RunProgress) -> None:
        line = progress.summary()
        if line != self._last:
            self._last = line
            click.echo(f"[{progress.run_id}] {line}", err=self._err)
        self._waits(progress)


def _interrupted(engine: Engine, run_id: str, db: str, pipeline_file: str) -> None:
    """What Ctrl-C during ``run`` leaves behind, and how to go on or stop."""
    record = engine.get_run(run_id)
    if record is None:
        click.echo("interrupted before the run was stored; nothing to clean up", err=True)
        return
    if record.status in RUN_TERMINAL_STATUSES:
        click.echo(f"interrupted: run {run_id} is {record.status.value}", err=True)
        return
    where = _db_argument(db)
    click.echo(
        safe_line(
            f"interrupted: run {run_id} stays {record.status.value} in the database; "
            f"a worker goes on with it: dagwerk worker --pipeline {shlex.quote(pipeline_file)}"
            f"{where}; cancel it: dagwerk cancel {run_id}{where}"
        ),
        err=True,
    )


@click.command()
@click.argument("pipeline_file", metavar="PIPELINE", type=_PIPELINE)
@_input_options
@db_option
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 256))
@click.option("--executor", type=_EXECUTORS, default="thread", show_default=True)
@plugins_option
@_queue_option
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), help="Give up after S s.")
@click.option("--run-id", help="Use this run ID (default: a fresh one).")
@click.option(
    "--fail-on-fault",
    type=click.FloatRange(min=0),
    metavar="S",
    help="Exit 1 once a store fault (disk full, read-only, server gone) lasted S s "
    "(default: wait it out).",
)
@log_level_option
@debug_option
@json_option
def run(
    *,
    pipeline_file: str,
    input_text: str | None,
    input_file: str | None,
    db: str,
    workers: int,
    executor: str,
    plugin_modules: tuple[str, ...],
    queues: tuple[str, ...] = (),
    timeout: float | None,
    run_id: str | None,
    as_json: bool,
    log_level: str = "info",
    fail_on_fault: float | None = None,
) -> None:
    """Run a pipeline file to the end in this process and print the result.

    Shows live progress (nodes settled, tasks done / running / failed), then
    the outputs of the last nodes. Exits 0 when the run COMPLETED, 1 when it
    FAILED, CRASHED or was CANCELLED, 2 for invalid input. The run is stored
    in --db, so `dagwerk show` and `dagwerk retry` work on it afterwards.
    A task that waits is named with the `dagwerk resume` command that
    resumes it; Ctrl-C (exit 130) leaves the run running for a worker.
    A store fault that may pass (a full disk, a read-only file) is waited
    out and shown in the progress line (--fail-on-fault S: exit 1 after S
    s of it); one that does not (permission denied, a newer schema) exits 2.

    Its workers take this run's tasks first, then other tasks of the
    database whose plugin they have (with --queue: of those queues only);
    another `dagwerk run` on the same database is left its own plugins.

    \b
    Examples:
      dagwerk run examples/pipelines/etl.yaml
      dagwerk run examples/pipelines/etl.yaml --input '{"since": "2024-06-01"}' --json
    """
    from dagwerk.engine import EngineRegistry, new_run_id
    from dagwerk.pipeline_file import load_pipeline

    run_input = read_run_input(input_text, input_file)
    pipeline = load_pipeline(pipeline_file)
    # Before the database is opened: a node whose plugin cannot be found
    # stores nothing.
    load_pipeline_plugins(pipeline, EngineRegistry(), plugin_modules)
    click.get_current_context().with_resource(task_logging(log_level))
    run_id = run_id if run_id is not None else new_run_id()
    with open_engine(db, wait_out_faults=True, fail_on_fault=fail_on_fault) as engine:
        try:
            if is_terminal() and not as_json:
                result = _run_with_live_display(
                    engine,
                    pipeline,
                    db=db,
                    run_input=run_input,
                    workers=workers,
                    executor=executor,
                    timeout=timeout,
                    run_id=run_id,
                    queues=list(queues) or None,
                    fail_on_fault=fail_on_fault,
                )
            else:
                waits = _WaitNotices(engine, db, lambda line: click.echo(line, err=as_json))
                result = engine.run(
                    pipeline,
                    run_input,
                    workers=workers,
                    executor=executor,
                    timeout=timeout,
                    run_id=run_id,
                    on_progress=_PlainProgress(err=as_json, waits=waits),
                    queues=list(queues) or None,
                    fail_on_fault=fail_on_fault,
                )
        except KeyboardInterrupt:
            _interrupted(engine, run_id, db, pipeline_file)
            sys.exit(EXIT_INTERRUPTED)
        if as_json:
            echo_json(result.to_json())
        else:
            _print_result(result, pipeline)
    sys.exit(exit_code_for(result.status))


def _run_with_live_display(
    engine: Engine,
    pipeline: Pipeline,
    *,
    db: str,
    run_input: dict[str, object] | None,
    workers: int,
    executor: str,
    timeout: float | None,
    run_id: str | None,
    queues: list[str] | None,
    fail_on_fault: float | None,
) -> RunResult:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, transient=False) as display:
        bar = display.add_task(f"{pipeline.name}: starting", total=len(pipeline.nodes))
        waits = _WaitNotices(engine, db, lambda line: display.console.print(line, markup=False))

        def update(progress: RunProgress) -> None:
            waits(progress)
            display.update(
                bar,
                completed=progress.nodes_settled,
                total=progress.nodes_total,
                description=safe_line(f"{pipeline.name} {progress.summary()}"),
            )

        return engine.run(
            pipeline,
            run_input,
            workers=workers,
            executor=executor,
            timeout=timeout,
            run_id=run_id,
            on_progress=update,
            queues=queues,
            fail_on_fault=fail_on_fault,
        )


@click.command()
@click.argument("pipeline_file", metavar="PIPELINE", type=_PIPELINE)
@_input_options
@db_option
@click.option("--run-id", help="Use this run ID (default: a fresh one).")
@click.option(
    "--idempotency-key",
    metavar="KEY",
    help="Submit at most once per KEY: a repeat prints the first run's ID (kept 24 h).",
)
@plugins_option
@no_plugin_check_option
@json_option
def submit(
    *,
    pipeline_file: str,
    input_text: str | None,
    input_file: str | None,
    db: str,
    run_id: str | None,
    plugin_modules: tuple[str, ...],
    plugin_check: bool,
    as_json: bool,
    idempotency_key: str | None = None,
) -> None:
    """Store and start a run of a pipeline file; print its ID and return.

    Workers (`dagwerk worker`) serving the same database do the work. The
    pipeline's plugin modules are imported and every node's plugin checked
    first, so a misspelt name is refused before anything is stored
    (--no-plugin-check skips this on a machine without the plugins' code).

    \b
    Examples:
      dagwerk submit examples/pipelines/approval.yaml --input '{"topic": "dagwerk 1.0"}'
      dagwerk worker --pipeline examples/pipelines/approval.yaml
    """
    from dagwerk.engine import EngineRegistry
    from dagwerk.pipeline_file import load_pipeline

    run_input = read_run_input(input_text, input_file)
    pipeline = load_pipeline(pipeline_file)
    if plugin_check:
        load_pipeline_plugins(pipeline, EngineRegistry(), plugin_modules)
    with open_engine(db) as engine:
        new_id = engine.submit(pipeline, run_input, run_id=run_id, idempotency_key=idempotency_key)
    if as_json:
        echo_json({"run_id": new_id})
    else:
        click.echo(new_id)


@contextmanager
def _stopping_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop`` inside the block (their handlers are
    put back after it)."""

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@click.command()
@db_option
@click.option(
    "--concurrency",
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    type=click.IntRange(1, 1024),
    help="Run at most N attempts at once; a batch claims N deliveries in one commit.",
    metavar="N",
)
@click.option(
    "--claim-ahead",
    type=click.IntRange(0, MAX_CLAIM_AHEAD),
    default=DEFAULT_CLAIM_AHEAD,
    show_default=True,
    metavar="N",
    help="Claim up to N tasks beyond --concurrency per batch, of plugins whose "
    "attempts this worker timed short enough to start them within 50 ms (0: none).",
)
@click.option("--executor", type=_EXECUTORS, default="thread", show_default=True)
@plugins_option
@click.option(
    "--pipeline",
    "pipelines",
    multiple=True,
    type=_PIPELINE,
    metavar="FILE",
    help="Import the plugin modules this pipeline file lists; repeatable.",
)
@_queue_option
@click.option(
    "--burst",
    is_flag=True,
    help="Exit once no work is deliverable now or within --burst-horizon.",
)
@click.option(
    "--burst-horizon",
    type=click.FloatRange(min=0),
    default=DEFAULT_BURST_HORIZON,
    show_default=True,
    metavar="S",
    help="With --burst: wait for deliveries due within S s (retries on backoff).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve /metrics and /healthz on 127.0.0.1:PORT while the worker runs.",
)
@click.option(
    "--backstop-interval",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds between backstop passes (0: no backstop in this worker).",
)
@click.option(
    "--retention",
    metavar="AGE",
    help="Also delete runs finished longer ago than AGE (30d, 12h, ...), every few minutes.",
)
@click.option(
    "--task-log-max-bytes",
    type=click.IntRange(min=0),
    default=DEFAULT_TASK_LOG_MAX_BYTES,
    show_default=True,
    metavar="N",
    help="Keep at most N bytes of each attempt's log (0: store no task logs).",
)
@click.option(
    "--task-log-max-lines",
    type=click.IntRange(min=0),
    default=DEFAULT_TASK_LOG_MAX_LINES,
    show_default=True,
    metavar="N",
    help="Keep at most N lines of each attempt's log (0: store no task logs).",
)
@click.option(
    "--schedule-interval",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Seconds between scheduler passes (0: this worker fires no schedules).",
)
@log_level_option
@debug_option
def worker(
    *,
    db: str,
    concurrency: int,
    executor: str,
    plugin_modules: tuple[str, ...],
    claim_ahead: int = DEFAULT_CLAIM_AHEAD,
    pipelines: tuple[str, ...],
    burst: bool,
    queues: tuple[str, ...] = (),
    burst_horizon: float = DEFAULT_BURST_HORIZON,
    metrics_port: int | None = None,
    backstop_interval: float = 30.0,
    retention: str | None = None,
    task_log_max_bytes: int = DEFAULT_TASK_LOG_MAX_BYTES,
    task_log_max_lines: int = DEFAULT_TASK_LOG_MAX_LINES,
    schedule_interval: float = 1.0,
    log_level: str = "info",
) -> None:
    """Serve the database's queue: run the tasks of every run stored there.

    Start as many as you like, in as many processes or machines as share the
    database. SIGINT (Ctrl-C) or SIGTERM stops admission, aborts attempts in
    flight and gives their deliveries back for another worker; a second
    signal is not needed. A worker leases only tasks whose plugin it has
    (--plugins, --pipeline) in its queues (--queue; default every queue),
    and leaves the others to workers that have them. With --burst it exits
    when nothing it serves is deliverable now or due within --burst-horizon
    seconds (a retry waiting on its backoff is waited for).

    A store fault that may pass (a full disk, a read-only file, a server
    that went away) is logged once (then at most every 30 s, with a count)
    and waited out with a backoff of up to 5 s, claiming no new work; the
    worker resumes by itself; so is one that keeps the database from
    opening at start. One that does not (permission denied, a schema newer
    than this dagwerk, a damaged database, a database file removed while
    the worker runs) exits 2.

    \b
    Examples:
      dagwerk worker --pipeline examples/pipelines/etl.yaml --concurrency 8
      dagwerk worker --plugins myproject.plugins --executor process
      dagwerk worker --plugins examples/pipelines/flaky_plugins.py --burst
    """
    from dagwerk.cli.commands_retention import age_seconds
    from dagwerk.pipeline_file import load_pipeline
    from dagwerk.runtime.heap import freeze_startup_heap
    from dagwerk.runtime.task_logs import TaskLogLimits

    retention_age = None if retention is None else age_seconds(retention, "--retention")
    loaded: list[Pipeline] = []
    click.get_current_context().with_resource(task_logging(log_level))
    stop = threading.Event()
    with _stopping_on_signals(stop):
        try:
            engine = open_engine(db, wait_out_faults=True, stop=stop)
        except Exception:
            if not stop.is_set():
                raise
            click.echo("worker: stopped before the database opened", err=True)
            return
    with engine:
        for pipeline_file in pipelines:
            pipeline = load_pipeline(pipeline_file)
            engine.load_plugins(pipeline.plugins, base_dir=Path(pipeline.source).parent)
            loaded.append(pipeline)
        engine.load_plugins(plugin_modules)
        # A worker leases only tasks whose plugin it has: resolve every
        # node's plugin (an import path included) before serving.
        for pipeline in loaded:
            try:
                engine.check_plugins(pipeline)
            except DagwerkError as exc:
                raise InvalidInputError(f"{pipeline.source}: {exc}") from exc
        serving = engine.worker(
            concurrency=concurrency,
            claim_ahead=claim_ahead,
            executor=executor,
            idle_wait=WORKER_IDLE_WAIT,
            backstop_interval=backstop_interval or None,
            schedule_interval=schedule_interval or None,
            queues=list(queues) or None,
            retention=retention_age,
            task_log_limits=TaskLogLimits(task_log_max_bytes, task_log_max_lines),
        )
        health_server = None
        if metrics_port is not None:
            from dagwerk.cli.commands_gated import start_health_server

            health_server, (metrics, _) = start_health_server(
                engine, port=metrics_port, host="127.0.0.1", workers=[serving]
            )
            serving.callbacks = metrics.callbacks(serving.callbacks)
            if serving.backstop is not None:
                serving.backstop.callbacks = serving.callbacks
            click.echo(f"metrics on {health_server.url}/metrics", err=True)
        # Start-up objects out of the collector's oldest generation: its
        # passes then take microseconds, not ~15 ms inside a transaction.
        freeze_startup_heap()
        if burst:
            handled = serving.run_burst(burst_horizon)
            attempts = f"{handled} task attempt" + ("" if handled == 1 else "s")
            click.echo(
                f"worker {serving.worker_id}: no work left after {attempts} "
                "(retries and resumes count as attempts)",
                err=True,
            )
            return
        try:
            with _stopping_on_signals(stop):
                click.echo(
                    f"worker {serving.worker_id} serving {db} "
                    f"(concurrency {concurrency}, {executor}); Ctrl-C to stop",
                    err=True,
                )
                # A fatal fault is said here, as the command's error.
                serving.faults.report_fatal = False
                serving.start()
                while not stop.wait(0.5) and serving.faults.fatal is None:
                    pass
                fatal = serving.faults.fatal
                if fatal is None:
                    click.echo(f"worker {serving.worker_id}: stopping", err=True)
                serving.stop()
        finally:
            if health_server is not None:
                health_server.stop()
        if fatal is not None:
            from dagwerk.runtime.faults import describe_fault

            raise cli_error(describe_fault(fatal), EXIT_INVALID, code=fatal.code)
        click.echo(f"worker {serving.worker_id}: stopped", err=True)
