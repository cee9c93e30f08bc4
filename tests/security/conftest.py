"""Fixtures of the security tests: store URLs for SQLite and, when
``DAGWERK_TEST_POSTGRES_URL`` is set, a fresh PostgreSQL schema per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagwerk.testing.postgres import fresh_schema_url

BACKENDS = ["sqlite", "postgres"]


def postgres_base_url() -> str | None:
    return os.environ.get("DAGWERK_TEST_POSTGRES_URL") or None


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """``sqlite:///<tmp>/s.db`` or a PostgreSQL URL whose connections use a
    fresh schema (``search_path`` in the URL), dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 's.db'}"
        return
    base = postgres_base_url()
    if base is None:
        pytest.skip("DAGWERK_TEST_POSTGRES_URL is not set")
    with fresh_schema_url(base, "sec") as url:
        yield url


def postgres_text_dump(url: str) -> str:
    """Every text, varchar and JSON value of every table in the URL's schema,
    read over SQL (the tables are the whole of dagwerk's state)."""
    import psycopg
    from psycopg import sql

    chunks: list[str] = []
    with psycopg.connect(url) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() "
            "AND data_type IN ('text', 'character varying', 'jsonb', 'json', 'bytea', 'ARRAY')"
        ).fetchall()
        assert columns, "no text columns found: wrong schema?"
        for table, column in columns:
            query = sql.SQL("SELECT {}::text FROM {}").format(
                sql.Identifier(column), sql.Identifier(table)
            )
            chunks.extend(str(value) for (value,) in conn.execute(query) if value is not None)
    return "\n".join(chunks)
