"""The writer queue of a SQLite database: a kernel lock whose wait has a deadline.

SQLite's own busy handler polls with sleeps of 1, 2, 5, 10 ... ms, so a
writer that finds the database locked by another process waits far longer
than the transaction it waits for (typically well under a millisecond).
Writers of this engine therefore first take an exclusive ``flock`` on a side
file (``<db>-dagwerk.lock``): the kernel wakes the next writer as soon as one
ends, and releases the lock of a process that dies. ``BEGIN IMMEDIATE`` and
the busy timeout still guard against other programs writing the file.

A blocking ``flock`` has no timeout of its own, and a writer that is alive
but stopped mid-transaction (a worker suspended with Ctrl-Z, a debugger
breakpoint) never releases it: every other writer, a ``dagwerk cancel``
included, would wait for ever. The busy timeout bounds that wait too. An
uncontended lock is taken directly (one non-blocking call); a contended one
is waited for by a helper thread, on a descriptor of its own, while the
caller waits on a condition with the deadline. A wait that passes the
deadline raises :class:`~dagwerk.backends.errors.StoreBusyError`, like a
``database is locked`` from SQLite; the helper keeps waiting and hands the
lock to the next caller, or releases it when nobody wants it any more.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

from dagwerk.backends.errors import StoreBusyError

__all__ = ["WriterQueue"]


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None


class WriterQueue:
    """One process's place in the writer queue of one database file.

    One caller at a time (the gateway calls it under its own lock):
    :meth:`acquire` returns the descriptor that holds the lock, which the
    caller passes to :meth:`release` once its transaction has ended.
    """

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._pid = -1
        self._fd: int | None = None
        self._waiter: _Waiter | None = None
        _QUEUES.add(self)

    def acquire(self) -> int | None:
        """Take the lock, waiting at most ``timeout`` seconds for it.

        ``None`` when the side file cannot be used (the caller then relies
        on SQLite's busy handler alone). Raises ``StoreBusyError`` when
        another writer held the lock for the whole timeout.
        """
        if fcntl is None:
            return None
        if self._pid != os.getpid():
            self._leave_parent()
            self._fd = _open(self.path)
            self._pid = os.getpid()
        fd = self._fd
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        except OSError:
            return None
        waiter = self._waiter
        if waiter is None or waiter.failed:
            waiter = self._waiter = _Waiter(self.path)
            # A queue dropped without close() still ends its helper.
            weakref.finalize(self, waiter.close)
        held = waiter.acquire(self.timeout)
        if held is not None or waiter.failed:
            return held
        raise StoreBusyError(
            f"another writer held {self.path!r} for longer than the busy "
            f"timeout ({self.timeout:g} s)"
        )

    def release(self, fd: int) -> None:
        """End the caller's turn (``fd`` is what :meth:`acquire` returned)."""
        fcntl.flock(fd, fcntl.LOCK_UN)

    def _leave_parent(self) -> None:
        """In a forked child: close the copies of the parent's descriptors.

        A copy shares the parent's lock: kept open, it would hold that lock
        after the parent died holding it, for as long as the child lives.
        Closing a copy leaves the parent's lock alone. Runs at fork (and
        again, doing nothing, at the child's first write).
        """
        if self._pid == os.getpid():
            return
        if self._fd is not None:
            os.close(self._fd)
        if self._waiter is not None:
            self._waiter.forget()  # its thread stayed in the parent
        self._fd = self._waiter = None
        self._pid = -1

    def close(self) -> None:
        """Close this process's descriptors (the helper closes its own)."""
        if self._pid == os.getpid():
            if self._fd is not None:
                os.close(self._fd)
            if self._waiter is not None:
                self._waiter.close()
        self._fd = None
        self._waiter = None
        self._pid = -1


class _Waiter:
    """A daemon thread that waits in the kernel queue for its callers.

    Its descriptor is its own, and only the thread closes it: a descriptor
    closed while a ``flock`` on it still blocks could be reused by another
    file, which the ending ``flock`` would then unlock.
    """

    def __init__(self, path: str) -> None:
        self._cond = threading.Condition()
        self._fd = -1
        self._wanted = False  # a caller waits for the lock
        self._granted = False  # the thread took it for that caller
        self._closed = False
        self.failed = False  # the descriptor cannot be opened or locked
        fd = _open(path)
        if fd is None:
            self.failed = True
            return
        self._fd = fd
        threading.Thread(target=self._serve, name="dagwerk-sqlite-queue", daemon=True).start()

    def acquire(self, timeout: float) -> int | None:
        """The descriptor holding the lock, or ``None`` past the timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._wanted = True
            self._cond.notify_all()
            while not self._granted:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.failed:
                    self._wanted = False  # the thread releases it if it comes
                    return None
                self._cond.wait(remaining)
            self._granted = self._wanted = False
            return self._fd

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def forget(self) -> None:
        """In a forked child: close the copy of the descriptor (the thread
        that owns it stayed in the parent)."""
        if not self.failed:
            os.close(self._fd)

    def _serve(self) -> None:
        fd = self._fd
        try:
            while True:
                with self._cond:
                    while not self._closed and (self._granted or not self._wanted):
                        self._cond.wait()
                    if self._closed:
                        return
                fcntl.flock(fd, fcntl.LOCK_EX)
                with self._cond:
                    if self._wanted and not self._closed:
                        self._granted = True  # the caller releases it
                        self._cond.notify_all()
                        continue
                fcntl.flock(fd, fcntl.LOCK_UN)  # its caller gave up meanwhile
        except OSError:
            with self._cond:
                self.failed = True
                self._cond.notify_all()
        finally:
            os.close(fd)


_QUEUES: weakref.WeakSet[WriterQueue] = weakref.WeakSet()


def _leave_parents() -> None:
    for queue in list(_QUEUES):
        queue._leave_parent()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_leave_parents)
