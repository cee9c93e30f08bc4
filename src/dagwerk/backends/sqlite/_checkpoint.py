"""WAL checkpoints off the commit path.

By default SQLite checkpoints inside the commit that takes the write-ahead
log past 1,000 pages: that commit copies every page changed since the last
checkpoint back into the database file and syncs both files, while this
engine's writer lock is held. A worker committing about 30 pages per task
paid that stall once every few dozen tasks; it was most of the per-hop p99
of a chain and stopped every other writer for its duration.

A :class:`Checkpointer` runs passive checkpoints on a daemon thread with its
own connection instead (the copy runs in SQLite's C code, outside the GIL).
A passive checkpoint never waits for, nor blocks, readers or writers; it
copies what no reader still needs. The writers' own automatic checkpoint
stays, at :data:`BACKSTOP_PAGES`: a log can only restart once everything in
it is copied, which a background pass racing new commits rarely sees, so the
writer that takes the log past the backstop finishes the (by then small)
copy and the next writer starts the log afresh. The log therefore stays
under about ``BACKSTOP_PAGES`` pages whatever the load, and idle databases
are checkpointed within :data:`IDLE_SECONDS`.

Durability is unchanged: a commit is durable once in the log (the log is
synced per the ``synchronous`` setting); checkpoints only move committed
pages into the main file.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from urllib.parse import quote

__all__ = ["BACKSTOP_PAGES", "COMMITS_PER_PASS", "IDLE_SECONDS", "Checkpointer"]

_LOG = logging.getLogger("dagwerk.backends.sqlite")

BACKSTOP_PAGES = 8192
"""The writers' automatic checkpoint threshold (pages of the log, ~32 MiB)."""

COMMITS_PER_PASS = 64
"""Write commits of this process between two background passes."""

IDLE_SECONDS = 1.0
"""A database with commits since the last pass is checkpointed after this long."""


class Checkpointer:
    """One background checkpointing thread for a database file in a process.

    :meth:`committed` is called after each write commit; the thread starts on
    the first one (and again in a forked child). :meth:`close` stops it.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.passes = 0  # completed passes (tests and diagnostics)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._commits = 0  # since the last pass
        self._closed = False
        self._thread: threading.Thread | None = None
        self._pid = -1

    def committed(self) -> None:
        """Count a write commit; wake the thread every ``COMMITS_PER_PASS``."""
        with self._lock:
            if self._closed:
                return
            self._commits += 1
            # A thread that stopped on an error (a full disk) starts again
            # with the next commit: the disk has room again.
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._start()
            if self._commits >= COMMITS_PER_PASS:
                self._wake.set()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._wake = threading.Event()  # a forked child's copy may be set
        self._thread = threading.Thread(
            target=self._serve, name="dagwerk-sqlite-checkpoint", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        conn: sqlite3.Connection | None = None
        wake = self._wake
        try:
            while True:
                wake.wait(IDLE_SECONDS)
                wake.clear()
                with self._lock:
                    if self._closed or self._pid != os.getpid():
                        return
                    if self._commits == 0:
                        continue
                    self._commits = 0
                if conn is None:
                    # mode=rw: a database removed meanwhile is not created anew.
                    conn = sqlite3.connect(
                        f"file:{quote(self.path)}?mode=rw",
                        uri=True,
                        timeout=0,
                        isolation_level=None,
                    )
                self._pass(conn)
        except sqlite3.Error as exc:
            # The database went away, cannot be opened or its disk is full:
            # the writers' automatic checkpoint still bounds the log. A file
            # no longer at its path is the gateway's to say (StoreGoneError).
            if not os.path.exists(self.path):
                _LOG.debug("background checkpoints of %s stopped: it is gone", self.path)
                return
            _LOG.warning(
                "background checkpoints of %s stopped (%s); the writers checkpoint instead",
                self.path,
                exc,
            )
            _LOG.debug("background checkpoints stopped", exc_info=True)
        finally:
            if conn is not None:
                conn.close()

    def _pass(self, conn: sqlite3.Connection) -> None:
        # PASSIVE: copies what it can without waiting; "busy" (another
        # process is checkpointing) is not an error.
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self.passes += 1

    def close(self) -> None:
        """Stop the thread (it finishes a pass under way) and wait for it."""
        with self._lock:
            self._closed = True
            thread = self._thread if self._pid == os.getpid() else None
            self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
