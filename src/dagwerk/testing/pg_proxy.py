"""A delaying, round-trip-counting TCP proxy to a PostgreSQL server, for the
round-trip tests and the PostgreSQL queue benchmark."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["DelayProxy"]


class DelayProxy:
    """A TCP proxy to the server of ``url``; delays the server's bytes and
    counts round trips (server bursts that follow client bytes)."""

    def __init__(self, url: str, delay: float) -> None:
        parts = urlsplit(url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._parts = parts
        self.delay = delay
        self.round_trips = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.port = 0
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    @property
    def url(self) -> str:
        user = self._parts.netloc.rpartition("@")[0]
        host = f"127.0.0.1:{self.port}"
        return urlunsplit(self._parts._replace(netloc=f"{user}@{host}" if user else host))

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    def stop(self) -> None:
        """Stop serving; ``asyncio.run`` cancels the relays and closes the loop."""
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _relay(self, client_in: asyncio.StreamReader, client_out: Any) -> None:
        server_in, server_out = await asyncio.open_connection(*self._target)
        server_last = [True]
        pending: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def upstream() -> None:
            while data := await client_in.read(65536):
                with self._lock:
                    server_last[0] = False
                server_out.write(data)
                await server_out.drain()
            server_out.close()

        async def downstream() -> None:
            while data := await server_in.read(65536):
                await pending.put((time.monotonic() + self.delay, data))
            await pending.put((0.0, b""))

        async def deliver() -> None:
            while True:
                due, data = await pending.get()
                if not data:
                    client_out.close()
                    return
                if (pause := due - time.monotonic()) > 0:
                    await asyncio.sleep(pause)
                with self._lock:
                    if not server_last[0]:
                        self.round_trips += 1
                    server_last[0] = True
                client_out.write(data)
                await client_out.drain()

        try:
            await asyncio.gather(upstream(), downstream(), deliver(), return_exceptions=True)
        finally:
            server_out.close()
            client_out.close()

    @contextmanager
    def count(self) -> Iterator[list[int]]:
        """Yields a list that holds the round trips of the block afterwards."""
        found: list[int] = []
        before = self.round_trips
        yield found
        found.append(self.round_trips - before)
