"""The whole store contract suite against SqliteStore, on a file and on ``:memory:``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.testing.store_contract import *  # noqa: F403
from dagwerk.testing.table_rows import TableRows, sqlite_rows


@pytest.fixture(params=["file", "memory"])
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., SqliteStore]]:
    opened: list[SqliteStore] = []

    def make(**settings: object) -> SqliteStore:
        if request.param == "file":
            url = f"sqlite:///{tmp_path / f'contract-{len(opened)}.db'}"
        else:
            url = "sqlite:///:memory:"
        store = SqliteStore(url, **settings)  # type: ignore[arg-type]
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: Callable[..., SqliteStore]) -> SqliteStore:
    return make_store()


@pytest.fixture
def store_rows() -> Callable[[SqliteStore], TableRows]:
    def rows(store: SqliteStore) -> TableRows:
        if store.path == ":memory:":
            pytest.skip("a :memory: database cannot be read from a second connection")
        return sqlite_rows(store.path)

    return rows
