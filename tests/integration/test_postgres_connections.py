"""Lost connections and LISTEN/NOTIFY against a real PostgreSQL server.

A connection is "lost" by ``pg_terminate_backend`` from a separate admin
connection, which is what a server restart or a network cut looks like to
the client. Each store labels its connections with a unique
``application_name`` so the test kills only its own.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Generator, Iterator
from typing import Any

import psycopg
import pytest

from dagwerk.backends.errors import StoreUnavailableError
from dagwerk.backends.postgres import PostgresStore
from dagwerk.constants import RunStatus
from dagwerk.runtime.faults import FaultKind, classify
from dagwerk.testing.helpers import chain, new_run, root


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = f"conn_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _open(url: str, schema: str) -> tuple[PostgresStore, str]:
    label = f"dagwerk-test-{uuid.uuid4().hex[:8]}"
    return PostgresStore(url, schema=schema, application_name=label, pool_size=2), label


def _kill(url: str, label: str) -> int:
    """Terminate every server backend of ``label``; how many there were."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (label,),
        ).fetchall()
    return len(rows)


def test_reads_and_writes_survive_connections_lost_between_calls(
    postgres_url: str, schema: str
) -> None:
    store, label = _open(postgres_url, schema)
    with store:
        new_run(store, chain(2))
        assert _kill(postgres_url, label) >= 1
        # A pooled connection found dead when a transaction begins ran none
        # of it, so it is replaced, for reads and writes alike.
        assert store.get_run_status("run-1") is RunStatus.RUNNING
        assert _kill(postgres_url, label) >= 1
        assert store.create_run("run-2", [root("a")])
        assert store.get_run_status("run-2") is RunStatus.PENDING


def test_read_replays_on_a_new_snapshot_after_a_lost_connection(
    postgres_url: str, schema: str
) -> None:
    store, label = _open(postgres_url, schema)
    with store:
        new_run(store, chain(2))
        gateway = store._pg  # the gateway is this backend's own hook object
        with gateway.read() as tx:
            first = tx.one("run_status", {"run_id": "run-1"})
            _kill(postgres_url, label)
            # The read moves to a new connection, repeats the first statement
            # (same answer) and goes on.
            again = tx.one("run_status", {"run_id": "run-1"})
            assert first == again
            assert tx.all("tasks_of_run", {"run_id": "run-1", "all": 1})


def test_read_fails_clearly_when_the_data_moved_while_reconnecting(
    postgres_url: str, schema: str
) -> None:
    store, label = _open(postgres_url, schema)
    other, _ = _open(postgres_url, schema)
    with store, other:
        new_run(store, chain(2))
        moved = "changed before it could be repeated"
        with pytest.raises(StoreUnavailableError, match=moved), store._pg.read() as tx:
            tx.one("run_status", {"run_id": "run-1"})
            assert other.try_cancel_run("run-1")
            _kill(postgres_url, label)
            tx.one("run_status", {"run_id": "run-1"})


def test_write_that_loses_its_connection_fails_clearly_and_writes_nothing(
    postgres_url: str, schema: str
) -> None:
    store, label = _open(postgres_url, schema)
    with store:
        new_run(store, chain(2))
        with pytest.raises(StoreUnavailableError) as caught, store._pg.write() as tx:
            tx.run("run_set_status", {"run_id": "run-1", "old": "running", "new": "cancelled"})
            _kill(postgres_url, label)
            tx.one("run_get", {"run_id": "run-1"})
        assert caught.value.code == "store_unavailable"
        assert store.get_run_status("run-1") is RunStatus.RUNNING


def test_a_refusing_server_is_waited_for_then_store_unavailable_naming_the_cause() -> None:
    # Nothing listens on port 1: a server that is restarting looks like this,
    # so opening keeps trying for the reconnect timeout.
    begun = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        PostgresStore("postgresql://nobody@127.0.0.1:1/none", reconnect_timeout=1.0)
    assert time.monotonic() - begun >= 0.9
    assert classify(caught.value) is FaultKind.TRANSIENT
    assert str(caught.value) == (
        "cannot connect to PostgreSQL at 127.0.0.1:1: the server refused the connection "
        "(tried for 1.0s); start the server and the run continues"
    )


def test_enqueue_wakes_a_worker_waiting_in_dequeue(postgres_url: str, schema: str) -> None:
    waiting, _ = _open(postgres_url, schema)
    producer, _ = _open(postgres_url, schema)
    with waiting, producer:
        assert waiting.dequeue("w", limit=1, lease_seconds=30.0) == []
        assert waiting.wait_for_work(0.0)  # the first call starts listening
        got: list[object] = []
        started = threading.Event()

        def consume() -> None:
            started.set()
            got.extend(waiting.dequeue("w", limit=1, lease_seconds=30.0, wait_seconds=30.0))

        thread = threading.Thread(target=consume)
        thread.start()
        assert started.wait(10)
        begun = time.monotonic()
        new_run(producer, [root("a")])
        thread.join(30)
        # Without the notification the dequeue would have waited 30 s.
        assert len(got) == 1
        assert time.monotonic() - begun < 15


def test_notifications_of_another_schema_do_not_wake(postgres_url: str, schema: str) -> None:
    other_schema = f"{schema}_other"
    waiting, _ = _open(postgres_url, schema)
    elsewhere, _ = _open(postgres_url, other_schema)
    try:
        with waiting, elsewhere:
            assert waiting.wait_for_work(0.0)
            new_run(elsewhere, [root("a")])
            assert waiting.wait_for_work(0.5) is False
            new_run(waiting, [root("a")])
            assert waiting.wait_for_work(10.0) is True
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{other_schema}" CASCADE')


def test_an_idle_wait_blocks_in_the_kernel_not_in_a_polling_loop(
    postgres_url: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timed wait that receives nothing reads the listening connection a
    bounded number of times. psycopg's own timed wait polls in whole
    milliseconds and, once less than one is left, polls again at once until
    the deadline: hundreds of reads (~1 ms of CPU) per idle wait."""
    from psycopg import connection

    reads = 0
    original = vars(connection)["notifies"]  # psycopg.generators.notifies, as imported there

    def counted(pgconn: Any) -> Generator[Any, Any, Any]:
        nonlocal reads
        generator = original(pgconn)
        ready: Any = None
        try:
            while True:
                reads += 1
                ready = yield generator.send(ready)
        except StopIteration as stop:
            return stop.value

    waiting, _ = _open(postgres_url, schema)
    with waiting:
        assert waiting.wait_for_work(0.0)
        monkeypatch.setattr(connection, "notifies", counted)
        assert waiting.wait_for_work(0.2) is False
        assert 0 < reads <= 10
        new_run(waiting, [root("a")])
        assert waiting.wait_for_work(10.0) is True
