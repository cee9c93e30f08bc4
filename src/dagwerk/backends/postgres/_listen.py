"""Waiting for PostgreSQL notifications: a LISTEN connection per channel,
kept per process, that wakes a waiting worker when work is queued or a run
ends."""

from __future__ import annotations

import os
import selectors
import threading
import time
from contextlib import suppress

import psycopg

from dagwerk.backends.errors import StoreCannotOpenError, StoreUnavailableError

from ._pool import Conn, Connections
from .errors import (
    is_connection_error,
    translate_error,
)

__all__ = ["NOTIFY_CHANNEL", "RUNS_CHANNEL", "Listener"]

NOTIFY_CHANNEL = "dagwerk_work"
RUNS_CHANNEL = "dagwerk_runs"


class Listener:
    """One connection that LISTENs on ``channel`` for notifications whose
    payload is ``payload`` (a gateway's schema), opened by the first wait of
    this process from ``connections`` and kept."""

    def __init__(self, connections: Connections, channel: str, payload: str | None) -> None:
        if channel not in (NOTIFY_CHANNEL, RUNS_CHANNEL):
            raise ValueError(f"unknown channel {channel!r}")  # it becomes SQL text
        self._connections = connections
        self.payload = payload
        self._channel = channel
        self._conn: Conn | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def wait(self, timeout: float) -> bool:
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            return False
        try:
            return self._wait_locked(timeout)
        finally:
            self._lock.release()

    def _wait_locked(self, timeout: float) -> bool:
        listener = self._conn
        if listener is None or listener.closed or self._pid != os.getpid():
            self._conn = None
            try:
                listener = self._connections.connect(time.monotonic() + max(0.0, timeout))
            except StoreCannotOpenError:
                raise
            except StoreUnavailableError:
                # The server stayed out of reach for the whole wait: say
                # "maybe", so the caller looks (and its own call reports
                # the fault).
                return True
            try:
                listener.execute(f"LISTEN {self._channel}")
            except psycopg.Error as exc:
                with suppress(psycopg.Error):
                    listener.close()
                raise translate_error(exc, f"cannot listen on {self._channel}") from exc
            self._conn, self._pid = listener, os.getpid()
            return True
        deadline = time.monotonic() + max(0.0, timeout)
        payload = self.payload
        try:
            while True:
                # What has arrived, without waiting.
                for notify in listener.notifies(timeout=0.0):
                    if notify.payload == payload:
                        return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                # The wait itself is the kernel's. psycopg's timed wait polls
                # in whole milliseconds and spins through the last one: ~1 ms
                # of CPU per timed-out wait, which an idle worker repeats at
                # every poll interval.
                _readable(listener.fileno(), remaining)
        except psycopg.Error as exc:
            # A lost listener is reopened by the next call; meanwhile say
            # "maybe", so the caller looks instead of sleeping.
            self._close()
            if is_connection_error(exc, listener):
                return True
            raise translate_error(exc, f"waiting on {self._channel} failed") from exc

    def _close(self) -> None:
        listener, self._conn = self._conn, None
        if listener is not None and self._pid == os.getpid():
            with suppress(psycopg.Error):
                listener.close()

    def close(self) -> None:
        with self._lock:
            self._close()


def _readable(fd: int, timeout: float) -> None:
    """Block until ``fd`` is readable or ``timeout`` seconds have passed (the
    platform's selector; epoll rounds the timeout up to a whole millisecond,
    never down)."""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        selector.select(timeout)
