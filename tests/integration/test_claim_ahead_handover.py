"""A worker whose completion launched and claimed its next task, with
nothing else available, starts that task without reading the queue again:
a chain's hop on one worker makes no lease of its own (SQLite and
PostgreSQL, through ``Engine``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dagwerk.backends.postgres import gateway as pg_gateway
from dagwerk.backends.sqlite import gateway as sqlite_gateway
from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.testing.helpers import chain

STEPS = 6
LEASES = {"queue_lease", "queue_lease_next"}


@pytest.fixture
def names(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The named statements each gateway ran (PostgreSQL: per call, each
    query of a flight of several counted)."""
    seen: Counter[str] = Counter()
    sqlite_execute = sqlite_gateway._Tx._execute
    pg_call = pg_gateway.PostgresTx._call

    def on_sqlite(self: Any, name: str, params: Any) -> Any:
        seen[name] += 1
        return sqlite_execute(self, name, params)

    def on_postgres(self: Any, kind: str, name: str, params: Any, rows: Any = None) -> Any:
        if kind in ("all_of", "all_of_commit"):  # several queries in one flight
            seen.update(query for query, _ in rows)
        else:
            seen[name] += 1
        return pg_call(self, kind, name, params, rows)

    monkeypatch.setattr(sqlite_gateway._Tx, "_execute", on_sqlite)
    monkeypatch.setattr(pg_gateway.PostgresTx, "_call", on_postgres)
    return seen


def test_a_chains_hops_on_one_worker_lease_nothing(
    database_url: str, names: Counter[str], tmp_path: Path
) -> None:
    with Engine(database_url, execution_root=tmp_path) as engine:
        for n in range(STEPS):  # chain() names each plugin after its node
            engine.plugin(f"n{n}")(lambda inputs, ctx: [{"n": 1}])
        run_id = engine.submit(chain(STEPS))
        worker = engine.worker(concurrency=1)
        # The root, timed: from its completion on, the claim ahead applies.
        assert worker.process_once() == 1
        names.clear()
        for _ in range(STEPS - 2):  # the hops between the first and the last node
            assert worker.process_once() == 1
        hops = STEPS - 2
        leases = sum(count for name, count in names.items() if name in LEASES)
        assert leases == 0, names
        # One look at the queue per hop: the launch's, at what else is available.
        assert names["queue_candidates"] == hops, names
        worker.run_until_idle()
        worker.stop()
        assert engine.store.get_run_status(run_id) is RunStatus.COMPLETED
