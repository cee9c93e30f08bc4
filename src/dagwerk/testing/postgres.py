"""A throw-away PostgreSQL schema for a test, named in a store URL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

__all__ = ["fresh_schema_url"]


@contextmanager
def fresh_schema_url(base: str, prefix: str = "t") -> Iterator[str]:
    """``base`` with ``search_path`` set to a new schema (``<prefix>_<hex>``),
    so every connection of every process opened with the URL sees the same
    tables; the schema is dropped on exit. The URL's own ``options`` are
    kept. Needs the PostgreSQL extra."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield _with_search_path(base, name)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _with_search_path(url: str, schema: str) -> str:
    """``url`` with ``-csearch_path=<schema>`` after the ``options`` it has."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = [value for key, value in query if key == "options"]
    kept = [(key, value) for key, value in query if key != "options"]
    options = " ".join([*given, f"-csearch_path={schema}"])
    return urlunsplit(
        parts._replace(query=urlencode([*kept, ("options", options)], quote_via=quote))
    )
