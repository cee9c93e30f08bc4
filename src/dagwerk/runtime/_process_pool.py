"""Warm plugin processes for the process executor.

Starting an interpreter per attempt costs most of a second; a
:class:`ProcessPool` keeps started processes between attempts instead, so an
attempt costs one message each way. The pool starts nothing up front: an
attempt that finds no idle process starts one. After an attempt that ended
normally (a result, an error, a wait) its process goes back to the idle
list; a process whose attempt had to be stopped (timeout, cancellation) was
killed by the executor, and one that died (a crash) is gone: neither is
reused, and the next attempt that finds no idle process starts a fresh one.

At most ``size`` processes are kept idle; a process released while that
many are idle is retired. A worker never runs more than ``concurrency``
attempts at once and sizes its pool to match, so it never has more than
``concurrency`` plugin processes. :meth:`ProcessPool.close` stops every
process, idle or busy, and joins it: nothing is left running.

A plugin process reads jobs from its pipe until the pipe closes, so when the
worker process dies without closing the pool (SIGKILL), an idle plugin
process exits at once and a busy one after its plugin returns.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_objects
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.synchronize import Event

__all__ = ["PluginProcess", "ProcessPool", "ProcessPoolClosedError"]

ServeFn = Callable[[Connection, Event], None]
"""The plugin process's entry point: ``serve(pipe, abort)``."""


class ProcessPoolClosedError(RuntimeError):
    """An attempt asked a closed pool for a process."""


class PluginProcess:
    """One started plugin process, the parent's end of its duplex pipe and
    the abort event it hands to its plugins as ``ctx.cancelled``."""

    def __init__(self, context: SpawnContext, serve: ServeFn, name: str) -> None:
        self.conn, child_conn = context.Pipe(duplex=True)
        self.abort = context.Event()
        self.process: SpawnProcess = context.Process(
            target=serve, args=(child_conn, self.abort), name=name, daemon=True
        )
        self.ready = False
        """Set once the process's first message (it has started) was read."""
        self.process.start()
        # The parent's copy of the child end must close, or a read never sees
        # EOF when the child dies.
        child_conn.close()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def stop(self, join_timeout: float) -> bool:
        """The hard stop: set the abort event, terminate, wait, kill, wait.
        Whether the process is gone.

        The wait is on the process's sentinel, which becomes ready when the
        process ends whichever thread reaps it (``is_alive`` can answer True
        for a process another thread is reaping at that moment)."""
        self.abort.set()
        self.process.terminate()
        if not wait_for_objects([self.process.sentinel], join_timeout):
            self.process.kill()
            if not wait_for_objects([self.process.sentinel], join_timeout):
                return False
        self.process.join(join_timeout)
        return True

    def retire(self, join_timeout: float) -> None:
        """Close the pipe of an idle process (it exits when it reads EOF) and
        join it; stop it if it does not exit within ``join_timeout``."""
        self.conn.close()
        self.process.join(join_timeout)
        if self.process.is_alive():
            self.stop(join_timeout)


class ProcessPool:
    """Idle and busy plugin processes; see the module docstring."""

    def __init__(
        self, context: SpawnContext, serve: ServeFn, *, size: int, join_timeout: float
    ) -> None:
        if type(size) is not int or size < 1:
            raise ValueError("a process pool's size must be an int >= 1")
        self.context = context
        self.size = size
        self.join_timeout = join_timeout
        self._serve = serve
        self._lock = threading.Lock()
        self._idle: list[PluginProcess] = []
        self._busy: set[PluginProcess] = set()
        self._closed = False
        self._names = itertools.count(1)

    def acquire(self) -> PluginProcess:
        """An idle live process, else a newly started one; it counts as busy
        until :meth:`release`. Raises :class:`ProcessPoolClosedError` after
        :meth:`close`."""
        dead: list[PluginProcess] = []
        try:
            with self._lock:
                if self._closed:
                    raise ProcessPoolClosedError("the process executor is closed")
                while self._idle:
                    candidate = self._idle.pop()
                    if candidate.is_alive():
                        self._busy.add(candidate)
                        return candidate
                    dead.append(candidate)  # killed from outside while idle
                name = f"dagwerk-plugin-{next(self._names)}"
        finally:
            for process in dead:
                process.retire(self.join_timeout)
        started = PluginProcess(self.context, self._serve, name)
        with self._lock:
            closed = self._closed
            if not closed:
                self._busy.add(started)
        if closed:
            started.stop(self.join_timeout)
            raise ProcessPoolClosedError("the process executor is closed")
        return started

    def release(self, process: PluginProcess, *, reusable: bool) -> None:
        """Return ``process`` after its attempt: kept idle if ``reusable``
        and the pool is open and not full, else retired. A process the
        executor stopped or that died is released with ``reusable=False``."""
        with self._lock:
            self._busy.discard(process)
            keep = reusable and not self._closed and len(self._idle) < self.size
            if keep:
                self._idle.append(process)
        if not keep and reusable:
            process.retire(self.join_timeout)

    def close(self) -> None:
        """Stop every process and join it; idempotent. Idle processes exit at
        the end of their pipe; busy ones are stopped hard (their attempts end
        as crashes unless already settled). Later :meth:`acquire` calls raise."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = list(self._busy)
        for process in idle:
            process.conn.close()
        for process in busy:
            process.abort.set()
            process.process.terminate()
        # One deadline for all: the processes exit in parallel.
        deadline = time.monotonic() + self.join_timeout
        for process in (*idle, *busy):
            process.process.join(max(0.0, deadline - time.monotonic()))
        for process in (*idle, *busy):
            if process.is_alive():
                process.stop(self.join_timeout)
