"""The whole store contract suite against PostgresStore, no test skipped.

Each store a test makes lives in a fresh PostgreSQL schema of the test
database (created by the store's own migrations, dropped afterwards), so
tests never see each other's rows and no server-wide state is reset.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

from dagwerk.backends.postgres import PostgresStore
from dagwerk.testing.contract_queue import *  # noqa: F403
from dagwerk.testing.store_contract import *  # noqa: F403
from dagwerk.testing.table_rows import TableRows, postgres_rows


@pytest.fixture
def make_store(postgres_url: str) -> Iterator[Callable[..., PostgresStore]]:
    opened: list[PostgresStore] = []

    def make(**settings: object) -> PostgresStore:
        schema = f"contract_{uuid.uuid4().hex[:16]}"
        store = PostgresStore(postgres_url, schema=schema, pool_size=2, **settings)  # type: ignore[arg-type]
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()
    if opened:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            for store in opened:
                conn.execute(f'DROP SCHEMA IF EXISTS "{store.schema}" CASCADE')


@pytest.fixture
def store(make_store: Callable[..., PostgresStore]) -> PostgresStore:
    return make_store()


@pytest.fixture
def store_rows(postgres_url: str) -> Callable[[PostgresStore], TableRows]:
    return lambda store: postgres_rows(postgres_url, store.schema)
