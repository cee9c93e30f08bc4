"""The queue contract (``dagwerk.testing.contract_queue``) on the memory store."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.testing.contract_queue import *  # noqa: F403


@pytest.fixture
def make_store() -> Callable[..., MemoryStore]:
    return MemoryStore
