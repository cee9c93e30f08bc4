"""SQLite migration 0018: a run's small columns come before its large ones.

A value too big for its page continues on a chain of overflow pages, and
SQLite reaches a column only by walking past every column before it. The
node definitions were a run's second column, so reading a run's status
walked their whole chain. Version 18 rebuilds the runs table with the
large columns last; the upgrade keeps every row, its rowid, and every row
of another table that references a run.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from dagwerk.backends.sqlite.gateway import SqliteGateway
from dagwerk.backends.sqlite.migrations import migrate as sqlite_migrate
from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.testing.helpers import child, root

LARGE = ("error", "run_input", "nodes")
"""The columns that can hold large values, in the order they end the row."""


def _columns(conn: sqlite3.Connection) -> list[str]:
    return [row[1] for row in conn.execute("PRAGMA table_info(dagwerk_runs)")]


def _runs(conn: sqlite3.Connection) -> list[dict[str, object]]:
    conn.row_factory = sqlite3.Row
    rows = conn.execute("SELECT rowid AS row_number, * FROM dagwerk_runs ORDER BY rowid")
    found = [dict(row) for row in rows]
    conn.row_factory = None
    return found


def _as_version_17(path: Path, scratch: Path) -> None:
    """Give the runs table of ``path`` the layout of schema version 17 (read
    from a file migrated to 17) and record version 17."""
    gateway = SqliteGateway(str(scratch))
    sqlite_migrate(gateway, target=17)
    gateway.close()
    old = sqlite3.connect(scratch)
    table = old.execute("SELECT sql FROM sqlite_master WHERE name = 'dagwerk_runs'").fetchone()[0]
    indexes = [
        row[0]
        for row in old.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'dagwerk_runs'"
            " AND sql IS NOT NULL"
        )
    ]
    old.close()
    conn = sqlite3.connect(path, isolation_level=None)
    columns = ", ".join(_columns(conn))
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("BEGIN")
    conn.execute("CREATE TABLE runs_copy AS SELECT rowid AS row_number, * FROM dagwerk_runs")
    conn.execute("DROP TABLE dagwerk_runs")
    conn.execute(table)
    conn.execute(
        f"INSERT INTO dagwerk_runs (rowid, {columns}) SELECT row_number, {columns} FROM runs_copy"
    )
    conn.execute("DROP TABLE runs_copy")
    for index in indexes:
        conn.execute(index)
    conn.execute("DELETE FROM dagwerk_schema_version WHERE version > 17")
    conn.execute("COMMIT")
    assert _columns(conn)[1] == "nodes"  # the old layout, as version 17 made it
    conn.close()


def _step(inputs: object, ctx: object) -> list[dict[str, int]]:
    return [{"n": 1}]


def test_the_large_columns_of_a_run_come_last(tmp_path: Path) -> None:
    Engine(f"sqlite:///{tmp_path / 'new.db'}").close()
    conn = sqlite3.connect(tmp_path / "new.db")
    try:
        columns = _columns(conn)
    finally:
        conn.close()
    assert tuple(columns[-len(LARGE) :]) == LARGE
    assert columns[:4] == ["run_id", "status", "epoch", "node_count"]


def test_an_upgrade_keeps_every_run_and_what_refers_to_it(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    nodes = [root("a", plugin="step"), child("b", "a", plugin="step")]
    with Engine(f"sqlite:///{path}") as engine:
        engine.plugin("step")(_step)
        finished = [engine.submit(nodes, {"k": k}) for k in range(3)]
        engine.worker(concurrency=1).run_until_idle()
        pending = engine.submit(nodes, {"k": "later"})
    _as_version_17(path, tmp_path / "scratch.db")
    conn = sqlite3.connect(path)
    before = _runs(conn)
    conn.close()

    with Engine(f"sqlite:///{path}") as engine:  # opens at the latest version
        engine.plugin("step")(_step)
        assert [engine.result(run_id).status for run_id in finished] == [RunStatus.COMPLETED] * 3
        engine.worker(concurrency=1).run_until_idle()
        assert engine.result(pending).status is RunStatus.COMPLETED

    conn = sqlite3.connect(path)
    try:
        assert tuple(_columns(conn)[-len(LARGE) :]) == LARGE
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        after = {row["run_id"]: row for row in _runs(conn)}
        versions = [row[0] for row in conn.execute("SELECT version FROM dagwerk_schema_version")]
        indexes = {
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'dagwerk_runs'"
            )
        }
    finally:
        conn.close()
    assert max(versions) == 18
    assert {"dagwerk_runs_created", "dagwerk_runs_created_status", "dagwerk_runs_finished"} <= (
        indexes
    )
    for row in before:
        kept = after[str(row["run_id"])]
        if row["run_id"] == pending:  # it ran after the upgrade
            assert kept["row_number"] == row["row_number"]
            assert (kept["nodes"], kept["run_input"]) == (row["nodes"], row["run_input"])
        else:
            assert kept == row
