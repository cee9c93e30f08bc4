"""``dagwerk serve``: the dashboard app under uvicorn, in a thread of the
process whose main thread runs the backstop and waits for a signal."""

from __future__ import annotations

import logging
import threading
from typing import Any

import uvicorn

from dagwerk.web.app import WebSettings, create_app

__all__ = ["WebServer"]

STARTUP_TIMEOUT = 30.0


class WebServer:
    """Serves :func:`~dagwerk.web.create_app` on ``host:port`` (0: any free
    port; see :attr:`port`) from a daemon thread until :meth:`stop`."""

    def __init__(self, engine: Any, settings: WebSettings, *, host: str, port: int) -> None:
        self.host = host
        config = uvicorn.Config(
            create_app(engine, settings),
            host=host,
            port=port,
            log_level=logging.WARNING,
            access_log=False,
            lifespan="off",
            # One process: the engine (and its store) lives here.
            workers=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="dagwerk-web", daemon=True)
        self.port = port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> WebServer:
        """Start serving; returns once the socket listens (raises if it cannot)."""
        self._thread.start()
        ready = threading.Event()
        deadline = STARTUP_TIMEOUT
        while not self._server.started:
            if not self._thread.is_alive():
                raise OSError(f"cannot serve on {self.host}:{self.port} (see the log above)")
            if deadline <= 0:
                raise OSError(f"the server on {self.host}:{self.port} did not start in time")
            ready.wait(0.02)
            deadline -= 0.02
        sockets = [s for server in self._server.servers for s in server.sockets]
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
