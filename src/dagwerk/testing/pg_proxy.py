"""A delaying, round-trip-counting, connection-cutting TCP proxy to a
PostgreSQL server, for the round-trip and fault tests and the PostgreSQL
queue benchmark."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Cut", "DelayProxy"]


@dataclass
class Cut:
    """A rule of :meth:`DelayProxy.cut_after`: cut the first connection whose
    client sends ``marker``, at the client's ``chunk``-th write counted from
    the one that holds the marker (0), or with ``at`` at the first write
    from there that holds ``at``. ``forward``: the server still gets that
    write, then the end of the stream, and its answers are lost (a cut after
    the server acted); otherwise the write is dropped (a cut before it).
    ``fired`` is set when the cut happens."""

    marker: bytes
    chunk: int
    forward: bool
    at: bytes | None = None
    until: bytes | None = None
    """With ``at``: a write that holds this (and not ``marker``) before the
    one that holds ``at`` forgets the connection until ``marker`` comes
    again (so that ``at`` is looked for in one transaction)."""
    fired: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    """Set once the server ended the cut connection's session, so that what
    it did with the last write is visible (or never will be)."""
    _seen: dict[int, int] = field(default_factory=dict)

    def due(self, relay: int, data: bytes) -> bool:
        """Whether ``data``, the next write of the client of ``relay``, is cut."""
        if self.fired.is_set():
            return False
        if relay not in self._seen or (self.at is not None and self.marker in data):
            if self.marker not in data:
                return False
            self._seen[relay] = 0  # with ``at``: from the latest marker on
        elif self.at is not None and self.until is not None and self.until in data:
            del self._seen[relay]
            return False
        else:
            self._seen[relay] += 1
        if self._seen[relay] < self.chunk or (self.at is not None and self.at not in data):
            return False
        self.fired.set()
        return True


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
        self._cut: Cut | None = None
        self._relays: dict[int, Any] = {}
        self._next_relay = 0
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

    def cut_after(
        self,
        marker: bytes,
        chunk: int = 0,
        *,
        forward: bool = False,
        at: bytes | None = None,
        until: bytes | None = None,
    ) -> Cut:
        """Arm a one-shot :class:`Cut` (replacing an unfired one)."""
        rule = Cut(marker, chunk, forward, at, until)
        with self._lock:
            self._cut = rule
        return rule

    def disarm(self) -> None:
        """Drop the armed cut, fired or not."""
        with self._lock:
            self._cut = None

    def cut_all(self) -> None:
        """Close every connection through the proxy now, both ways (new ones
        are still accepted)."""
        assert self._loop is not None
        with self._lock:
            transports = list(self._relays.values())
        for client_out, server_out in transports:
            self._loop.call_soon_threadsafe(client_out.transport.abort)
            self._loop.call_soon_threadsafe(server_out.transport.abort)

    async def _relay(self, client_in: asyncio.StreamReader, client_out: Any) -> None:
        try:
            server_in, server_out = await asyncio.open_connection(*self._target)
        except OSError:
            client_out.transport.abort()  # the server is down: refused, as it would be
            return
        server_last = [True]
        pending: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        cut = asyncio.Event()
        fired: list[Cut] = []
        with self._lock:
            relay, self._next_relay = self._next_relay, self._next_relay + 1
            self._relays[relay] = (client_out, server_out)

        async def upstream() -> None:
            while data := await client_in.read(65536):
                with self._lock:
                    server_last[0] = False
                    rule = self._cut
                    due = rule is not None and rule.due(relay, data)
                if due:
                    assert rule is not None
                    fired.append(rule)
                    cut.set()
                    client_out.transport.abort()
                    if rule.forward:
                        # The server gets the write, then the end of the
                        # stream: it acts on what it got, in order, and
                        # ends the session; its answers are lost.
                        server_out.write(data)
                        await server_out.drain()
                        server_out.write_eof()
                    else:
                        server_out.transport.abort()
                    return
                server_out.write(data)
                await server_out.drain()
            server_out.close()

        async def downstream() -> None:
            while data := await server_in.read(65536):
                if cut.is_set():
                    continue  # lost with the cut connection
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
                if cut.is_set():
                    return
                client_out.write(data)
                await client_out.drain()

        try:
            await asyncio.gather(upstream(), downstream(), deliver(), return_exceptions=True)
        finally:
            with self._lock:
                self._relays.pop(relay, None)
            server_out.close()
            client_out.close()
            for rule in fired:
                rule.ended.set()

    @contextmanager
    def count(self) -> Iterator[list[int]]:
        """Yields a list that holds the round trips of the block afterwards."""
        found: list[int] = []
        before = self.round_trips
        yield found
        found.append(self.round_trips - before)
