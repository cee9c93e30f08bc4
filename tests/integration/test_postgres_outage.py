"""The PostgreSQL server stopped, restarted, full or refusing the login, as
one store object sees it.

The stop/start tests run on a cluster of their own (``pg_cluster``); the
shared test server is never stopped. While the server is down every call
fails within its reconnect timeout with a transient
``StoreUnavailableError`` that names the server and the cause; once the
server is back the same store object serves calls again, with no broken
connection left over from before.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from pg_cluster import Cluster, private_cluster
from psycopg.conninfo import conninfo_to_dict

from dagwerk.backends.errors import StoreCannotOpenError, StoreUnavailableError
from dagwerk.backends.postgres import PostgresStore
from dagwerk.constants import RunStatus
from dagwerk.runtime.faults import FaultKind, classify, describe_fault
from dagwerk.store import InvalidStoreValueError
from dagwerk.testing.helpers import chain, new_run, root

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses pg_ctl")

TIMEOUT = 2.0
# A call gives up after the reconnect timeout plus at most one connection
# attempt that began before it ran out (libpq's smallest timeout is 2 s).
BOUND = TIMEOUT + 3.0


@pytest.fixture
def cluster(postgres_url: str) -> Iterator[Cluster]:
    del postgres_url  # gates the test as the other PostgreSQL tests
    with private_cluster() as made:
        yield made


def _label() -> str:
    return f"dagwerk-outage-{uuid.uuid4().hex[:8]}"


def _backends(url: str, label: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (label,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _fails_fast(call: Callable[[], object], port: int) -> StoreUnavailableError:
    begun = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        call()
    assert time.monotonic() - begun < BOUND
    error = caught.value
    assert classify(error) is FaultKind.TRANSIENT
    assert error.code == "store_unavailable"
    assert error.target == f"127.0.0.1:{port}"
    assert "\n" not in str(error)
    # The worker's fault line is the message itself: its advice is the backend's.
    assert describe_fault(error) == str(error)
    return error


def test_calls_fail_typed_while_the_server_is_stopped_and_succeed_once_it_is_back(
    cluster: Cluster,
) -> None:
    store = PostgresStore(cluster.url, pool_size=2, reconnect_timeout=TIMEOUT)
    with store:
        new_run(store, chain(2))
        cluster.stop()
        calls: list[Callable[[], object]] = [
            lambda: store.get_run_status("run-1"),
            lambda: store.create_run("run-2", [root("a")]),
            lambda: store.claim_deliveries("w", limit=1, lease_seconds=30.0),
            lambda: store.dequeue("w", limit=1, lease_seconds=30.0, wait_seconds=0.5),
        ]
        for call in calls:
            error = _fails_fast(call, cluster.port)
            assert str(error) == (
                f"cannot connect to PostgreSQL at 127.0.0.1:{cluster.port}: the server "
                f"refused the connection (tried for {TIMEOUT:.1f}s); start the server and "
                "the run continues"
            )
        cluster.start()
        # Nothing of the refused calls was written.
        assert store.get_run_status("run-1") is RunStatus.RUNNING
        assert store.get_run_status("run-2") is None
        assert store.create_run("run-2", [root("a")])
        assert len(store.claim_deliveries("w", limit=5, lease_seconds=30.0)) == 1


def test_a_restart_with_open_connections_leaves_none_broken_in_the_pool(
    cluster: Cluster,
) -> None:
    label = _label()
    store = PostgresStore(
        cluster.url, pool_size=3, reconnect_timeout=TIMEOUT, application_name=label
    )
    with store:
        new_run(store, chain(2))
        # Three connections open at once: the pool holds three idle ones.
        barrier = threading.Barrier(3)

        def hold() -> None:
            with store._pg.read() as tx:  # the gateway is this backend's own hook
                tx.one("run_status", {"run_id": "run-1"})
                barrier.wait(10)

        threads = [threading.Thread(target=hold) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert _backends(cluster.url, label) == 3
        # A write in progress when the server restarts loses its connection:
        # it fails naming the restart, and nothing of it is applied.
        with pytest.raises(StoreUnavailableError) as caught, store._pg.write() as tx:
            tx.run("run_set_status", {"run_id": "run-1", "old": "running", "new": "cancelled"})
            cluster.restart()
            tx.one("run_get", {"run_id": "run-1"})
        assert classify(caught.value) is FaultKind.TRANSIENT
        message = str(caught.value)
        # The admin shutdown's message, or the closed socket, depending on
        # what the driver read first.
        assert message.startswith(
            f"lost the connection to PostgreSQL at 127.0.0.1:{cluster.port} (the server "
        ), message
        assert message.endswith("the transaction was rolled back: nothing of it was applied")
        # Every pooled connection died with the restart; each call after it
        # works on the same store, reads and writes alike.
        for _ in range(4):
            assert store.get_run_status("run-1") is RunStatus.RUNNING
            assert store.create_run(f"run-{uuid.uuid4().hex[:6]}", [root("a")])
        assert store.try_cancel_run("run-1")
        assert store.get_run_status("run-1") is RunStatus.CANCELLED
        assert _backends(cluster.url, label) <= 3


def _with_dbname(url: str, dbname: str) -> str:
    info = conninfo_to_dict(url)
    return f"postgresql://{info.get('user', '')}@{info['host']}:{info['port']}/{dbname}"


def test_a_missing_database_is_rejected_at_once_and_is_fatal(postgres_url: str) -> None:
    begun = time.monotonic()
    with pytest.raises(StoreCannotOpenError) as caught:
        PostgresStore(_with_dbname(postgres_url, "no_such_db_here"), reconnect_timeout=30.0)
    assert time.monotonic() - begun < 10  # not the reconnect timeout
    assert classify(caught.value) is FaultKind.FATAL
    assert caught.value.code == "store_cannot_open"
    assert str(caught.value).endswith(
        'database "no_such_db_here" does not exist; create the database or fix the store URL'
    )


@pytest.fixture
def limited_role(postgres_url: str) -> Iterator[str]:
    """A role that may hold one connection at a time."""
    role = f"lim_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1")
        conn.execute(f"GRANT ALL ON DATABASE {conninfo_to_dict(postgres_url)['dbname']} TO {role}")
    try:
        yield role
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_no_free_connection_slot_is_transient_and_clears_when_one_frees(
    postgres_url: str, pg_schema: str, limited_role: str
) -> None:
    info = conninfo_to_dict(postgres_url)
    url = f"postgresql://{limited_role}@{info['host']}:{info['port']}/{info['dbname']}"
    holder = psycopg.connect(url)
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            PostgresStore(url, schema=pg_schema, reconnect_timeout=1.0)
        assert classify(caught.value) is FaultKind.TRANSIENT
        assert "every connection slot is taken" in str(caught.value)
        assert "max_connections" in str(caught.value)
    finally:
        holder.close()
    with PostgresStore(url, schema=pg_schema, pool_size=1, reconnect_timeout=10.0) as store:
        assert store.create_run("run-1", [root("a")])


def test_the_reconnect_timeout_can_come_with_the_url() -> None:
    begun = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=r"\(tried for 0\.5s\)"):
        PostgresStore("postgresql://nobody@127.0.0.1:1/none?reconnect_timeout=0.5")
    assert time.monotonic() - begun < BOUND
    for wrong in ("0", "-1", "soon", "86401"):
        with pytest.raises(InvalidStoreValueError) as caught:
            PostgresStore(f"postgresql://nobody@127.0.0.1:1/none?reconnect_timeout={wrong}")
        assert caught.value.field == "reconnect_timeout"
    with pytest.raises(InvalidStoreValueError, match="differ"):
        PostgresStore("postgresql://127.0.0.1:1/none?reconnect_timeout=2", reconnect_timeout=3)


def test_the_open_timeout_bounds_the_wait_to_open() -> None:
    begun = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=r"\(tried for 0\.5s\)"):
        PostgresStore("postgresql://nobody@127.0.0.1:1/none", open_timeout=0.5)
    assert time.monotonic() - begun < BOUND
    for wrong in (0, -1, "soon", 86401, True):
        with pytest.raises(InvalidStoreValueError) as caught:
            PostgresStore("postgresql://nobody@127.0.0.1:1/none", open_timeout=wrong)  # type: ignore[arg-type]
        assert caught.value.field == "open_timeout"
