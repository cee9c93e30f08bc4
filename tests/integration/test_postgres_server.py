"""The PostgreSQL server the backend tests use is reachable and usable."""

from __future__ import annotations

import psycopg


def test_postgres_server_accepts_transactions(postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=False) as conn:
        version = conn.execute("SHOW server_version_num").fetchone()
        assert version is not None and int(version[0]) >= 130000
        conn.execute("CREATE TEMP TABLE probe (v int)")
        conn.execute("INSERT INTO probe VALUES (1), (2)")
        row = conn.execute("SELECT sum(v) FROM probe").fetchone()
        assert row == (3,)
