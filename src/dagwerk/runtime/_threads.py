"""Reusable daemon threads for the worker's per-attempt helpers.

Every attempt needs a thread for its plugin (so a timed-out or cancelled
plugin can be abandoned) and one for its watcher. Starting a new thread per
attempt costs an OS thread and a start-up hand-off under the GIL; this pool
keeps finished threads idle for the next job instead.

Semantics match a fresh ``threading.Thread(daemon=True).start()`` per job:

- a job never waits for a free thread: without an idle one a new thread
  starts, so a plugin that never returns only keeps its own thread;
- each job runs in a fresh, empty :class:`contextvars.Context`, so nothing a
  previous job set in context variables is visible to the next one;
- the thread carries the job's name while it runs.
- :func:`spawn` returns once the job's thread has begun running it.

Idle threads exit after ``idle_seconds`` or when more than ``max_idle`` are
idle. After ``fork`` the child starts with an empty pool (threads do not
survive a fork).
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable

__all__ = ["JobHandle", "spawn"]

_IDLE_SECONDS = 30.0
_MAX_IDLE = 64


class JobHandle:
    """Completion of one job: :meth:`join` waits until its target returned."""

    __slots__ = ("_done", "_started")

    def __init__(self) -> None:
        self._started = threading.Event()
        self._done = threading.Event()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the job's target to return; whether it has."""
        return self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()


class _Slot:
    __slots__ = ("job", "ready")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.job: tuple[Callable[[], object], str, JobHandle] | None = None


class _Pool:
    def __init__(self, idle_seconds: float = _IDLE_SECONDS, max_idle: int = _MAX_IDLE) -> None:
        self.idle_seconds = idle_seconds
        self.max_idle = max_idle
        self.lock = threading.Lock()
        self.idle: list[_Slot] = []

    def spawn(self, target: Callable[[], object], name: str, wait_started: bool) -> JobHandle:
        handle = JobHandle()
        with self.lock:
            slot = self.idle.pop() if self.idle else None
            if slot is not None:
                # Assigned under the lock: a slot timing out concurrently sees
                # it is no longer idle and runs the job instead of exiting.
                slot.job = (target, name, handle)
                slot.ready.set()
        if slot is None:
            slot = _Slot()
            slot.job = (target, name, handle)
            slot.ready.set()
            threading.Thread(target=self._serve, args=(slot,), name=name, daemon=True).start()
        # Like Thread.start: return once the job's thread is running it, so
        # the caller's next steps happen after the job began (tests and the
        # worker rely on a watcher being in place before the plugin starts).
        if wait_started:
            handle._started.wait()
        return handle

    def _serve(self, slot: _Slot) -> None:
        thread = threading.current_thread()
        while True:
            if not slot.ready.wait(self.idle_seconds):
                with self.lock:
                    if slot in self.idle:
                        self.idle.remove(slot)
                        return
                # Taken just as the wait timed out: the job is assigned.
            slot.ready.clear()
            job, slot.job = slot.job, None
            assert job is not None
            target, name, handle = job
            thread.name = name
            handle._started.set()
            try:
                contextvars.Context().run(target)
            except BaseException:
                # Like a plain thread: the error goes to threading.excepthook
                # and this thread ends.
                handle._done.set()
                raise
            thread.name = "dagwerk-idle"
            with self.lock:
                keep = len(self.idle) < self.max_idle
                if keep:
                    self.idle.append(slot)
            # Idle before done: a spawn right after join() finds this thread.
            handle._done.set()
            if not keep:
                return


_POOL = _Pool()


def _reset_after_fork() -> None:
    global _POOL
    _POOL = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def spawn(target: Callable[[], object], name: str, *, wait_started: bool = True) -> JobHandle:
    """Run ``target`` on an idle pooled daemon thread, or on a new one.

    With ``wait_started=False`` it returns at once instead of waiting, like
    ``Thread.start`` does, until the thread has begun running ``target``.
    """
    return _POOL.spawn(target, name, wait_started)
