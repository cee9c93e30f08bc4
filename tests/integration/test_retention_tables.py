"""Retention covers every table: the live schema of SQLite and PostgreSQL,
read from their catalogues, holds only tables that retention deletes from
(``RUN_TABLES``) or that hold no run's rows (``GLOBAL_TABLES``).

A table added by a later migration fails here until it is put in one of the
two lists (and, for a run's table, given its ``retention_delete_*`` block in
both ``queries.sql`` files); the contract test ``test_gc_07`` then proves its
rows go with their run.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import psycopg

from dagwerk.backends.postgres import PostgresStore
from dagwerk.backends.postgres.gateway import QUERIES_PATH as POSTGRES_QUERIES
from dagwerk.backends.sql import GLOBAL_TABLES, RUN_TABLES, load_queries
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.backends.sqlite.gateway import QUERIES_PATH as SQLITE_QUERIES


def _check_columns(columns: dict[str, set[str]]) -> None:
    declared = {table.name for table in RUN_TABLES}
    assert len(declared) == len(RUN_TABLES), "a table is listed twice in RUN_TABLES"
    assert not declared & set(GLOBAL_TABLES), "a table is both a run's and global"
    uncovered = sorted(set(columns) - declared - set(GLOBAL_TABLES))
    assert uncovered == [], (
        f"tables neither deleted with their run nor declared global: {uncovered} "
        "(add each to RUN_TABLES in backends/sql/_retention.py with a "
        "retention_delete_* block in both queries.sql, or to GLOBAL_TABLES with the reason)"
    )
    stale = sorted((declared | set(GLOBAL_TABLES)) - set(columns))
    assert stale == [], f"listed tables the schema does not have: {stale}"
    for table in RUN_TABLES:
        assert table.key in columns[table.name], (table.name, table.key)
    assert RUN_TABLES[-1].name == "dagwerk_runs", "the runs themselves go last"


def test_every_sqlite_table_is_covered(tmp_path: Path) -> None:
    path = tmp_path / "schema.db"
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    try:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        columns = {
            name: {row[1] for row in conn.execute(f'PRAGMA table_info("{name}")')} for name in names
        }
    finally:
        conn.close()
    _check_columns(columns)


def test_every_postgres_table_is_covered(postgres_url: str, pg_schema: str) -> None:
    PostgresStore(postgres_url, schema=pg_schema).close()
    columns: dict[str, set[str]] = {}
    with psycopg.connect(postgres_url) as conn:
        for table, column in conn.execute(
            "SELECT c.table_name, c.column_name FROM information_schema.columns c "
            "JOIN information_schema.tables t "
            "  ON t.table_schema = c.table_schema AND t.table_name = c.table_name "
            "WHERE c.table_schema = %s AND t.table_type = 'BASE TABLE'",
            (pg_schema,),
        ):
            columns.setdefault(table, set()).add(column)
    _check_columns(columns)


def test_each_run_table_has_its_delete_block_on_both_databases() -> None:
    for path in (SQLITE_QUERIES, POSTGRES_QUERIES):
        queries = load_queries(path)
        for table in RUN_TABLES:
            sql = queries.get(table.statement)
            assert sql is not None, (path.name, table.statement)
            assert re.search(rf"DELETE FROM {table.name}\b", sql), (path.name, table.statement)
            assert re.search(rf"WHERE {table.key}\b", sql), (path.name, table.statement)
