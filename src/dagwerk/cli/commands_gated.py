"""Gated-dispatch commands: ``serve`` (metrics and health over HTTP), and the
helpers behind ``runs --stalled`` and ``show --why``."""

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
    from dagwerk.health import HealthServer, HealthState
    from dagwerk.metrics import Metrics

    metrics = Metrics(store=engine.store)
    health = HealthState(engine.store, backstop=backstop)
    for serving in workers:
        serving.observers.extend([metrics, health])
        if health.backstop is None:
            health.backstop = serving.backstop
    server = HealthServer(metrics, health, port=port, host=host).start()
    return server, (metrics, health)


@click.command()
@db_option
@click.option("--port", default=9464, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; anything but 127.0.0.1 exposes the metrics to the network.",
)
@click.option(
    "--backstop-interval",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds between backstop passes run by this server (0: none).",
)
def serve(db: str, port: int, host: str, backstop_interval: float) -> None:
    """Serve /metrics (Prometheus) and /healthz for a database, and run the
    backstop over its RUNNING runs.

    \b
    Examples:
      dagwerk serve --port 9464
      curl -s 127.0.0.1:9464/healthz
    """
    from dagwerk.cli.commands_common import open_engine
    from dagwerk.runtime.backstop import Backstop

    with open_engine(db) as engine:
        server, (metrics, health) = start_health_server(engine, port=port, host=host, workers=[])
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
                    click.echo(f"serving {server.url}/metrics and {server.url}/healthz", err=True)
                    announced = True
                if stop.wait(0.5):
                    break
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            server.stop()
