"""A chain step's completion and the child's launch in one transaction
(PostgreSQL, ``RunUnitStore``).

A completion that ends its task's launch commits with the launches its
reconcile makes, in one transaction that holds the run exclusively from its
first statement: one durable commit per step of a chain instead of two.
Other connections see both or neither; the run's claims wait for it; a
failure rolls both back and forgets the child claimed for the worker; a
completion that does not expect to end its launch leaves the run to other
claims as before. Through ``Engine``, a worker's chain steps take that path.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from pg_locks import until_waiting_for_a_lock

from dagwerk.backends.postgres import PostgresStore
from dagwerk.completions import complete_attempts
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.engine import Engine
from dagwerk.store import ClaimedDelivery, CompletionRequest, StoreContractError
from dagwerk.testing.helpers import chain, child, emit, new_run, root, tasks_of

RUN_ID = "run-1"


@pytest.fixture
def label() -> str:
    return f"dagwerk-units-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def stores(
    postgres_url: str, pg_schema: str, label: str
) -> Iterator[tuple[PostgresStore, PostgresStore]]:
    """The worker's store (its connections labelled) and another process's."""
    with (
        PostgresStore(postgres_url, schema=pg_schema, application_name=label) as mine,
        PostgresStore(postgres_url, schema=pg_schema) as other,
    ):
        yield mine, other


def _claimed_root(store: PostgresStore, steps: int = 3) -> tuple[Any, ClaimedDelivery]:
    log = new_run(store, chain(steps), RUN_ID)
    (entry,) = store.claim_deliveries("w", limit=1, lease_seconds=60.0)
    assert entry.task is not None
    return log, entry


def _request(entry: ClaimedDelivery, *, ends_launch: bool) -> CompletionRequest:
    return CompletionRequest(
        entry.delivery.task_id,
        entry.delivery.attempt_id,
        emit(f"out-{entry.delivery.node_index}", k=1),
        entry.delivery.delivery_id,
        entry.delivery.run_id,
        ends_launch=ends_launch,
    )


def _complete(
    store: PostgresStore, log: Any, entry: ClaimedDelivery, *, ends_launch: bool = True
) -> list[ClaimedDelivery]:
    """Complete ``entry`` as a worker does: announce the next claim, complete,
    claim; what the claim took."""
    taken: list[ClaimedDelivery] = []
    complete_attempts(
        store,
        "w",
        [_request(entry, ends_launch=ends_launch)],
        callbacks=log.callbacks,
        before=lambda: store.expect_claim("w", limit=1, lease_seconds=60.0),
        then=lambda: taken.extend(store.claim_deliveries("w", limit=1, lease_seconds=60.0)),
    )
    return taken


def _after_launch(
    monkeypatch: pytest.MonkeyPatch, store: PostgresStore, action: Callable[[], None]
) -> None:
    """Run ``action`` right after each launch ``store`` creates returns."""
    launch = store.try_create_node_launch

    def launched(*args: Any, **kwargs: Any) -> Any:
        result = launch(*args, **kwargs)
        action()
        return result

    monkeypatch.setattr(store, "try_create_node_launch", launched)


def test_the_completion_and_the_childs_launch_are_seen_together(
    stores: tuple[PostgresStore, PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, other = stores
    log, entry = _claimed_root(mine)
    seen: list[tuple[TaskStatus, int]] = []

    def look() -> None:
        (root_task,) = tasks_of(other, RUN_ID, 0)
        seen.append((root_task.status, len(tasks_of(other, RUN_ID, 1))))

    _after_launch(monkeypatch, mine, look)
    (child,) = _complete(mine, log, entry)
    # Right after the launch, before the commit: neither is visible yet.
    assert seen == [(TaskStatus.RUNNING, 0)]
    look()
    assert seen[-1] == (TaskStatus.COMPLETED, 1)
    # The child was inserted claimed for the worker and handed over.
    assert child.delivery.node_index == 1 and child.alone
    assert child.task is not None and child.task.status is TaskStatus.RUNNING


def test_the_run_is_held_until_the_step_commits(
    stores: tuple[PostgresStore, PostgresStore],
    monkeypatch: pytest.MonkeyPatch,
    postgres_url: str,
    pg_schema: str,
    label: str,
) -> None:
    mine, _ = stores
    # Two roots: "a" claimed by the worker, "b" QUEUED for another one.
    log = new_run(mine, [root("a"), root("b"), child("c", "a")], RUN_ID)
    (entry,) = mine.claim_deliveries("w", limit=1, lease_seconds=60.0)
    assert entry.delivery.node_index == 0
    outcome: list[object] = []
    with PostgresStore(postgres_url, schema=pg_schema, application_name=label) as third:

        def claim_beside() -> None:
            # Another worker's claim of the run's other root waits for the unit.
            thread = threading.Thread(
                target=lambda: outcome.append(
                    third.claim_deliveries("x", limit=1, lease_seconds=60.0)
                ),
                daemon=True,
            )
            thread.start()
            until_waiting_for_a_lock(postgres_url, label, "the other worker's claim")
            assert thread.is_alive() and outcome == []
            claims.append(thread)

        claims: list[threading.Thread] = []
        _after_launch(monkeypatch, mine, claim_beside)
        complete_attempts(mine, "w", [_request(entry, ends_launch=True)], callbacks=log.callbacks)
        (thread,) = claims
        thread.join(20)
        assert not thread.is_alive()
    (taken,) = outcome
    assert isinstance(taken, list) and [c.delivery.node_index for c in taken] == [1]
    assert taken[0].task is not None  # claimed once the unit committed


def test_a_failed_launch_rolls_the_completion_back_and_forgets_the_claimed_child(
    stores: tuple[PostgresStore, PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, other = stores
    log, entry = _claimed_root(mine)

    def fail() -> None:
        raise RuntimeError("the reconcile broke")

    launch = mine.try_create_node_launch
    _after_launch(monkeypatch, mine, fail)
    with pytest.raises(RuntimeError, match="the reconcile broke"):
        _complete(mine, log, entry)
    (root_task,) = tasks_of(other, RUN_ID, 0)
    assert root_task.status is TaskStatus.RUNNING
    assert tasks_of(other, RUN_ID, 1) == []
    # The child the rolled-back launch claimed for "w" is not handed over.
    assert mine.claim_deliveries("w", limit=1, lease_seconds=60.0) == []
    # The worker's retry of the completion goes through.
    monkeypatch.setattr(mine, "try_create_node_launch", launch)
    (child,) = _complete(mine, log, entry)
    assert child.delivery.node_index == 1
    assert tasks_of(other, RUN_ID, 0)[0].status is TaskStatus.COMPLETED


def test_a_completion_that_does_not_end_its_launch_leaves_claims_free(
    stores: tuple[PostgresStore, PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, other = stores
    log, entry = _claimed_root(mine)
    seen: list[TaskStatus] = []
    _after_launch(monkeypatch, mine, lambda: seen.append(tasks_of(other, RUN_ID, 0)[0].status))
    (child,) = _complete(mine, log, entry, ends_launch=False)
    # Committed on its own before the launch, as without units.
    assert seen == [TaskStatus.COMPLETED]
    assert child.delivery.node_index == 1


def test_a_unit_is_all_or_nothing(stores: tuple[PostgresStore, PostgresStore]) -> None:
    mine, other = stores
    new_run(mine, chain(2), RUN_ID)
    ran: list[str] = []
    with pytest.raises(StoreContractError, match="rolls back"), mine.run_unit():
        assert mine.try_start_run(RUN_ID)
        with mine._gw.write() as tx:
            tx.run("run_set_status", {"run_id": RUN_ID, "old": "running", "new": "pending"})
        assert mine._gw.after_commit(lambda: ran.append("after"))
        with pytest.raises(ValueError, match="a call of the unit failed"), mine._gw.write():
            raise ValueError("a call of the unit failed")
        # Swallowed: the unit is doomed all the same.
        with pytest.raises(StoreContractError, match="rolls back"):
            mine.get_run_status(RUN_ID)
    assert other.get_run_status(RUN_ID) is RunStatus.RUNNING
    assert ran == []
    with mine.run_unit():
        with mine._gw.write() as tx:
            tx.run("run_set_status", {"run_id": RUN_ID, "old": "running", "new": "pending"})
        # Reads in the unit see its writes; others see them after the commit.
        assert mine.get_run_status(RUN_ID) is RunStatus.PENDING
        assert other.get_run_status(RUN_ID) is RunStatus.RUNNING
        assert mine._gw.after_commit(lambda: ran.append("after"))
        assert ran == []
    assert ran == ["after"]
    assert other.get_run_status(RUN_ID) is RunStatus.PENDING


STEPS = 5


def test_a_workers_chain_steps_commit_with_their_launches(
    postgres_url: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    units: list[int] = []
    unit = PostgresStore.run_unit

    def counted(self: PostgresStore) -> AbstractContextManager[None]:
        units.append(1)
        return unit(self)

    monkeypatch.setattr(PostgresStore, "run_unit", counted)
    url = f"{postgres_url}{'&' if '?' in postgres_url else '?'}schema={pg_schema}"
    with Engine(url, execution_root=tmp_path) as engine:
        for n in range(STEPS):  # chain() names each plugin after its node
            engine.plugin(f"n{n}")(lambda inputs, ctx: [{"n": 1}])
        run_id = engine.submit(chain(STEPS))
        worker = engine.worker(concurrency=1)
        worker.run_until_idle()
        worker.stop()
        assert engine.store.get_run_status(run_id) is RunStatus.COMPLETED
    # Every step, each its launch's only task, ends its launch in a unit
    # with the next step's launch (the last with the run's end).
    assert len(units) == STEPS


def test_a_units_write_mark_moves_with_each_write_only(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    """What the store's reads-in-this-transaction shortcuts key on: the mark
    holds across reads and changes with each write that ends."""
    mine, _ = stores
    new_run(mine, chain(2), RUN_ID)
    gateway = mine._gw
    assert gateway.write_mark() is None
    with mine.run_unit():
        assert gateway.write_mark() is None  # nothing written yet
        with gateway.write() as tx:
            tx.run("run_set_status", {"run_id": RUN_ID, "old": "running", "new": "running"})
        first = gateway.write_mark()
        assert first is not None
        assert mine.get_run_status(RUN_ID) is RunStatus.RUNNING
        assert gateway.write_mark() == first
        with gateway.write() as tx:
            tx.run("run_set_status", {"run_id": RUN_ID, "old": "running", "new": "running"})
        assert gateway.write_mark() not in (None, first)
    assert gateway.write_mark() is None
    with mine.run_unit():
        with gateway.write() as tx:
            tx.run("run_set_status", {"run_id": RUN_ID, "old": "running", "new": "running"})
        assert gateway.write_mark() != first  # another unit's marks never repeat
