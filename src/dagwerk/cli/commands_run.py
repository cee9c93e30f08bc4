"""Commands that start work: ``run``, ``submit`` and ``worker``."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from dagwerk.cli.app import safe_line
from dagwerk.cli.commands_common import (
    db_option,
    echo_json,
    exit_code_for,
    is_terminal,
    json_option,
    load_pipeline_plugins,
    no_plugin_check_option,
    open_engine,
    plugins_option,
    read_run_input,
)

if TYPE_CHECKING:
    from dagwerk.engine import Engine, RunProgress, RunResult
    from dagwerk.pipeline_file import Pipeline

__all__ = ["run", "submit", "worker"]

_PIPELINE = click.Path(dir_okay=False, path_type=str)
_EXECUTORS = click.Choice(["thread", "process", "async"])


def _input_options(fn: click.decorators.FC) -> click.decorators.FC:
    fn = click.option(
        "--input-file", type=click.Path(dir_okay=False), help="Read the run input (JSON) from F."
    )(fn)
    return click.option(
        "--input", "input_text", metavar="JSON", help="Run input as a JSON object."
    )(fn)


def _sinks(result: RunResult, pipeline: Pipeline) -> list[str]:
    sources = {edge.source for node in pipeline.nodes for edge in node.edges}
    return [node.slug for node in pipeline.nodes if node.slug not in sources]


def _print_result(result: RunResult, pipeline: Pipeline) -> None:
    task_count = sum(len(outputs) for outputs in result.outputs.values())
    click.echo(f"run {result.run_id}: {result.status.value} ({task_count} outputs)")
    if result.error:
        click.echo(f"  error: {safe_line(result.error)}")
    for slug in _sinks(result, pipeline):
        outputs = result.outputs.get(slug, ())
        for output in outputs[:5]:
            fields = json.dumps(dict(output.fields), ensure_ascii=False, default=str)
            click.echo(safe_line(f"  {slug} -> {fields}"))
        if len(outputs) > 5:
            click.echo(f"  {slug} -> ... {len(outputs) - 5} more")
    if not result.ok:
        click.echo(f"  inspect: dagwerk show {result.run_id}; retry: dagwerk retry {result.run_id}")


class _PlainProgress:
    """Prints the progress line whenever it changes (pipes, files, CI logs)."""

    def __init__(self, err: bool) -> None:
        self._last = ""
        self._err = err

    def __call__(self, progress: RunProgress) -> None:
        line = progress.summary()
        if line != self._last:
            self._last = line
            click.echo(f"[{progress.run_id}] {line}", err=self._err)


@click.command()
@click.argument("pipeline_file", metavar="PIPELINE", type=_PIPELINE)
@_input_options
@db_option
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 256))
@click.option("--executor", type=_EXECUTORS, default="thread", show_default=True)
@plugins_option
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), help="Give up after S s.")
@click.option("--run-id", help="Use this run ID (default: a fresh one).")
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
    timeout: float | None,
    run_id: str | None,
    as_json: bool,
) -> None:
    """Run a pipeline file to the end in this process and print the result.

    Shows live progress (nodes settled, tasks done / running / failed), then
    the outputs of the last nodes. Exits 0 when the run COMPLETED, 1 when it
    FAILED, CRASHED or was CANCELLED, 2 for invalid input. The run is stored
    in --db, so `dagwerk show` and `dagwerk retry` work on it afterwards.

    \b
    Examples:
      dagwerk run examples/pipelines/etl.yaml
      dagwerk run examples/pipelines/etl.yaml --input '{"since": "2024-06-01"}' --json
    """
    from dagwerk.engine import EngineRegistry
    from dagwerk.pipeline_file import load_pipeline

    run_input = read_run_input(input_text, input_file)
    pipeline = load_pipeline(pipeline_file)
    # Before the database is opened: a node whose plugin cannot be found
    # stores nothing.
    load_pipeline_plugins(pipeline, EngineRegistry(), plugin_modules)
    with open_engine(db) as engine:
        if is_terminal() and not as_json:
            result = _run_with_live_display(
                engine,
                pipeline,
                run_input=run_input,
                workers=workers,
                executor=executor,
                timeout=timeout,
                run_id=run_id,
            )
        else:
            result = engine.run(
                pipeline,
                run_input,
                workers=workers,
                executor=executor,
                timeout=timeout,
                run_id=run_id,
                on_progress=_PlainProgress(err=as_json),
            )
        if as_json:
            echo_json(result.to_json())
        else:
            _print_result(result, pipeline)
    sys.exit(exit_code_for(result.status))


def _run_with_live_display(
    engine: Engine,
    pipeline: Pipeline,
    *,
    run_input: dict[str, object] | None,
    workers: int,
    executor: str,
    timeout: float | None,
    run_id: str | None,
) -> RunResult:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, transient=False) as display:
        bar = display.add_task(f"{pipeline.name}: starting", total=len(pipeline.nodes))

        def update(progress: RunProgress) -> None:
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
        )


@click.command()
@click.argument("pipeline_file", metavar="PIPELINE", type=_PIPELINE)
@_input_options
@db_option
@click.option("--run-id", help="Use this run ID (default: a fresh one).")
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
        new_id = engine.submit(pipeline, run_input, run_id=run_id)
    if as_json:
        echo_json({"run_id": new_id})
    else:
        click.echo(new_id)


@click.command()
@db_option
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1, 1024))
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
@click.option("--burst", is_flag=True, help="Exit once no work is deliverable.")
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
def worker(
    *,
    db: str,
    concurrency: int,
    executor: str,
    plugin_modules: tuple[str, ...],
    pipelines: tuple[str, ...],
    burst: bool,
    metrics_port: int | None = None,
    backstop_interval: float = 30.0,
) -> None:
    """Serve the database's queue: run the tasks of every run stored there.

    Start as many as you like, in as many processes or machines as share the
    database. SIGINT (Ctrl-C) or SIGTERM stops admission, aborts attempts in
    flight and gives their deliveries back for another worker; a second
    signal is not needed. With --burst it exits when nothing is deliverable.

    \b
    Examples:
      dagwerk worker --pipeline examples/pipelines/etl.yaml --concurrency 8
      dagwerk worker --plugins myproject.plugins --executor process
      dagwerk worker --plugins examples/pipelines/flaky_plugins.py --burst
    """
    from dagwerk.pipeline_file import load_pipeline
    from dagwerk.runtime.heap import freeze_startup_heap

    with open_engine(db) as engine:
        for pipeline_file in pipelines:
            pipeline = load_pipeline(pipeline_file)
            engine.load_plugins(pipeline.plugins, base_dir=Path(pipeline.source).parent)
        engine.load_plugins(plugin_modules)
        serving = engine.worker(
            concurrency=concurrency,
            executor=executor,
            backstop_interval=backstop_interval or None,
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
            handled = serving.run_until_idle()
            click.echo(f"worker {serving.worker_id}: handled {handled} deliveries", err=True)
            return
        stop = threading.Event()

        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop.set()

        previous = {
            sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            click.echo(
                f"worker {serving.worker_id} serving {db} "
                f"(concurrency {concurrency}, {executor}); Ctrl-C to stop",
                err=True,
            )
            serving.start()
            while not stop.wait(0.5):
                pass
            click.echo(f"worker {serving.worker_id}: stopping", err=True)
            serving.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if health_server is not None:
                health_server.stop()
        click.echo(f"worker {serving.worker_id}: stopped", err=True)
