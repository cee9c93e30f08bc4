"""Fixtures shared by every test layer."""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database of each backend that several processes can share: a
    SQLite file, or a new schema on the test PostgreSQL server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'db.sqlite'}"
        return
    from dagwerk.testing.postgres import fresh_schema_url

    with fresh_schema_url(request.getfixturevalue("postgres_url")) as url:
        yield url


@pytest.fixture
def pg_schema(postgres_url: str) -> Iterator[str]:
    """The name of a fresh PostgreSQL schema for one test, dropped afterwards
    (a store opened with ``schema=`` creates it)."""
    import psycopg  # the PostgreSQL extra: only tests that use the server need it

    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts of the named SQLite statements run while the test runs
    (``execute`` and ``many`` of the gateway's transactions)."""
    from dagwerk.backends.sqlite import gateway

    counts: Counter[str] = Counter()
    execute, many = gateway._Tx._execute, gateway._Tx.many

    def counted_execute(self: gateway._Tx, name: str, params: object) -> object:
        counts[name] += 1
        return execute(self, name, params)  # type: ignore[arg-type]

    def counted_many(self: gateway._Tx, name: str, rows: object) -> None:
        counts[name] += 1
        many(self, name, rows)  # type: ignore[arg-type]

    monkeypatch.setattr(gateway._Tx, "_execute", counted_execute)
    monkeypatch.setattr(gateway._Tx, "many", counted_many)
    yield counts


@pytest.fixture
def node_validations(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """What ``DagNode.model_validate`` is called with while the test runs."""
    from dagwerk.models import DagNode

    calls: list[object] = []
    validate = DagNode.model_validate

    def counted(value: object, *args: object, **kwargs: object) -> DagNode:
        calls.append(value)
        return validate(value, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(DagNode, "model_validate", counted)
    return calls
