"""On PostgreSQL only queue rows another worker could claim wake idle workers.

A launch that claims its child for the launching worker inserts the child's
delivery already leased; a notification for it would cost every other idle
worker an empty lease attempt. A second connection LISTENs on the work
channel while rows are inserted, each insert in its own transaction and
followed by a marker notification, so the order of what arrives shows which
insert notified. A leased row whose lease runs out is still found by a
waiting dequeue without any notification.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from pg_workers import open_store, schema_url

from dagwerk.backends.postgres import PostgresStore
from dagwerk.orchestrator import OrchestratorCallbacks, start_run
from dagwerk.testing.helpers import root

CHANNEL = "dagwerk_work"


def _noop(run_id: str) -> None:
    del run_id


@pytest.fixture
def queued(postgres_url: str) -> Iterator[tuple[str, PostgresStore, str]]:
    """A store with one run started: its URL, the store and the root's delivery id."""
    with schema_url(postgres_url, "claimable") as url:
        store = open_store(url)
        try:
            assert store.create_run("run-1", [root("src")])
            start_run(store, "run-1", callbacks=OrchestratorCallbacks(_noop, _noop, _noop, _noop))
            (delivery,) = store.list_deliveries()
            yield url, store, delivery.delivery_id
        finally:
            store.close()


def _copy(
    conn: psycopg.Connection[tuple[object, ...]],
    source: str,
    *,
    owner: str | None,
    available_at: float,
) -> None:
    """Insert, in its own transaction, a delivery of ``source``'s attempt,
    leased to ``owner`` until ``available_at`` (unleased when ``owner`` is None)."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO dagwerk_deliveries (delivery_id, task_id, attempt_id, generation, run_id,"
            " node_index, launch_id, queue, priority, available_at, delivery_count, lease_owner,"
            " lease_expires_at)"
            " SELECT %s, task_id, attempt_id, generation, run_id, node_index, launch_id, queue,"
            " priority, %s, %s, %s, %s FROM dagwerk_deliveries WHERE delivery_id = %s",
            (
                uuid.uuid4().hex,
                available_at,
                0 if owner is None else 1,
                owner,
                None if owner is None else available_at,
                source,
            ),
        )


def _mark(conn: psycopg.Connection[tuple[object, ...]], label: str) -> None:
    with conn.transaction():
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, label))


def test_only_unleased_inserts_notify(queued: tuple[str, PostgresStore, str]) -> None:
    url, _, source = queued
    with (
        psycopg.connect(url, autocommit=True) as listener,
        psycopg.connect(url, autocommit=True) as writer,
    ):
        schema = writer.execute("SELECT current_schema()").fetchone()
        assert schema is not None
        listener.execute(f"LISTEN {CHANNEL}")
        later = time.time() + 60.0
        _copy(writer, source, owner="worker-a", available_at=later)
        _mark(writer, "after-leased")
        _copy(writer, source, owner=None, available_at=time.time())
        _mark(writer, "after-unleased")
        # One statement inserting a leased and an unleased row notifies once.
        with writer.transaction():
            writer.execute(
                "INSERT INTO dagwerk_deliveries (delivery_id, task_id, attempt_id, generation,"
                " run_id, node_index, launch_id, queue, priority, available_at, delivery_count,"
                " lease_owner, lease_expires_at)"
                " SELECT md5(random()::text || o.owner), task_id, attempt_id, generation, run_id,"
                " node_index, launch_id, queue, priority, %s, 1, NULLIF(o.owner, ''),"
                " CASE o.owner WHEN '' THEN NULL ELSE %s END"
                " FROM dagwerk_deliveries, (VALUES ('worker-a'), ('')) AS o (owner)"
                " WHERE delivery_id = %s",
                (later, later, source),
            )
        _mark(writer, "after-mixed")
        payloads: list[str] = []
        deadline = time.monotonic() + 30.0
        while "after-mixed" not in payloads:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"the marker notifications, got {payloads}"
            payloads += [n.payload for n in listener.notifies(timeout=remaining, stop_after=1)]
    assert payloads == ["after-leased", schema[0], "after-unleased", schema[0], "after-mixed"]


def test_an_expired_lease_of_an_inserted_row_is_found_by_the_waiting_dequeue(
    queued: tuple[str, PostgresStore, str],
) -> None:
    url, store, source = queued
    # The root's own delivery is leased away for the whole test.
    (held,) = store.dequeue("holder", limit=1, lease_seconds=120.0)
    assert held.delivery_id == source
    with psycopg.connect(url, autocommit=True) as writer:
        _copy(writer, source, owner="gone-worker", available_at=time.time() + 1.0)
    assert store.dequeue("idle", limit=1, lease_seconds=30.0) == []
    found = store.dequeue("idle", limit=1, lease_seconds=30.0, wait_seconds=3.0)
    assert [d.delivery_id for d in found] != []
    assert found[0].delivery_id != source
