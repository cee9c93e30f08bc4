"""The bounded per-run caches (dagwerk._fifo): a long-lived worker must not
keep every run it ever touched."""

from __future__ import annotations

from typing import cast

import pytest

from dagwerk._fifo import RUN_CACHE_LIMIT, FifoCache
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.engine import Engine
from dagwerk.lineage import RunLink
from dagwerk.models import DagNode
from dagwerk.runtime.attempts import LINKS_KEPT, BatchReads
from dagwerk.store import DagChildStore


def test_a_full_cache_forgets_the_oldest_entry() -> None:
    cache: FifoCache[str, int] = FifoCache(3)
    for n in range(3):
        cache[f"r{n}"] = n
    cache["r0"] = 10  # replacing a key keeps the size and the order
    assert list(cache) == ["r0", "r1", "r2"]
    cache["r3"] = 3
    assert list(cache.items()) == [("r1", 1), ("r2", 2), ("r3", 3)]
    with pytest.raises(ValueError):
        FifoCache(0)


def test_the_sql_store_keeps_at_most_the_limit_of_runs_parsed(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert RUN_CACHE_LIMIT >= 1000
    with SqliteStore(f"{tmp_path}/db.sqlite") as store:
        for cache in (store._nodes_cache, store._topologies, store._policies, store._run_routes):
            monkeypatch.setattr(cache, "limit", 2)
        nodes = [DagNode(slug="a", plugin="p")]
        for n in range(4):
            assert store.create_run(f"r{n}", nodes)
            assert store.get_run_node(f"r{n}", 0) == nodes[0]
            assert store.get_run_topology(f"r{n}") is not None
        assert list(store._nodes_cache) == ["r2", "r3"]
        assert list(store._topologies) == ["r2", "r3"]
        # An evicted run is read again when needed.
        assert store.get_run_node("r0", 0) == nodes[0]
        assert list(store._nodes_cache) == ["r3", "r0"]


def test_the_worker_keeps_the_most_recent_lineage_links(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's link cache forgets its oldest runs one by one (it used to
    drop every link at once when full, re-reading all active runs)."""
    assert LINKS_KEPT == RUN_CACHE_LIMIT
    reads: list[str] = []

    class Links:
        def get_run_link(self, run_id: str) -> RunLink | None:
            reads.append(run_id)
            return None

    with Engine(f"sqlite:///{tmp_path}/db.sqlite") as engine:
        links = engine.worker().run_links
        assert isinstance(links, FifoCache) and links.limit == LINKS_KEPT
        monkeypatch.setattr(links, "limit", 3)
        store = cast(DagChildStore, Links())
        batch = BatchReads(object(), {}, child_store=store, budget_store=None, links=links)  # type: ignore[arg-type]
        for run_id in ("r0", "r1", "r2", "r3", "r1"):
            batch.link(run_id)
        assert reads == ["r0", "r1", "r2", "r3"]  # r1 was still kept
        assert list(links) == ["r1", "r2", "r3"]
