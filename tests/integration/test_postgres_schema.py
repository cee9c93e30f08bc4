"""PostgreSQL schema, migrations, named SQL blocks and bad input (a real server).

Every test works in its own PostgreSQL schema of the test database, dropped
afterwards. The first two tests read only the ``.sql`` files and run without
a server.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from dagwerk.backends.errors import SchemaTooNewError, StoreCorruptError
from dagwerk.backends.postgres import PostgresStore
from dagwerk.backends.postgres.gateway import QUERIES, QUERIES_PATH
from dagwerk.backends.postgres.migrations import LATEST_VERSION, MIGRATIONS, SCHEMA_PATH
from dagwerk.backends.sql.gateway import load_queries
from dagwerk.backends.sqlite.gateway import QUERIES_PATH as SQLITE_QUERIES_PATH
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.models import EmittedOutput
from dagwerk.orchestrator import on_task_complete
from dagwerk.store import InvalidStoreValueError, OutputPublicationError
from dagwerk.testing.helpers import CallbackLog, chain, claim, new_run, only_task, root

SRC = Path(__file__).resolve().parents[2] / "src" / "dagwerk" / "backends"


# --- the .sql files (no server) ------------------------------------------------------


def _only(path: Path, dialect: str) -> set[str]:
    """Blocks of ``path`` that say why the other dialect has none (a
    ``-- postgres only:`` or ``-- sqlite only:`` line with a reason)."""
    return {
        name
        for name, sql in load_queries(path).items()
        if re.search(rf"^--\s*{dialect} only:\s*\S", sql, re.MULTILINE)
    }


def test_both_sql_files_define_the_same_operations() -> None:
    sqlite = set(load_queries(SQLITE_QUERIES_PATH))
    postgres = set(load_queries(QUERIES_PATH))
    assert sqlite, "no blocks in sqlite/queries.sql"
    sqlite_only = _only(SQLITE_QUERIES_PATH, "sqlite")
    postgres_only = _only(QUERIES_PATH, "postgres")
    assert sorted(sqlite - postgres - sqlite_only) == [], "blocks missing from postgres/queries.sql"
    assert sorted(postgres - sqlite - postgres_only) == [], "blocks missing from sqlite/queries.sql"
    assert sorted(sqlite_only & postgres) == [], "a block marked sqlite only is in PostgreSQL too"
    assert sorted(postgres_only & sqlite) == [], "a block marked postgres only is in SQLite too"


_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_PSYCOPG_PARAM = re.compile(r"%\(([A-Za-z_]\w*)\)s")


def test_both_sql_files_take_the_same_parameters() -> None:
    """Each operation takes the same parameters on both databases, so a block
    changed on one side only is caught; lock preludes use the same ones."""
    sqlite = load_queries(SQLITE_QUERIES_PATH)
    for name, statement in QUERIES.items():
        if name not in sqlite:
            continue  # postgres only (checked above)
        code = "\n".join(
            line for line in sqlite[name].splitlines() if not line.lstrip().startswith("--")
        )
        main = set(_PSYCOPG_PARAM.findall(statement.main.decode()))
        assert main == set(_PARAM.findall(code)), name
        for prelude in statement.preludes:
            extra = set(_PSYCOPG_PARAM.findall(prelude.decode())) - main
            # Only the migration lock takes a parameter of its own.
            assert extra <= ({"schema"} if name == "schema_version_table" else set()), name


def test_lock_preludes_only_lock() -> None:
    """A prelude runs only in write transactions, so it must change nothing:
    it may only take row locks or an advisory lock."""
    preludes = [(name, p) for name, q in QUERIES.items() for p in q.preludes]
    assert preludes, "no lock preludes found"
    for name, prelude in preludes:
        text = prelude.decode().upper()
        assert text.lstrip("- \n").count("SELECT") >= 1, name
        modes = ("FOR UPDATE", "FOR NO KEY UPDATE", "FOR KEY SHARE", "ADVISORY")
        assert any(mode in text for mode in modes), name
        for verb in ("INSERT ", "UPDATE dagwerk", "DELETE "):
            assert verb.upper() not in text, (name, verb)
    # The statements that open a run-level transition lock the lineage's root
    # run row, then the run's own (in its mode: test_postgres_lock_modes.py).
    for name in ("run_get", "run_status", "task_get_owned", "wait_get", "recovery_get"):
        assert b"FOR NO KEY UPDATE" in QUERIES[name].preludes[0], name
        assert b"FOR UPDATE" in QUERIES[name].preludes[1], name
    assert b"SKIP LOCKED" in QUERIES["queue_candidates"].main


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def schemas(postgres_url: str) -> Iterator[Callable[[], str]]:
    made: list[str] = []

    def new() -> str:
        made.append(f"schema_{uuid.uuid4().hex[:16]}")
        return made[-1]

    yield new
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for name in made:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _catalog(url: str, schema: str) -> dict[str, list[tuple[object, ...]]]:
    """Everything the schema defines, with its own name blanked out."""
    with psycopg.connect(url) as conn:
        queries = {
            "columns": """
                SELECT table_name, ordinal_position, column_name, data_type, is_nullable,
                       column_default, is_identity, identity_generation
                FROM information_schema.columns WHERE table_schema = %(s)s
                ORDER BY table_name, ordinal_position""",
            "constraints": """
                SELECT c.conrelid::regclass::text, c.conname, c.contype,
                       pg_get_constraintdef(c.oid)
                FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
                WHERE n.nspname = %(s)s ORDER BY 1, 2""",
            "indexes": """
                SELECT tablename, indexname, indexdef FROM pg_indexes
                WHERE schemaname = %(s)s ORDER BY 1, 2""",
            "triggers": """
                SELECT t.tgname, pg_get_triggerdef(t.oid)
                FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = %(s)s AND NOT t.tgisinternal ORDER BY 1""",
            "functions": """
                SELECT p.proname, p.prosrc FROM pg_proc p
                JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = %(s)s ORDER BY 1""",
        }
        found: dict[str, list[tuple[object, ...]]] = {}
        for key, sql in queries.items():
            rows = conn.execute(sql, {"s": schema}).fetchall()
            found[key] = [
                tuple(
                    value.replace(f"{schema}.", "") if isinstance(value, str) else value
                    for value in row
                )
                for row in rows
            ]
        return found


# --- migrations ----------------------------------------------------------------------------


def test_migrations_reproduce_schema_sql(postgres_url: str, schemas: Callable[[], str]) -> None:
    migrated, fresh = schemas(), schemas()
    PostgresStore(postgres_url, schema=migrated).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{fresh}"')
        conn.execute(f'SET search_path = "{fresh}"')
        conn.execute(SCHEMA_PATH.read_text(encoding="utf-8").encode())
    by_migrations = _catalog(postgres_url, migrated)
    by_schema_sql = _catalog(postgres_url, fresh)
    for key, rows in by_schema_sql.items():
        assert by_migrations[key] == rows, key
    assert len(by_schema_sql["columns"]) > 100
    assert len(by_schema_sql["indexes"]) > 15
    assert len(by_schema_sql["triggers"]) == 3


def test_migrations_are_numbered_and_recorded_once(
    postgres_url: str, schemas: Callable[[], str]
) -> None:
    assert [version for version, _ in MIGRATIONS] == list(range(1, LATEST_VERSION + 1))
    schema = schemas()
    with PostgresStore(postgres_url, schema=schema) as store:
        new_run(store, chain(2))
    with PostgresStore(postgres_url, schema=schema) as store:  # no second migration
        assert store.get_run_status("run-1") is RunStatus.RUNNING
        assert len(store.list_deliveries("run-1")) == 1
    assert _versions(postgres_url, schema) == list(range(1, LATEST_VERSION + 1))


def _versions(url: str, schema: str) -> list[int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(f'SELECT version FROM "{schema}".dagwerk_schema_version ORDER BY 1')
        return [row[0] for row in rows]


def test_newer_schema_is_refused(postgres_url: str, schemas: Callable[[], str]) -> None:
    schema = schemas()
    PostgresStore(postgres_url, schema=schema).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".dagwerk_schema_version VALUES (%s)', (LATEST_VERSION + 1,)
        )
    with pytest.raises(SchemaTooNewError) as caught:
        PostgresStore(postgres_url, schema=schema)
    assert caught.value.code == "schema_too_new"
    assert "upgrade dagwerk" in str(caught.value)
    assert _versions(postgres_url, schema)[-1] == LATEST_VERSION + 1


def test_half_made_schema_is_refused(postgres_url: str, schemas: Callable[[], str]) -> None:
    schema = schemas()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".dagwerk_runs (run_id text)')
        conn.execute(f'CREATE TABLE "{schema}".customers (id int)')
    with pytest.raises(StoreCorruptError, match="no dagwerk_schema_version"):
        PostgresStore(postgres_url, schema=schema)


_OPEN_SCRIPT = """
import sys
from dagwerk.backends.postgres import PostgresStore
sys.stdin.readline()
PostgresStore(sys.argv[1], schema=sys.argv[2]).close()
print("opened")
"""


def test_four_processes_opening_at_once_migrate_once(
    postgres_url: str, schemas: Callable[[], str]
) -> None:
    schema = schemas()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_SCRIPT, postgres_url, schema],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for proc in procs:  # released together once all four interpreters are up
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip() == "opened"
    # Each version applied exactly once: a second run would have failed on
    # CREATE TABLE or recorded its version twice.
    assert _versions(postgres_url, schema) == list(range(1, LATEST_VERSION + 1))


# --- values PostgreSQL cannot hold -----------------------------------------------------------


def test_nul_in_text_is_refused_before_writing(
    postgres_url: str, schemas: Callable[[], str]
) -> None:
    with PostgresStore(postgres_url, schema=schemas()) as store:
        with pytest.raises(InvalidStoreValueError) as caught:
            store.create_run("a\x00b", [root("a")])
        assert caught.value.field == "run_id"
        assert "NUL" in str(caught.value)
        assert store.list_runs() == []
        new_run(store, [root("a")])
        task = only_task(store, "run-1", 0)
        claim(store, task)
        with pytest.raises(InvalidStoreValueError):
            store.mark_task_failed(
                task.task_id, "bad\x00error", expected_attempt_id=task.attempt_id
            )
        assert only_task(store, "run-1", 0).status is TaskStatus.RUNNING
        # In outputs it is a publication error: the completion fails the task.
        bad = (EmittedOutput(id="o\x00", fields={}),)
        with pytest.raises(OutputPublicationError):
            store.try_complete_task(task.task_id, bad, expected_attempt_id=task.attempt_id)
        assert store.get_output_ids("run-1", 0) == ()
        on_task_complete(
            store,
            task_id=task.task_id,
            expected_attempt_id=task.attempt_id,
            outputs=bad,
            callbacks=CallbackLog().callbacks,
        )
        assert only_task(store, "run-1", 0).status is TaskStatus.FAILED


def test_integers_outside_64_bits_are_refused(
    postgres_url: str, schemas: Callable[[], str]
) -> None:
    with PostgresStore(postgres_url, schema=schemas(), default_priority=2**63) as store:
        with pytest.raises(InvalidStoreValueError) as caught:
            store.create_run("r", [root("a")])
        assert caught.value.field == "priority"
        with pytest.raises(InvalidStoreValueError):
            store.get_output_ids("r", 10**5000)  # too long even to print
        assert store.get_run("r") is None


def test_url_and_settings_are_checked(postgres_url: str) -> None:
    for url in ("sqlite:///x.db", "mysql://h/db", 7):
        with pytest.raises(InvalidStoreValueError):
            PostgresStore(url)  # type: ignore[arg-type]
    for schema in ("Upper", "a-b", "x" * 64, 'a"; DROP'):
        with pytest.raises(InvalidStoreValueError):
            PostgresStore(postgres_url, schema=schema)
    with pytest.raises(InvalidStoreValueError):
        PostgresStore(postgres_url, pool_size=0)
