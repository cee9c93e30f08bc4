"""Migration 0005: a wait records when it began (``dagwerk_waits.waited_at``).

Version 4 timed a wait from the first backstop pass that saw it
(``dagwerk_wait_seen``); version 5 folds those observations into the wait
records, times the waits nobody saw from the upgrade, and drops the table.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.backends.sqlite.gateway import SqliteGateway
from dagwerk.backends.sqlite.migrations import LATEST_VERSION
from dagwerk.backends.sqlite.migrations import migrate as sqlite_migrate

WAIT_COLUMNS = "(task_id, wait_id, attempt_id, generation, state)"

pytestmark = pytest.mark.skipif(
    LATEST_VERSION < 5, reason="schema version 5 (waited_at) is not installed yet"
)


def test_sqlite_upgrade_keeps_observed_wait_starts_and_drops_wait_seen(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    gateway = SqliteGateway(str(path))
    sqlite_migrate(gateway, target=4)
    gateway.close()
    conn = sqlite3.connect(path)
    conn.execute(f"INSERT INTO dagwerk_waits {WAIT_COLUMNS} VALUES ('t1', 'w', 'a1', 0, 'active')")
    conn.execute(f"INSERT INTO dagwerk_waits {WAIT_COLUMNS} VALUES ('t2', 'w', 'a2', 0, 'active')")
    conn.execute("INSERT INTO dagwerk_wait_seen VALUES ('t1', 'w', 1234.5)")
    conn.commit()
    conn.close()
    before = time.time()
    SqliteStore(path).close()  # opens at the latest version
    after = time.time()
    conn = sqlite3.connect(path)
    try:
        rows = dict(conn.execute("SELECT task_id, waited_at FROM dagwerk_waits").fetchall())
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()
    assert rows["t1"] == 1234.5  # what the backstop saw is kept
    assert before - 1 <= rows["t2"] <= after + 1  # unseen: timed from the upgrade
    assert "dagwerk_wait_seen" not in tables


@pytest.fixture
def pg_schema(postgres_url: str) -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    name = f"schema_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def test_postgres_upgrade_keeps_observed_wait_starts_and_drops_wait_seen(
    postgres_url: str, pg_schema: str
) -> None:
    import psycopg

    from dagwerk.backends.postgres import PostgresStore
    from dagwerk.backends.postgres.migrations import MIGRATIONS

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        conn.execute(f'SET search_path = "{pg_schema}"')
        for version, migration in MIGRATIONS:
            if version <= 4:
                conn.execute(migration.read_text(encoding="utf-8").encode())
                conn.execute("INSERT INTO dagwerk_schema_version (version) VALUES (%s)", (version,))
        # The rows stand alone: foreign keys are not what this test is about.
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            f"INSERT INTO dagwerk_waits {WAIT_COLUMNS} VALUES ('t1', 'w', 'a1', 0, 'active'),"
            " ('t2', 'w', 'a2', 0, 'active')"
        )
        conn.execute("INSERT INTO dagwerk_wait_seen VALUES ('t1', 'w', 1234.5)")
    before = time.time()
    PostgresStore(postgres_url, schema=pg_schema).close()
    after = time.time()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{pg_schema}"')
        rows: dict[str, float] = dict(
            conn.execute("SELECT task_id, waited_at FROM dagwerk_waits").fetchall()
        )
        found = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename = %s",
            (pg_schema, "dagwerk_wait_seen"),
        ).fetchone()
    assert rows["t1"] == 1234.5
    assert before - 1 <= rows["t2"] <= after + 1
    assert found is not None and found[0] == 0
