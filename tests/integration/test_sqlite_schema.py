"""SQLite schema, migrations, named SQL blocks and bad input (real files)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from dagwerk.backends.errors import (
    SchemaTooNewError,
    StoreCorruptError,
    StoreFullError,
    StoreReadOnlyError,
)
from dagwerk.backends.sql import RUN_TABLES
from dagwerk.backends.sql.gateway import load_queries
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.backends.sqlite.gateway import QUERIES, QUERIES_PATH
from dagwerk.backends.sqlite.migrations import LATEST_VERSION, MIGRATIONS, SCHEMA_PATH
from dagwerk.constants import RunStatus
from dagwerk.store import InvalidStoreValueError
from dagwerk.testing.helpers import chain, emit, new_run, only_task, root, tasks_of

SRC = Path(__file__).resolve().parents[2] / "src" / "dagwerk" / "backends"


def _master(path: Path) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
        ).fetchall()
    finally:
        conn.close()
    return [(kind, name, " ".join((sql or "").split())) for kind, name, sql in rows]


def test_migrations_reproduce_schema_sql(tmp_path: Path) -> None:
    migrated = tmp_path / "migrated.db"
    SqliteStore(migrated).close()
    fresh = tmp_path / "fresh.db"
    conn = sqlite3.connect(fresh)
    conn.executescript(SCHEMA_PATH.read_text(encoding="utf-8"))
    conn.close()
    assert _master(migrated) == _master(fresh)
    assert len(_master(fresh)) > 10


def test_migrations_are_numbered_and_recorded(tmp_path: Path) -> None:
    assert [version for version, _ in MIGRATIONS] == list(range(1, LATEST_VERSION + 1))
    path = tmp_path / "v.db"
    SqliteStore(path).close()
    SqliteStore(path).close()  # reopening does not migrate twice
    conn = sqlite3.connect(path)
    versions = [row[0] for row in conn.execute("SELECT version FROM dagwerk_schema_version")]
    conn.close()
    assert versions == list(range(1, LATEST_VERSION + 1))


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SqliteStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO dagwerk_schema_version (version) VALUES (?)", (LATEST_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(SchemaTooNewError) as caught:
        SqliteStore(path)
    assert caught.value.code == "schema_too_new"
    assert "upgrade dagwerk" in str(caught.value)
    with pytest.raises(SchemaTooNewError):
        SqliteStore(f"sqlite:///{path}?mode=ro")


def test_every_named_block_is_used_and_every_used_name_exists() -> None:
    code = "\n".join(p.read_text() for p in SRC.glob("sql*/**/*.py"))
    used = set(re.findall(r"\.(?:one|all|run|many|_read_one)\(\s*\"([a-z_0-9]+)\"", code))
    # Reads sent together (all_of) name their blocks in (name, params) pairs;
    # a pair may name a block of PostgreSQL's flights only.
    used |= set(re.findall(r"\(\s*\"([a-z_0-9]+)\",\s*\{", code)) & set(QUERIES)
    # Writes sent together (many_of) name their blocks in (name, rows) pairs.
    used |= set(re.findall(r"(?:\.append\(|= \[)\(\s*\"([a-z_0-9]+)\",", code)) & set(QUERIES)
    assert used, "no query references found"
    # Retention deletes run through the blocks its declared table list names.
    used |= {table.statement for table in RUN_TABLES}
    assert used - set(QUERIES) == set(), "code names queries the .sql file lacks"
    # Blocks used only by the migrator are referenced the same way.
    assert set(QUERIES) - used == set(), "queries.sql has blocks no code uses"


def test_named_block_loader_rejects_duplicates_and_empty_blocks(tmp_path: Path) -> None:
    assert load_queries(QUERIES_PATH) == QUERIES
    dup = tmp_path / "dup.sql"
    dup.write_text("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")
    with pytest.raises(ValueError, match="defined twice"):
        load_queries(dup)
    empty = tmp_path / "empty.sql"
    empty.write_text("-- name: a\n\n-- name: b\nSELECT 1;\n")
    with pytest.raises(ValueError, match="empty"):
        load_queries(empty)


def test_data_survives_reopening(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'keep.db'}"
    with SqliteStore(url) as store:
        new_run(store, chain(2))
    with SqliteStore(url) as store:
        assert store.get_run_status("run-1") is RunStatus.RUNNING
        assert len(store.list_deliveries("run-1")) == 1


def test_url_forms(tmp_path: Path) -> None:
    with pytest.raises(InvalidStoreValueError):
        SqliteStore("postgresql://host/db")
    with pytest.raises(InvalidStoreValueError):
        SqliteStore("sqlite:///")
    with pytest.raises(InvalidStoreValueError):
        SqliteStore(f"sqlite:///{tmp_path / 'x.db'}?cache=shared")
    with SqliteStore("sqlite:///:memory:") as store:
        assert store.create_run("r", [root("a")])


# --- bad input -------------------------------------------------------------------


def test_garbage_file_is_store_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database at all" * 200)
    with pytest.raises(StoreCorruptError) as caught:
        SqliteStore(path)
    assert caught.value.code == "store_corrupt"
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreCorruptError, match="without a dagwerk schema"):
        SqliteStore(path)
    # Nothing was added to the foreign file.
    assert [row[1] for row in _master(path)] == ["customers"]


def test_read_only_store_reads_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    with SqliteStore(path) as store:
        new_run(store, [root("a")])
    with SqliteStore(f"sqlite:///{path}?mode=ro") as store:
        assert store.get_run_status("run-1") is RunStatus.RUNNING
        with pytest.raises(StoreReadOnlyError) as caught:
            store.create_run("run-2", [root("a")])
        assert caught.value.code == "store_readonly"
        record = only_task(store, "run-1", 0)
        with pytest.raises(StoreReadOnlyError):
            store.try_claim_task(
                record.task_id, expected_attempt_id=record.attempt_id, expected_generation=0
            )
    with SqliteStore(path) as store:
        assert store.get_run("run-2") is None


def test_full_database_is_store_full_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "full.db"
    with SqliteStore(path) as store:
        new_run(store, [root("r"), root("b")])
        conn = sqlite3.connect(path)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.close()
    big = tuple(emit(*(f"o{i}" for i in range(3_000)), pad="x" * 200))
    with SqliteStore(path, max_page_count=pages + 8) as store:
        top = only_task(store, "run-1", 0)
        assert store.try_claim_task(
            top.task_id, expected_attempt_id=top.attempt_id, expected_generation=0
        )
        before = store.list_tasks("run-1")
        with pytest.raises(StoreFullError) as caught:
            store.try_complete_task(top.task_id, big, expected_attempt_id=top.attempt_id)
        assert caught.value.code == "store_full"
        # No half-written completion: the task is still RUNNING, no outputs.
        assert store.list_tasks("run-1") == before
        assert store.get_output_ids("run-1", 0) == ()
        # The store stays usable for small writes.
        assert store.try_complete_task(top.task_id, (), expected_attempt_id=top.attempt_id)
        assert len(tasks_of(store, "run-1", 1)) == 1


def test_the_failure_check_of_a_targeted_reconcile_is_one_index_probe(tmp_path: Path) -> None:
    """Schema v6: ``run_frontier`` finds failed launches through the partial
    index, not by walking every launch of the run."""
    db = tmp_path / "plan.db"
    SqliteStore(str(db)).close()
    conn = sqlite3.connect(db)
    try:
        plan = " | ".join(
            str(row[3])
            for row in conn.execute(
                "EXPLAIN QUERY PLAN " + QUERIES["run_frontier"], {"run_id": "r", "count": 0}
            )
        )
    finally:
        conn.close()
    assert "dagwerk_launches_failed" in plan


def test_a_stop_finds_its_queue_rows_by_their_run_not_by_every_task(tmp_path: Path) -> None:
    """A run's stop drops the queue rows of its active tasks through the
    queue's run index, probing a task per queue row, instead of listing
    every task of the run (a finished run's queue is empty)."""
    db = tmp_path / "plan.db"
    SqliteStore(str(db)).close()
    conn = sqlite3.connect(db)
    try:
        plan = [
            str(row[3])
            for row in conn.execute(
                "EXPLAIN QUERY PLAN " + QUERIES["deliveries_drop_active"],
                {"run_id": "r", "node_index": None},
            )
        ]
    finally:
        conn.close()
    assert plan[0].startswith("SEARCH d USING INDEX dagwerk_deliveries_run"), plan
    assert not any("dagwerk_tasks_run" in step for step in plan), plan
