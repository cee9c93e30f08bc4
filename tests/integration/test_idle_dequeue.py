"""An idle worker's waiting dequeue: it looks at the queue when woken, when
a row becomes due and at its deadline, not at every poll of the database."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from dagwerk.backends.sql import _queue
from dagwerk.cli import cli
from dagwerk.cli.commands_run import WORKER_IDLE_WAIT
from dagwerk.engine import Engine, open_store
from dagwerk.testing.helpers import chain, new_run

pytestmark = pytest.mark.parametrize("database_url", ["sqlite", "postgres"], indirect=True)


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The times (``time.monotonic``) at which SQL stores leased, or tried to."""
    times: list[float] = []
    lease = _queue.QueueMixin._lease

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        times.append(time.monotonic())
        return lease(self, *args, **kwargs)

    monkeypatch.setattr(_queue.QueueMixin, "_lease", counted)
    yield times


def test_an_empty_queue_is_looked_at_when_the_wait_begins_and_at_its_end(
    database_url: str, looks: list[float]
) -> None:
    with open_store(database_url) as store:
        # The first wait of a PostgreSQL store starts listening and looks
        # again at once: work queued before it was announced to no one.
        assert store.claim_deliveries("w", limit=1, lease_seconds=60.0, wait_seconds=0.2) == []
        looks.clear()
        began = time.monotonic()
        assert store.claim_deliveries("w", limit=1, lease_seconds=60.0, wait_seconds=1.0) == []
        waited = time.monotonic() - began
    assert waited >= 1.0
    # A poll of the database every 50 ms looked twenty times.
    assert len(looks) == 2, [round(t - began, 3) for t in looks]


def test_a_long_wait_ends_when_a_row_becomes_due(database_url: str, looks: list[float]) -> None:
    with open_store(database_url) as store:
        new_run(store, chain(1))
        (first,) = store.claim_deliveries("w", limit=1, lease_seconds=60.0)
        assert store.nack(first.delivery.delivery_id, "w", delay=0.5)
        assert store.claim_deliveries("w", limit=1, lease_seconds=60.0, wait_seconds=0.2) == []
        looks.clear()
        began = time.monotonic()
        (again,) = store.claim_deliveries("w", limit=1, lease_seconds=60.0, wait_seconds=30.0)
        waited = time.monotonic() - began
    assert again.delivery.delivery_id == first.delivery.delivery_id
    # Due 0.3 s after this wait began, less the warm-up wait above.
    assert waited < 10.0, waited
    assert len(looks) <= 3, [round(t - began, 3) for t in looks]


def test_dagwerk_worker_waits_long_between_looks_at_an_empty_queue(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dagwerk worker`` builds its worker with the long idle wait (new work
    wakes it; the engine's default is a short one, for in-process runs)."""
    built: list[dict[str, Any]] = []

    def worker(self: Engine, *args: Any, **options: Any) -> Any:
        built.append(options)
        raise RuntimeError("built")

    monkeypatch.setattr(Engine, "worker", worker)
    result = CliRunner().invoke(cli, ["worker", "--db", database_url])
    assert result.exit_code != 0 and "built" in result.output, result.output
    (options,) = built
    with Engine(database_url) as engine:
        assert options["idle_wait"] == WORKER_IDLE_WAIT > engine.poll_interval
