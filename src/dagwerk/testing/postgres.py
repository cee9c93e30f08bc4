"""A throw-away PostgreSQL schema for a test, named in a store URL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

__all__ = ["fresh_schema_url"]


@contextmanager
def fresh_schema_url(base: str, prefix: str = "t") -> Iterator[str]:
    """``base`` with ``search_path`` set to a new schema (``<prefix>_<hex>``),
    so every connection of every process opened with the URL sees the same
    tables; the schema is dropped on exit. Needs the PostgreSQL extra."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    separator = "&" if "?" in base else "?"
    try:
        yield f"{base}{separator}options={quote(f'-csearch_path={name}')}"
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
