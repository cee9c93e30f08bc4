"""Gated-dispatch commands: ``serve`` (the dashboard, its API, metrics and
health over HTTP), and the helpers behind ``runs --stalled`` and ``show --why``."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from dagwerk.cli.app import safe_line
from dagwerk.cli.commands_common import db_option, echo_json, render_table
from dagwerk.constants import RunStatus

if TYPE_CHECKING:
    from dagwerk.engine import Engine
    from dagwerk.health import HealthServer

__all__ = ["serve", "show_why", "stalled_runs", "start_health_server"]


def stalled_runs(engine: Engine, limit: int) -> list[dict[str, Any]]:
    """RUNNING runs that are stalled now (derived from durable state), with any
    stall a backstop recorded (which also covers overdue waits)."""
    recorded = {s.run_id: s for s in engine.list_stalls()}
    found: list[dict[str, Any]] = []
    for record in engine.list_runs(status=RunStatus.RUNNING, limit=limit):
        diagnosis = engine.diagnose(record.run_id)
        stored = recorded.get(record.run_id)
        if diagnosis.stall is None and stored is None:
            continue
        indices = diagnosis.stall.held_nodes if diagnosis.stall else stored.held_nodes  # type: ignore[union-attr]
        reason = diagnosis.stall.reason if diagnosis.stall else stored.reason  # type: ignore[union-attr]
        found.append(
            {
                "run_id": record.run_id,
                "held_nodes": [diagnosis.nodes[i].slug for i in indices],
                "reason": reason,
                "detected_at": stored.detected_at if stored is not None else None,
            }
        )
    return found


def echo_stalled(engine: Engine, limit: int, as_json: bool) -> None:
    """Print the stalled runs (``runs --stalled``)."""
    found = stalled_runs(engine, limit)
    if as_json:
        echo_json(found)
        return
    render_table(
        "stalled runs",
        ("run", "held nodes", "reason"),
        [(f["run_id"], ", ".join(f["held_nodes"]), f["reason"]) for f in found],
    )


def show_why(engine: Engine, run_id: str, as_json: bool) -> None:
    """Print, per node, why it has (not) run (``show --why``)."""
    diagnosis = engine.diagnose(run_id)
    if as_json:
        echo_json(
            {
                "run_id": run_id,
                "status": diagnosis.status.value,
                "stalled": diagnosis.stalled,
                "nodes": [
                    {"node": n.slug, "state": n.state.value, "reason": n.reason}
                    for n in diagnosis.nodes
                ],
            }
        )
        return
    click.echo(safe_line(f"run {run_id}: {diagnosis.status.value}"))
    for node in diagnosis.nodes:
        click.echo(safe_line(f"  {node.slug}: {node.state.value} - {node.reason}"))
    if diagnosis.stall is not None:
        click.echo(safe_line(f"stalled: {diagnosis.stall.reason}"))


def start_health_server(
    engine: Engine, *, port: int, host: str, workers: list[Any], backstop: Any = None
) -> tuple[HealthServer, Any]:
    """Start ``/metrics`` and ``/healthz`` for ``engine``; returns the server
    and the :class:`~dagwerk.metrics.Metrics` to give to workers."""
    from dagwerk.health import HealthServer

    metrics, health = engine.monitoring(backstop)
    for serving in workers:
        serving.observers.extend([metrics, health])
        health.faults.append(serving.faults)
        if health.backstop is None:
            health.backstop = serving.backstop
    server = HealthServer(metrics, health, port=port, host=host).start()
    return server, (metrics, health)


@click.command()
@db_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind. Any other than a loopback address needs DAGWERK_UI_TOKEN.",
)
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--read-only",
    is_flag=True,
    help="Serve pages and the read API only: no action (cancel, retry, resume, ...) is accepted.",
)
@click.option(
    "--pipeline",
    "pipelines",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="A pipeline file POST /api/runs may start (by its name or this path); repeatable.",
)
@click.option(
    "--backstop-interval",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds between backstop passes run by this server (0: none).",
)
def serve(  # noqa: PLR0917 (click passes every option)
    db: str,
    host: str,
    port: int,
    read_only: bool,
    pipelines: tuple[str, ...],
    backstop_interval: float,
) -> None:
    """Serve the dashboard, its JSON API (/api/), /metrics and /healthz for a
    database, and run the backstop over its RUNNING runs.

    Listens on 127.0.0.1 unless --host says otherwise; off loopback every
    caller must present DAGWERK_UI_TOKEN (bearer header or the login page).

    \b
    Examples:
      dagwerk serve                      # then open http://127.0.0.1:8080
      DAGWERK_UI_TOKEN=... dagwerk serve --host 0.0.0.0 --read-only
      curl -s 127.0.0.1:8080/healthz
    """
    import os

    from dagwerk.cli.commands_common import open_engine
    from dagwerk.pipeline_file import load_pipeline
    from dagwerk.runtime.backstop import Backstop
    from dagwerk.web import TOKEN_ENV, ServedPipelines, WebSettings, check_bind
    from dagwerk.web.security import is_loopback
    from dagwerk.web.server import WebServer

    token = os.environ.get(TOKEN_ENV) or None
    check_bind(host, token)
    registry = ServedPipelines()
    for path in pipelines:
        registry.add(load_pipeline(path))
    with open_engine(db) as engine:
        metrics, health = engine.monitoring()
        backstop = None
        backstop_store = engine.capabilities.backstop
        if backstop_interval > 0 and backstop_store is not None:
            backstop = Backstop(
                backstop_store,
                interval=backstop_interval,
                on_report=metrics.backstop_finished,
                callbacks=metrics.callbacks(),
            )
            health.backstop = backstop
        # dagwerk serve takes part in firing schedules, as every worker does.
        if engine.capabilities.schedules is not None:
            engine.start_scheduler()
        settings = WebSettings(
            token=token,
            read_only=read_only,
            loopback=is_loopback(host),
            pipelines=registry,
            metrics=metrics,
            health=health,
        )
        server = WebServer(engine, settings, host=host, port=port).start()
        stop = threading.Event()

        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop.set()

        previous = {
            sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            # The pass at start runs before the server announces itself, so a
            # scrape right after the announcement sees it.
            announced = False
            while True:
                if backstop is not None:
                    backstop.maybe_run()
                health.mark_step()
                if not announced:
                    url = server.url
                    mode = " (read-only)" if read_only else ""
                    click.echo(
                        f"serving the dashboard on {url}/{mode}, {url}/metrics and {url}/healthz",
                        err=True,
                    )
                    announced = True
                if stop.wait(0.5):
                    break
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            server.stop()
