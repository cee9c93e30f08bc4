"""The ``dagwerk`` command against a PostgreSQL URL that is wrong: an unknown
database, host or role and a wrong password fail at once with one line
naming the cause; ``?schema=NAME`` in the URL and ``--schema NAME`` choose
the schema of dagwerk's tables."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parents[2]
APPROVAL = str(ROOT / "examples" / "pipelines" / "approval.yaml")
# Opening waits up to 30 s for a server that refuses or times out; a
# rejected connection must not come near that.
AT_ONCE = 15.0


def dagwerk(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGWERK_")}
    begun = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "dagwerk", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result, time.monotonic() - begun


def with_part(url: str, *, user: str | None = None, dbname: str | None = None) -> str:
    """``url`` with another user (and password) or database."""
    info = conninfo_to_dict(url)
    host, port = info.get("host", "localhost"), info.get("port", "5432")
    credentials = user if user is not None else str(info.get("user", ""))
    return f"postgresql://{credentials}@{host}:{port}/{dbname or info['dbname']}"


def assert_one_line_at_once(result: subprocess.CompletedProcess[str], took: float) -> str:
    assert result.returncode == 2, result  # a fatal store fault: waiting does not cure it
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: cannot connect to PostgreSQL at ")
    assert took < AT_ONCE
    return lines[0]


def test_an_unknown_database_fails_at_once_naming_it(postgres_url: str, tmp_path: Path) -> None:
    url = with_part(postgres_url, dbname="no_such_database_here")
    result, took = dagwerk("runs", "--db", url, cwd=tmp_path)
    line = assert_one_line_at_once(result, took)
    assert 'database "no_such_database_here" does not exist' in line


def test_an_unknown_role_fails_at_once_naming_it(postgres_url: str, tmp_path: Path) -> None:
    url = with_part(postgres_url, user="no_such_role_here")
    result, took = dagwerk("runs", "--db", url, cwd=tmp_path)
    line = assert_one_line_at_once(result, took)
    assert 'role "no_such_role_here" does not exist' in line


def test_an_unknown_host_fails_at_once_naming_it(tmp_path: Path) -> None:
    result, took = dagwerk(
        "runs", "--db", "postgresql://dagwerk@nonexistent.invalid/dagwerk", cwd=tmp_path
    )
    line = assert_one_line_at_once(result, took)
    assert "nonexistent.invalid" in line


@pytest.fixture
def password_role(postgres_url: str) -> Iterator[str]:
    """A role that must log in with its password (``secret``): a line for it
    is put first in the server's ``pg_hba.conf`` (written by the server
    itself with ``COPY``, so the test needs only a superuser connection) and
    taken out again afterwards. The test cluster trusts everyone else."""
    role = f"pw_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        superuser = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        row = superuser.fetchone()
        if not (row and row[0]):
            pytest.skip("needs a superuser connection to require a password for one role")
        hba_row = conn.execute("SELECT setting FROM pg_settings WHERE name = 'hba_file'").fetchone()
        assert hba_row is not None
        hba = hba_row[0]
        read = conn.execute("SELECT pg_read_file(%s)", (hba,)).fetchone()
        assert read is not None
        original: str = read[0]
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'secret'")
        rule = f"host all {role} all scram-sha-256"
        try:
            _write_lines(conn, hba, [rule, *original.splitlines()])
            try:
                broken = conn.execute(
                    "SELECT line_number, error FROM pg_hba_file_rules WHERE error IS NOT NULL"
                ).fetchall()
                assert not broken, f"pg_hba.conf as written has errors: {broken}"
                conn.execute("SELECT pg_reload_conf()")
                _until_password_is_required(postgres_url, role)
                yield role
            finally:
                _write_lines(conn, hba, original.splitlines())
                conn.execute("SELECT pg_reload_conf()")
        finally:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def _write_lines(conn: psycopg.Connection[tuple[object, ...]], path: str, lines: list[str]) -> None:
    # CSV with a delimiter, quote and NULL marker that no line contains: each line is
    # written as it is.
    # COPY takes no parameters, so the values are spliced in as literals.
    conn.execute(
        sql.SQL(
            "COPY (SELECT line FROM unnest({}::text[]) WITH ORDINALITY AS t(line, n) ORDER BY n)"
            " TO {} WITH (FORMAT csv, DELIMITER E'\\x02', QUOTE E'\\x01', NULL E'\\x03')"
        ).format(sql.Literal(lines), sql.Literal(path))
    )


def _until_password_is_required(url: str, role: str) -> None:
    """Return once the server has applied the reloaded ``pg_hba.conf``."""
    wrong = with_part(url, user=f"{role}:wrong")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            psycopg.connect(wrong).close()
        except psycopg.OperationalError as error:
            if "password authentication failed" in str(error):
                return
            raise
    pytest.fail("the server did not apply the reloaded pg_hba.conf within 30 s")


def test_a_wrong_password_fails_at_once_naming_it(
    postgres_url: str, password_role: str, tmp_path: Path
) -> None:
    url = with_part(postgres_url, user=f"{password_role}:not-the-password")
    result, took = dagwerk("runs", "--db", url, cwd=tmp_path)
    line = assert_one_line_at_once(result, took)
    assert f'password authentication failed for user "{password_role}"' in line
    assert "not-the-password" not in line


def test_schema_in_the_url_and_schema_option_choose_the_tables_schema(
    postgres_url: str, pg_schema: str, tmp_path: Path
) -> None:
    separator = "&" if "?" in postgres_url else "?"
    in_url = f"{postgres_url}{separator}schema={pg_schema}"
    submitted, _ = dagwerk(
        "submit", APPROVAL, "--input", '{"topic": "schemas"}', "--db", in_url, cwd=tmp_path
    )
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()

    listed, _ = dagwerk("runs", "--db", postgres_url, "--schema", pg_schema, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert run_id in listed.stdout
    elsewhere, _ = dagwerk("runs", "--db", postgres_url, cwd=tmp_path)
    assert run_id not in elsewhere.stdout
    with psycopg.connect(postgres_url) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (pg_schema,)
        ).fetchone()
    assert tables is not None and tables[0] > 0


def test_schema_option_is_refused_for_sqlite_and_for_a_different_url_schema(
    postgres_url: str, tmp_path: Path
) -> None:
    sqlite, _ = dagwerk("runs", "--db", "sqlite:///x.db", "--schema", "team_a", cwd=tmp_path)
    assert sqlite.returncode == 2
    assert sqlite.stderr == "error: --schema applies to postgresql:// databases only\n"
    separator = "&" if "?" in postgres_url else "?"
    both, _ = dagwerk(
        "runs",
        "--db",
        f"{postgres_url}{separator}schema=team_b",
        "--schema",
        "team_c",
        cwd=tmp_path,
    )
    assert both.returncode == 2
    assert "team_b" in both.stderr and "team_c" in both.stderr
