"""``/metrics`` and ``/healthz`` over HTTP (127.0.0.1 unless told otherwise).

:class:`HealthServer` serves a :class:`~dagwerk.metrics.Metrics` registry and
a health document from a background thread. ``/healthz`` answers 200 with
``{"status": "ok", ...}`` or 503 with ``"unhealthy"`` and the reasons:

- the store does not answer a read (``database_reachable``);
- the last successful step of the worker loop is older than ``step_stale_after``;
- the backstop is enabled and its last completed pass is older than
  ``backstop_stale_after`` (by default three intervals);
- (a store that records workers) a delivery has been held on an expired
  lease for more than ``lease_stale_after`` seconds: its worker died or hung
  and no live worker with its plugin took it over;
- (likewise) deliveries are deliverable and no worker is live: none seen
  for N s, or none ever;
- a worker of this process waits out a store fault (a full disk, a
  read-only file, a server that went away; :mod:`dagwerk.runtime.faults`):
  the document's ``fault`` holds its code, its one line, since when and how
  many operations it failed, until the store answers again (``null`` then).

Binding to anything but the loopback address is an explicit choice of the
caller (``host=``); metrics can reveal node and plugin names.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dagwerk.backends.errors import StoreUnavailableError
from dagwerk.metrics import CONTENT_TYPE, Metrics
from dagwerk.runtime.backstop import Backstop, BackstopReport
from dagwerk.runtime.clock import Clock, SystemClock
from dagwerk.runtime.faults import FaultGate, describe_fault
from dagwerk.runtime.observer import WorkerObserver
from dagwerk.store import QueueForecastStore, WorkerPresenceStore

__all__ = ["DEFAULT_HOST", "HealthServer", "HealthState"]

_LOG = logging.getLogger("dagwerk.health")

DEFAULT_HOST = "127.0.0.1"
# A run ID no run has; reading its status proves the database answers.
_PROBE_RUN = "dagwerk-healthz-probe"


@dataclass(slots=True)
class HealthState(WorkerObserver):
    """What ``/healthz`` reports; also a worker observer that notes each step."""

    store: Any
    backstop: Backstop | None = None
    clock: Clock = field(default_factory=SystemClock)
    step_stale_after: float = 60.0
    backstop_stale_after: float | None = None
    lease_stale_after: float = 60.0
    last_step_at: float | None = None
    started_at: float = 0.0
    presence: WorkerPresenceStore | None = field(default=None, init=False)
    forecast: QueueForecastStore | None = field(default=None, init=False)
    faults: list[FaultGate] = field(default_factory=list)
    """The fault gates of the workers this process runs."""

    def __post_init__(self) -> None:
        self.started_at = self.clock.time()
        store = self.store
        self.presence = store if isinstance(store, WorkerPresenceStore) else None
        self.forecast = store if isinstance(store, QueueForecastStore) else None

    # worker observer hooks
    def step_finished(self) -> None:
        self.mark_step()

    def backstop_finished(self, report: BackstopReport) -> None:
        if report.ran and not report.errors:
            self.mark_step()

    def mark_step(self) -> None:
        """Record a successful step now."""
        self.last_step_at = self.clock.time()

    def check(self) -> tuple[bool, dict[str, object]]:
        """``(healthy, document)``."""
        now = self.clock.time()
        problems: list[str] = []
        try:
            self.store.get_run_status(_PROBE_RUN)
            reachable = True
        except StoreUnavailableError as exc:
            reachable = False
            problems.append(f"database unreachable: {describe_fault(exc)}")
        except Exception as exc:
            reachable = False
            problems.append(f"database unreachable: {type(exc).__name__}: {exc}")
        step_age = None if self.last_step_at is None else now - self.last_step_at
        # Before the first step, the process age stands in for the step age.
        waited = step_age if step_age is not None else now - self.started_at
        if waited > self.step_stale_after:
            problems.append(f"no successful step for {waited:.0f}s")
        backstop_age: float | None = None
        backstop = self.backstop
        if backstop is not None and backstop.enabled:
            assert backstop.interval is not None
            last = backstop.last_pass_at
            backstop_age = None if last is None else now - last
            limit = self.backstop_stale_after or 3 * backstop.interval
            age = backstop_age if backstop_age is not None else now - self.started_at
            if age > limit:
                problems.append(f"no backstop pass for {age:.0f}s")
        document: dict[str, object] = {
            "status": "ok",
            "database_reachable": reachable,
            "last_step_at": self.last_step_at,
            "last_step_age_seconds": step_age,
            "backstop_enabled": backstop is not None and backstop.enabled,
            "backstop_age_seconds": backstop_age,
        }
        document["fault"] = self._fault(problems)
        if reachable and self.presence is not None:
            document.update(self._workers(self.presence, problems))
        document["status"] = "ok" if not problems else "unhealthy"
        document["problems"] = problems
        return not problems, document

    def _fault(self, problems: list[str]) -> dict[str, object] | None:
        """The store fault a worker waits out (the oldest); appends its problem."""
        lasting = [(gate, gate.current) for gate in self.faults if gate.current is not None]
        if not lasting:
            return None
        gate, fault = min(lasting, key=lambda pair: pair[1].since if pair[1] else 0.0)
        assert fault is not None
        seconds = fault.lasted(gate.now())
        problems.append(f"store fault for {seconds:.0f}s: {fault.line}")
        return {
            "code": fault.code,
            "kind": fault.kind.value,
            "line": fault.line,
            "since": fault.since,
            "seconds": seconds,
            "failures": fault.failures,
            "held_settlements": gate.parked,
        }

    def _workers(self, presence: WorkerPresenceStore, problems: list[str]) -> dict[str, object]:
        """The worker part of the document; appends its problems."""
        try:
            workers = presence.list_workers()
            expired = presence.list_expired_leases()
            due = None if self.forecast is None else self.forecast.next_delivery_in()
        except Exception as exc:
            problems.append(f"reading the workers failed: {type(exc).__name__}: {exc}")
            return {}
        live = [w for w in workers if w.live]
        last_seen = min((w.seen_seconds_ago for w in workers), default=None)
        stale = [e for e in expired if e.expired_seconds_ago > self.lease_stale_after]
        if stale:
            oldest = stale[0]
            problems.append(
                f"{len(stale)} deliveries held on leases expired over "
                f"{self.lease_stale_after:.0f}s ago (oldest: task {oldest.task_id} of worker "
                f"{oldest.worker_id}, {oldest.expired_seconds_ago:.0f}s)"
            )
        if not live and (expired or due == 0.0):
            seen = (
                "no worker has been seen"
                if last_seen is None
                else (f"no worker seen for {last_seen:.0f}s")
            )
            problems.append(f"deliveries are waiting and no worker is live ({seen})")
        return {
            "workers_live": len(live),
            "last_worker_seen_seconds_ago": last_seen,
            "expired_leases": len(expired),
        }


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            try:
                body = self.server.metrics.render()
            except Exception as exc:
                self._send(500, "text/plain; charset=utf-8", f"{exc}\n".encode())
                return
            self._send(200, CONTENT_TYPE, body)
        elif path == "/healthz":
            healthy, document = self.server.health.check()
            body = (json.dumps(document, sort_keys=True) + "\n").encode()
            self._send(200 if healthy else 503, "application/json", body)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        _LOG.debug("%s " + format, self.address_string(), *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], metrics: Metrics, health: HealthState) -> None:
        self.metrics = metrics
        self.health = health
        super().__init__(address, _Handler)


class HealthServer:
    """Serves ``/metrics`` and ``/healthz`` on ``host:port`` (port 0: any free
    port; see :attr:`port`) from a daemon thread until :meth:`stop`."""

    def __init__(
        self, metrics: Metrics, health: HealthState, *, port: int = 0, host: str = DEFAULT_HOST
    ) -> None:
        self._server = _Server((host, port), metrics, health)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="dagwerk-health", daemon=True
        )

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> HealthServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
