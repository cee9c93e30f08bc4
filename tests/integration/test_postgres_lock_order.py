"""Lock order of the dead-letter path against a stop of the same run (PostgreSQL).

A stop (cancel, finish) of a run locks the run row and then deletes the run's
queue rows. A dequeue that finds a row past ``max_deliveries`` must crash its
task, which needs the run row. If the dequeue held the queue row while it
waited for the run row, the two would deadlock; the dequeue therefore buries
such rows in a transaction of their own that locks the run row first.

The test holds the run row in a separate connection (as the stop does), lets
the dequeue block on it, and only then deletes the queue rows, as the stop
does next: with the old order PostgreSQL detects a deadlock and aborts one
side; now both finish.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from pg_locks import until_waiting_for_a_lock

from dagwerk.backends.postgres import PostgresStore
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.orchestrator import cancel_run
from dagwerk.store import LeasedDelivery
from dagwerk.testing.helpers import CallbackLog, new_run, root, tasks_of

RUN_ID = "run-1"


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = f"lock_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _spent_run(url: str, schema: str, label: str) -> tuple[PostgresStore, _Clock]:
    """A running run whose only queue row has used up its one delivery."""
    clock = _Clock()
    store = PostgresStore(
        url, schema=schema, max_deliveries=1, clock=clock, application_name=label, pool_size=2
    )
    new_run(store, [root("src")], RUN_ID)
    (first,) = store.dequeue("w1", limit=1, lease_seconds=10.0)
    assert first.delivery_count == 1
    clock.now += 60.0  # the lease expires: the row is deliverable and spent
    return store, clock


def test_dead_letter_path_does_not_deadlock_with_a_stop_of_the_run(
    postgres_url: str, schema: str
) -> None:
    label = f"dagwerk-lock-{uuid.uuid4().hex[:8]}"
    store, _ = _spent_run(postgres_url, schema, label)
    outcome: list[object] = []
    try:
        with psycopg.connect(
            postgres_url, options=f"-c search_path={schema}", autocommit=False
        ) as stopper:
            # The stop's first step: the run row.
            stopper.execute(
                "SELECT 1 FROM dagwerk_runs WHERE run_id = %s FOR NO KEY UPDATE", (RUN_ID,)
            )

            def dequeue() -> None:
                try:
                    outcome.append(store.dequeue("w2", limit=1, lease_seconds=10.0))
                except Exception as exc:  # reported to the test thread below
                    outcome.append(exc)

            thread = threading.Thread(target=dequeue)
            thread.start()
            until_waiting_for_a_lock(postgres_url, label, "the dequeue")
            # The stop's next step: the run's queue rows. A dequeue that still
            # held the row here would deadlock with this statement.
            stopper.execute("SET LOCAL lock_timeout = '10s'")
            deleted = stopper.execute(
                "DELETE FROM dagwerk_deliveries WHERE run_id = %s", (RUN_ID,)
            ).rowcount
            stopper.commit()
            thread.join(30)
        assert not thread.is_alive()
        assert deleted == 1
        assert outcome == [[]], outcome
        # The stop deleted the row first: nothing was buried or crashed.
        assert store.list_dead_letters() == []
        assert store.take_dead_lettered() == []
        assert tasks_of(store, RUN_ID, 0)[0].status is TaskStatus.QUEUED
    finally:
        store.close()


def _race_once(url: str, schema: str) -> None:
    label = f"dagwerk-race-{uuid.uuid4().hex[:8]}"
    store, _ = _spent_run(url, schema, label)
    other = PostgresStore(url, schema=schema, max_deliveries=1, pool_size=2)
    errors: list[BaseException] = []
    leased: list[list[LeasedDelivery]] = []
    start = threading.Barrier(2)

    def bury() -> None:
        start.wait()
        try:
            leased.append(store.dequeue("w2", limit=1, lease_seconds=10.0))
        except BaseException as exc:  # reported below
            errors.append(exc)

    def cancel() -> None:
        start.wait()
        try:
            cancel_run(other, RUN_ID, callbacks=CallbackLog().callbacks)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=bury), threading.Thread(target=cancel)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert leased == [[]]
        assert store.get_run_status(RUN_ID) is RunStatus.CANCELLED
        assert store.list_deliveries() == []
    finally:
        other.close()
        store.close()


def test_dequeue_burying_and_cancel_racing_on_one_run_both_finish(
    postgres_url: str, schema: str
) -> None:
    """The real operations, many times over: a cancel of the run and a dequeue
    that buries its spent row run at once; neither fails, and the run ends
    cancelled with its queue empty whichever went first."""
    for round_ in range(15):
        round_schema = f"{schema}_{round_}"
        try:
            _race_once(postgres_url, round_schema)
        finally:
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{round_schema}" CASCADE')
