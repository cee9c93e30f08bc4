"""``StoreCapabilities``: a store's optional protocols, looked up once, and the
SQL gateway's hooks with their defaults."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from dagwerk.backends.memory import MemoryStore
from dagwerk.backends.sql import Gateway, Row, Tx
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.capabilities import StoreCapabilities
from dagwerk.limits import Limits

_TYPED = [
    "runs",
    "topology",
    "activity",
    "frontier",
    "queue",
    "batch",
    "units",
    "claim_ahead",
    "recent_outputs",
    "backstop",
    "live_nodes",
    "wait_ages",
    "running_tasks",
    "presence",
    "forecast",
    "children",
    "budgets",
    "wait_responses",
    "wait_records",
    "delayed_retry",
    "rerun",
    "closable",
    "retention",
    "schedules",
    "idempotent_submits",
]


def _present(capabilities: StoreCapabilities) -> set[str]:
    return {name for name in _TYPED if getattr(capabilities, name) is not None}


def test_the_memory_store_offers_everything_but_units_of_work_and_their_shortcuts() -> None:
    store = MemoryStore(limits=Limits(max_run_input_bytes=1_000))
    capabilities = StoreCapabilities.of(store)
    assert _present(capabilities) == set(_TYPED) - {
        "units",
        "claim_ahead",
        "recent_outputs",
        "closable",
    }
    assert capabilities.runs is store and capabilities.queue is store
    assert capabilities.limits == Limits(max_run_input_bytes=1_000)


def test_the_sqlite_store_offers_every_capability(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "db.sqlite"))
    try:
        capabilities = StoreCapabilities.of(store)
        assert _present(capabilities) == set(_TYPED)
        assert capabilities.claim_ahead is store and capabilities.closable is store
        assert capabilities.limits is store.limits
    finally:
        store.close()


class _SeedOnly:
    """A store of none of dagwerk's extensions (and limits that are not Limits)."""

    limits = "not limits"

    def get_run_status(self, run_id: str) -> None:
        return None


def test_a_store_without_extensions_has_none_of_them() -> None:
    capabilities = StoreCapabilities.of(_SeedOnly())
    assert _present(capabilities) == set()
    assert capabilities.limits is None


class _Proxy:
    """Forwards every attribute to what it wraps: its class declares nothing."""

    def __init__(self, target: object) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def test_a_forwarding_proxy_has_what_it_forwards() -> None:
    assert StoreCapabilities.of(_Proxy(MemoryStore())).queue is not None
    assert StoreCapabilities.of(_Proxy(_SeedOnly())).queue is None


def test_a_looked_up_store_is_not_kept_alive() -> None:
    store = MemoryStore()
    assert StoreCapabilities.of(store).runs is store
    assert StoreCapabilities.of(store).runs is store  # answered from what was kept
    dead = weakref.ref(store)
    del store
    gc.collect()
    assert dead() is None


def test_a_method_replaced_on_the_store_is_the_one_called() -> None:
    store = MemoryStore()
    capabilities = StoreCapabilities.of(store)
    store.has_live_node = lambda run_id: run_id == "yes"  # type: ignore[method-assign]
    assert capabilities.live_nodes is not None
    assert capabilities.live_nodes.has_live_node("yes") is True


# --- the SQL gateway's hooks ---------------------------------------------------------


class _Tx:
    def one(self, name: str, params: Any = None) -> Row | None:
        return {"name": name, "params": params}


class _PlainGateway(Gateway):
    """A gateway with only transactions: every other hook is the default."""

    def __init__(self) -> None:
        self.reads = 0

    @contextmanager
    def _tx(self) -> Iterator[Tx]:
        self.reads += 1
        yield _Tx()  # type: ignore[misc]

    def write(self) -> AbstractContextManager[Tx]:
        return self._tx()

    def read(self) -> AbstractContextManager[Tx]:
        return self._tx()


def test_a_gateway_without_units_of_work_gets_the_defaults() -> None:
    gateway = _PlainGateway()
    assert gateway.serialises_writers is False and gateway.pipelines_writes is False
    row = gateway.read_one("q", {"a": 1})
    assert row is not None and row["name"] == "q" and gateway.reads == 1
    assert gateway.after_commit(lambda: None) is False
    assert gateway.write_mark() is None and gateway.unit_serial() is None
    assert gateway.undoes_a_failed_write() is True
    assert gateway.work_epoch() is None
    assert gateway.wait_for_work(0.0, None) is None
