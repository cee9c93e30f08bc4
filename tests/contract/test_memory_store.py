"""The store contract suite against the in-memory reference store."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.testing.store_contract import *  # noqa: F403
from dagwerk.testing.table_rows import TableRows, memory_rows


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def make_store() -> Callable[..., MemoryStore]:
    return MemoryStore


@pytest.fixture
def store_rows() -> Callable[[MemoryStore], TableRows]:
    return memory_rows
