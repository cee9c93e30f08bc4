"""Lock order of a lineage on PostgreSQL: a finishing child against a stop of
its parent.

A child that finishes resumes its waiting parent task in the same
transaction, so it needs the parent's run row after its own; a cancelled
parent cancels its children in its transaction, so it needs the child's run
row after its own. Locked in those orders the two would deadlock. Every
run-row lock prelude therefore locks the lineage's root run first, so both
serialise on the root before either holds a second run row.

The first test holds the parent row in a separate connection (as the
cancel does), lets the child's finalisation block, and only then locks the
child row (as the cancel does next): with the old order PostgreSQL detects
a deadlock and aborts one side; now both finish. The second test races the
real operations many times.
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
from dagwerk.lineage import RunLink, child_lineage, child_wait_id, encode_lineage
from dagwerk.orchestrator import cancel_run, on_task_complete, start_run
from dagwerk.testing.helpers import CallbackLog, claim, emit, new_run, only_task, root


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = f"lineage_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _waiting_parent(store: PostgresStore) -> str:
    """A RUNNING parent whose only task waits for the RUNNING child ``kid``,
    whose only task is claimed; the child task's ID."""
    new_run(store, [root("p")], "parent")
    parent_task = only_task(store, "parent", 0)
    claim(store, parent_task)
    lineage = child_lineage(
        None,
        parent_run_id="parent",
        parent_task_id=parent_task.task_id,
        parent_pipeline_id="p",
        pipeline_id="kid",
    )
    link = RunLink(
        run_id="kid",
        parent_run_id="parent",
        parent_task_id=parent_task.task_id,
        root_run_id="parent",
        lineage=encode_lineage(lineage),
        wait_id=child_wait_id("kid"),
    )
    assert store.try_wait_for_child(
        parent_task.task_id,
        expected_attempt_id=parent_task.attempt_id,
        expected_generation=parent_task.generation,
        nodes=[root("leaf")],
        link=link,
    )
    start_run(store, "kid", callbacks=CallbackLog().callbacks)
    kid_task = only_task(store, "kid", 0)
    claim(store, kid_task)
    return kid_task.task_id


def test_finishing_child_does_not_deadlock_with_a_cancel_of_its_parent(
    postgres_url: str, schema: str
) -> None:
    label = f"dagwerk-lineage-{uuid.uuid4().hex[:8]}"
    store = PostgresStore(postgres_url, schema=schema, application_name=label, pool_size=2)
    outcome: list[object] = []
    try:
        kid_task = _waiting_parent(store)
        record = store.get_task(kid_task)
        assert record is not None
        # The child's task completes; the run's finalisation is still to come.
        assert store.try_complete_task(kid_task, emit("o1"), expected_attempt_id=record.attempt_id)
        with psycopg.connect(
            postgres_url, options=f"-c search_path={schema}", autocommit=False
        ) as stopper:
            # The cancel's first step: the parent's run row.
            stopper.execute("SELECT 1 FROM dagwerk_runs WHERE run_id = 'parent' FOR NO KEY UPDATE")

            def finish() -> None:
                try:
                    outcome.append(store.try_finalize_run("kid", RunStatus.COMPLETED))
                except Exception as exc:  # reported to the test thread below
                    outcome.append(exc)

            thread = threading.Thread(target=finish)
            thread.start()
            until_waiting_for_a_lock(postgres_url, label, "the child's finalisation")
            # The cancel's next step: the child's run row. A finalisation that
            # already held it here would deadlock with this statement.
            stopper.execute("SET LOCAL lock_timeout = '10s'")
            stopper.execute("SELECT 1 FROM dagwerk_runs WHERE run_id = 'kid' FOR NO KEY UPDATE")
            stopper.commit()
            thread.join(30)
        assert not thread.is_alive()
        assert outcome == [True], outcome
        assert store.get_run_status("kid") is RunStatus.COMPLETED
        parent_task = only_task(store, "parent", 0)
        assert parent_task.status is TaskStatus.QUEUED
        assert parent_task.resumed_from_wait_id == child_wait_id("kid")
    finally:
        store.close()


def _race_once(url: str, schema: str) -> None:
    store = PostgresStore(url, schema=schema, pool_size=2)
    other = PostgresStore(url, schema=schema, pool_size=2)
    errors: list[BaseException] = []
    start = threading.Barrier(2)
    try:
        kid_task = _waiting_parent(store)
        record = store.get_task(kid_task)
        assert record is not None

        def complete() -> None:
            start.wait()
            try:
                on_task_complete(
                    store,
                    task_id=kid_task,
                    expected_attempt_id=record.attempt_id,
                    outputs=emit("o1"),
                    callbacks=CallbackLog().callbacks,
                )
            except BaseException as exc:  # reported below
                errors.append(exc)

        def cancel() -> None:
            start.wait()
            try:
                cancel_run(other, "parent", callbacks=CallbackLog().callbacks)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=complete), threading.Thread(target=cancel)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert store.get_run_status("parent") is RunStatus.CANCELLED
        assert store.get_run_status("kid") in (RunStatus.COMPLETED, RunStatus.CANCELLED)
    finally:
        other.close()
        store.close()


def test_child_completion_and_parent_cancel_racing_both_finish(
    postgres_url: str, schema: str
) -> None:
    """The real operations, many times over: the child's last task completes
    (finalising the child and resuming the parent) while the parent is
    cancelled (cancelling the child); neither fails with a deadlock."""
    for round_ in range(15):
        round_schema = f"{schema}_{round_}"
        try:
            _race_once(postgres_url, round_schema)
        finally:
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{round_schema}" CASCADE')
