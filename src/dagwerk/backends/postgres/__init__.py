"""The PostgreSQL backend: every store protocol and the durable queue on one
server shared by workers on many machines (needs the ``postgres`` extra)."""

from __future__ import annotations

from dagwerk.backends.postgres.store import PostgresStore, postgres_url

__all__ = ["PostgresStore", "postgres_url"]
