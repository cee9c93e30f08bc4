"""Fixtures shared by every test layer."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

POSTGRES_ENV = "DAGWERK_TEST_POSTGRES_URL"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of a throw-away PostgreSQL database (``.ci/postgres.sh`` starts one).

    Outside CI a missing server skips the test; in CI it fails it, so a broken
    server setup can never pass as green.
    """
    url = os.environ.get(POSTGRES_ENV)
    if url:
        return url
    if os.environ.get("CI"):
        pytest.fail(f"{POSTGRES_ENV} is not set in CI: the PostgreSQL server did not start")
    hint = f"export {POSTGRES_ENV}=$(bash .ci/postgres.sh start /tmp/pg)"
    pytest.skip(f"{POSTGRES_ENV} is not set (start a server: {hint})")


@pytest.fixture
def pg_schema(postgres_url: str) -> Iterator[str]:
    """The name of a fresh PostgreSQL schema for one test, dropped afterwards
    (a store opened with ``schema=`` creates it)."""
    import psycopg  # the PostgreSQL extra: only tests that use the server need it

    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
