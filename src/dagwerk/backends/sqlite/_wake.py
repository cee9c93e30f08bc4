"""Wake a process's waiting dequeues when another process commits.

A commit of this process wakes its own waiting dequeues through a condition
(see ``gateway._Waker``); a commit of another process could only be found by
polling the database's ``data_version``, and an idle worker polls slowly, so
work submitted from another process waited up to the poll interval.

Every SQLite commit in WAL mode appends to the ``<db>-wal`` file with
``write()``. On Linux one inotify instance per process, served by one daemon
thread, watches the directories of the databases whose dequeues wait, and
each write to a watched database's log wakes that database's waiters as a
local commit does. Wake-ups are hints: the woken dequeue looks at the queue,
finds something or nothing, and waits again; the ``data_version`` poll stays
as the fallback (other systems, a failed watch, a filesystem without inotify
events such as a network mount).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import struct
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["available", "begin_wait", "end_wait", "unwatch", "watch"]

_LOG = logging.getLogger("dagwerk.backends.sqlite")

_IN_MODIFY = 0x00000002
_IN_CREATE = 0x00000100
_IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
_IDLE_SECONDS = 0.5  # how often the thread looks whether it is still needed
_GRACE_SECONDS = 0.002  # head start of the committing process (see _serve)


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        for name in ("inotify_init1", "inotify_add_watch", "inotify_rm_watch"):
            getattr(libc, name)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def available() -> bool:
    """Whether this system can watch files (Linux inotify)."""
    return _LIBC is not None


class _Watcher:
    """This process's inotify instance, its thread and what it wakes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Signalled when a dequeue of this process starts waiting: the thread
        # reads events only while one waits, so the commits of a busy worker
        # (which wait for nothing) do not wake it.
        self.someone_waits = threading.Condition(self.lock)
        self.waiting = 0
        self.pid = os.getpid()
        self.fd: int | None = None
        self.failed = False
        self.thread: threading.Thread | None = None
        self.directories: dict[bytes, int] = {}  # directory -> watch descriptor
        # (watch descriptor, log file name) -> wake-up of that database
        self.wakes: dict[tuple[int, bytes], Callable[[], None]] = {}
        self.delivered = 0  # wake-ups delivered (tests and diagnostics)

    def watch(self, db_path: str, wake: Callable[[], None]) -> bool:
        real = os.path.realpath(db_path)
        directory = os.fsencode(os.path.dirname(real) or ".")
        name = os.fsencode(os.path.basename(real) + "-wal")
        with self.lock:
            if self.failed or _LIBC is None:
                return False
            if self.fd is None:
                fd = int(_LIBC.inotify_init1(_IN_CLOEXEC))
                if fd < 0:
                    self.failed = True  # e.g. the per-user instance limit
                    return False
                self.fd = fd
            wd = self.directories.get(directory)
            if wd is None:
                wd = int(_LIBC.inotify_add_watch(self.fd, directory, _IN_MODIFY | _IN_CREATE))
                if wd < 0:
                    return False
                self.directories[directory] = wd
            self.wakes[(wd, name)] = wake
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._serve, args=(self.fd,), name="dagwerk-sqlite-wake", daemon=True
                )
                self.thread.start()
            return True

    def unwatch(self, db_path: str) -> None:
        real = os.path.realpath(db_path)
        directory = os.fsencode(os.path.dirname(real) or ".")
        name = os.fsencode(os.path.basename(real) + "-wal")
        with self.lock:
            wd = self.directories.get(directory)
            if wd is None:
                return
            self.wakes.pop((wd, name), None)
            if not any(key[0] == wd for key in self.wakes):
                del self.directories[directory]
                if self.fd is not None and _LIBC is not None:
                    _LIBC.inotify_rm_watch(self.fd, wd)

    def begin_wait(self) -> None:
        with self.lock:
            self.waiting += 1
            if self.waiting == 1:
                self.someone_waits.notify()

    def end_wait(self) -> None:
        with self.lock:
            self.waiting -= 1

    def _serve(self, fd: int) -> None:
        try:
            while True:
                with self.lock:
                    if not self.waiting and self.wakes:
                        # Events queue in the kernel meanwhile; the ones read
                        # after a pause only cause one spurious look.
                        self.someone_waits.wait(_IDLE_SECONDS)
                ready, _, _ = select.select([fd], [], [], _IDLE_SECONDS)
                if ready:
                    targets = self._targets(os.read(fd, 65536))
                    if targets:
                        # The committing process usually takes its own new
                        # work within a millisecond; another process that
                        # raced it for every delivery would only add hand-
                        # offs (seen in a chain on two workers), so its
                        # waiters look a moment later.
                        time.sleep(_GRACE_SECONDS)
                    for wake in targets:
                        wake()
                with self.lock:
                    if not self.wakes:
                        # Nothing left to wake: the instance goes until the
                        # next watch (no thread or descriptor when idle).
                        self.fd, self.thread = None, None
                        self.directories.clear()
                        break
        except (OSError, ValueError):
            _LOG.warning("watching SQLite logs stopped; polling instead", exc_info=True)
            with self.lock:
                self.failed = True
                self.fd, self.thread = None, None
                self.wakes.clear()
                self.directories.clear()
        os.close(fd)

    def _targets(self, buffer: bytes) -> list[Callable[[], None]]:
        """The wake-ups the events in ``buffer`` call for (each once)."""
        found: dict[int, Callable[[], None]] = {}
        offset = 0
        with self.lock:
            while offset + _EVENT.size <= len(buffer):
                wd, _mask, _cookie, length = _EVENT.unpack_from(buffer, offset)
                start = offset + _EVENT.size
                name = buffer[start : start + length].rstrip(b"\0")
                wake = self.wakes.get((wd, name))
                if wake is not None:
                    found[id(wake)] = wake
                offset = start + length
            self.delivered += len(found)
        return list(found.values())


_WATCHER = _Watcher()
_WATCHER_LOCK = threading.Lock()


def _current() -> _Watcher:
    global _WATCHER
    with _WATCHER_LOCK:
        if _WATCHER.pid != os.getpid():
            _WATCHER = _Watcher()  # a forked child: the parent's thread is not here
        return _WATCHER


def watch(db_path: str, wake: Callable[[], None]) -> bool:
    """Call ``wake`` whenever any process writes the log of ``db_path``;
    False when this system or process cannot (the caller keeps polling)."""
    return _current().watch(db_path, wake)


def begin_wait() -> None:
    """A dequeue of this process starts waiting for work."""
    _current().begin_wait()


def end_wait() -> None:
    """A dequeue of this process stopped waiting."""
    _current().end_wait()


def unwatch(db_path: str) -> None:
    """Stop the wake-ups of ``db_path`` (its last gateway closed)."""
    _current().unwatch(db_path)


def delivered() -> int:
    """Wake-ups delivered in this process so far."""
    return _current().delivered


def thread() -> threading.Thread | None:
    """The watching thread of this process, if one runs."""
    return _current().thread
