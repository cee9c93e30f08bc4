"""Every stored row of a bundled store, table by table, read from the live
schema (for the retention tests: what is left of a deleted run).

Each function returns ``{table: sorted rows}`` for every table the database
holds right now (found in ``sqlite_master`` / ``information_schema``, never
from a list of ours), so a table added later is counted without changing
these functions. For the in-memory store the "tables" are its containers.
"""

from __future__ import annotations

import sqlite3
from typing import Any

__all__ = ["TableRows", "memory_rows", "postgres_rows", "sqlite_rows"]

TableRows = dict[str, list[tuple[Any, ...]]]


def _sorted(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(rows, key=repr)


def sqlite_rows(path: str) -> TableRows:
    """Every row of every table of the SQLite database file ``path``."""
    conn = sqlite3.connect(path)
    try:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        # Names come from the catalogue itself; quoting keeps any name one identifier.
        return {name: _sorted(conn.execute(f'SELECT * FROM "{name}"').fetchall()) for name in names}
    finally:
        conn.close()


def postgres_rows(url: str, schema: str) -> TableRows:
    """Every row of every table of ``schema`` in the PostgreSQL database ``url``."""
    import psycopg

    with psycopg.connect(url) as conn:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = %s AND table_type = 'BASE TABLE'",
                (schema,),
            )
        ]
        quoted = '"' + schema.replace('"', '""') + '"'
        return {
            name: _sorted(conn.execute(f'SELECT * FROM {quoted}."{name}"').fetchall())
            for name in names
        }


def memory_rows(store: object) -> TableRows:
    """The in-memory store's containers (every dict, list, set of its state)
    as rows: a dict's keys, a list's or a set's items by ``repr``."""
    found: TableRows = {}
    for name, value in vars(store).items():
        if isinstance(value, dict):
            found[name] = _sorted([(repr(key),) for key in value])
        elif isinstance(value, list | set):
            found[name] = _sorted([(repr(item),) for item in value])
    return found
