"""The embedded default backend: every store protocol and the durable queue
in one SQLite file."""

from __future__ import annotations

from dagwerk.backends.sqlite.store import SqliteStore, sqlite_path

__all__ = ["SqliteStore", "sqlite_path"]
