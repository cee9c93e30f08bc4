"""Contract tests: schedules, tick records and idempotency keys
(:class:`~dagwerk.store.ScheduleStore`, :class:`~dagwerk.store.IdempotentSubmitStore`).

Stores are built through the backend's ``make_store(**settings)`` fixture with
the fake ``queue_clock`` of :mod:`dagwerk.testing.contract_queue`.
"""

from __future__ import annotations

import threading
from typing import Protocol

import pytest

from dagwerk.constants import FailurePolicy, RunStatus
from dagwerk.scheduling.definitions import FireSource, ScheduleDefinition
from dagwerk.store import (
    BackstopStore,
    IdempotentSubmitStore,
    InvalidStoreValueError,
    NewRun,
    ScheduleStore,
)
from dagwerk.testing.contract_queue import FakeClock, QueueContractStore
from dagwerk.testing.helpers import root

__all__ = [
    "test_sc_c01_a_schedule_is_stored_once_per_name_and_replaced_in_place",
    "test_sc_c02_pause_and_resume_move_the_cursor_to_the_resume_time",
    "test_sc_c03_a_tick_is_recorded_with_its_run_exactly_once",
    "test_sc_c04_a_refused_run_records_no_tick",
    "test_sc_c05_concurrent_fires_of_one_tick_create_one_run",
    "test_sc_c06_fires_are_listed_newest_first_with_filters",
    "test_sc_c07_delete_drops_the_schedule_and_its_records_not_its_runs",
    "test_sc_c08_the_cursor_only_moves_forward",
    "test_sc_c09_a_live_lease_is_readable",
    "test_sc_c10_an_idempotency_key_creates_one_run_until_it_expires",
    "test_sc_c11_concurrent_submits_with_one_key_create_one_run",
]


class ScheduleContractStore(
    QueueContractStore, ScheduleStore, IdempotentSubmitStore, BackstopStore, Protocol
):
    """A contract-suite store with schedules, idempotency keys and leases."""


def _store(qstore: QueueContractStore) -> ScheduleContractStore:
    assert isinstance(qstore, ScheduleStore)
    assert isinstance(qstore, IdempotentSubmitStore)
    return qstore  # type: ignore[return-value]


def _definition(name: str = "nightly", **options: object) -> ScheduleDefinition:
    if "every" not in options:
        options.setdefault("cron", "0 2 * * *")
    return ScheduleDefinition.build(name, "etl.yaml", [root("a")], **options)  # type: ignore[arg-type]


def _run(run_id: str, value: int = 1) -> NewRun:
    return NewRun(run_id, (root("a"),), {"n": value}, FailurePolicy.FAIL_FAST, "etl")


def test_sc_c01_a_schedule_is_stored_once_per_name_and_replaced_in_place(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    store = _store(qstore)
    first = store.put_schedule(_definition(timezone="Europe/Berlin"), replace=False)
    assert first is not None
    assert first.cursor == queue_clock.now and not first.paused
    assert first.definition == _definition(timezone="Europe/Berlin")
    assert store.put_schedule(_definition(cron="*/5 * * * *"), replace=False) is None
    assert store.get_schedule("nightly") == first
    queue_clock.advance(5.0)
    replaced = store.put_schedule(_definition(cron="*/5 * * * *"), replace=True)
    assert replaced is not None
    assert replaced.schedule_id == first.schedule_id
    assert replaced.cursor == first.cursor and replaced.definition.cron == "*/5 * * * *"
    store.put_schedule(_definition("another", every="30s"), replace=False)
    assert [r.name for r in store.list_schedules()] == ["another", "nightly"]
    assert store.get_schedule("missing") is None


def test_sc_c02_pause_and_resume_move_the_cursor_to_the_resume_time(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    store = _store(qstore)
    added = store.put_schedule(_definition(), replace=False)
    assert added is not None
    paused = store.set_schedule_paused("nightly", True)
    assert paused is not None and paused.paused and paused.cursor == added.cursor
    queue_clock.advance(100.0)
    assert store.set_schedule_paused("nightly", True) == store.get_schedule("nightly")
    resumed = store.set_schedule_paused("nightly", False)
    assert resumed is not None and not resumed.paused
    assert resumed.cursor == queue_clock.now
    queue_clock.advance(100.0)
    again = store.set_schedule_paused("nightly", False)  # an exact repeat changes nothing
    assert again is not None and again.cursor == resumed.cursor
    assert store.set_schedule_paused("missing", True) is None


def test_sc_c03_a_tick_is_recorded_with_its_run_exactly_once(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    store = _store(qstore)
    record = store.put_schedule(_definition(), replace=False)
    assert record is not None
    tick = int(queue_clock.now) + 60
    first = store.fire_schedule_tick(
        record.schedule_id, tick, source=FireSource.SCHEDULE, run=_run("r1"), advance_cursor=True
    )
    assert first.created and first.fire is not None
    assert (first.fire.tick, first.fire.run_id, first.fire.source) == (
        tick,
        "r1",
        FireSource.SCHEDULE,
    )
    assert first.fire.schedule_name == "nightly"
    assert store.get_run_status("r1") is RunStatus.PENDING
    assert store.get_schedule("nightly").cursor == tick  # type: ignore[union-attr]
    # Another run for the same tick: nothing written, the first record back.
    again = store.fire_schedule_tick(
        record.schedule_id, tick, source=FireSource.BACKFILL, run=_run("r2"), advance_cursor=True
    )
    assert not again.created and again.fire == first.fire
    assert store.get_run_status("r2") is None
    assert store.get_run_fire("r1") == first.fire
    assert store.get_run_fire("r2") is None
    # A tick recorded as skipped has no run.
    skipped = store.fire_schedule_tick(
        record.schedule_id, tick + 60, source="schedule", run=None, advance_cursor=False
    )
    assert skipped.created and skipped.fire is not None and skipped.fire.run_id is None
    assert store.get_schedule("nightly").cursor == tick  # type: ignore[union-attr]
    missing = store.fire_schedule_tick(
        "no-such-id", tick, source="schedule", run=_run("r3"), advance_cursor=True
    )
    assert missing == type(missing)(False, None)
    assert store.get_run_status("r3") is None


def test_sc_c04_a_refused_run_records_no_tick(qstore: QueueContractStore) -> None:
    store = _store(qstore)
    record = store.put_schedule(_definition(), replace=False)
    assert record is not None
    assert store.create_run("taken", [root("a")])
    with pytest.raises(InvalidStoreValueError):
        store.fire_schedule_tick(
            record.schedule_id, 60, source="schedule", run=_run("taken"), advance_cursor=True
        )
    with pytest.raises(InvalidStoreValueError):
        store.fire_schedule_tick(
            record.schedule_id, 60, source="sometimes", run=_run("r1"), advance_cursor=True
        )
    with pytest.raises(InvalidStoreValueError):
        store.fire_schedule_tick(
            record.schedule_id,
            60.5,  # type: ignore[arg-type]
            source="schedule",
            run=_run("r1"),
            advance_cursor=True,
        )
    assert store.list_schedule_fires(record.schedule_id) == []
    assert store.get_run_status("r1") is None


def test_sc_c05_concurrent_fires_of_one_tick_create_one_run(qstore: QueueContractStore) -> None:
    store = _store(qstore)
    record = store.put_schedule(_definition(), replace=False)
    assert record is not None
    results: list[bool] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def fire(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            outcome = store.fire_schedule_tick(
                record.schedule_id,
                120,
                source="schedule",
                run=_run(f"c{index}"),
                advance_cursor=True,
            )
            results.append(outcome.created)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=fire, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert sorted(results) == [False, False, False, True]
    existing = [i for i in range(4) if store.get_run_status(f"c{i}") is not None]
    assert len(existing) == 1
    (recorded,) = store.list_schedule_fires(record.schedule_id)
    assert recorded.run_id == f"c{existing[0]}"


def test_sc_c06_fires_are_listed_newest_first_with_filters(qstore: QueueContractStore) -> None:
    store = _store(qstore)
    record = store.put_schedule(_definition(), replace=False)
    assert record is not None
    for index, tick in enumerate((100, 200, 300, 400)):
        source = FireSource.BACKFILL if tick == 200 else FireSource.SCHEDULE
        store.fire_schedule_tick(
            record.schedule_id, tick, source=source, run=_run(f"f{index}"), advance_cursor=False
        )
    sid = record.schedule_id
    assert [f.tick for f in store.list_schedule_fires(sid)] == [400, 300, 200, 100]
    assert [f.tick for f in store.list_schedule_fires(sid, limit=2)] == [400, 300]
    assert [f.tick for f in store.list_schedule_fires(sid, source="schedule")] == [400, 300, 100]
    assert [f.tick for f in store.list_schedule_fires(sid, since=200, until=300)] == [300, 200]
    assert store.list_schedule_fires("other") == []
    with pytest.raises(InvalidStoreValueError):
        store.list_schedule_fires(sid, limit=0)


def test_sc_c07_delete_drops_the_schedule_and_its_records_not_its_runs(
    qstore: QueueContractStore,
) -> None:
    store = _store(qstore)
    record = store.put_schedule(_definition(), replace=False)
    assert record is not None
    store.fire_schedule_tick(
        record.schedule_id, 60, source="schedule", run=_run("kept"), advance_cursor=True
    )
    assert store.delete_schedule("nightly") is True
    assert store.delete_schedule("nightly") is False
    assert store.get_schedule("nightly") is None
    assert store.list_schedule_fires(record.schedule_id) == []
    assert store.get_run_fire("kept") is None
    assert store.get_run_status("kept") is RunStatus.PENDING
    # The name is free again, with a new identity and no records.
    again = store.put_schedule(_definition(), replace=False)
    assert again is not None and again.schedule_id != record.schedule_id


def test_sc_c08_the_cursor_only_moves_forward(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    store = _store(qstore)
    record = store.put_schedule(_definition(), replace=False)
    assert record is not None
    assert store.advance_schedule_cursor(record.schedule_id, record.cursor + 10) is True
    assert store.advance_schedule_cursor(record.schedule_id, record.cursor + 5) is False
    assert store.advance_schedule_cursor(record.schedule_id, record.cursor + 10) is False
    assert store.get_schedule("nightly").cursor == record.cursor + 10  # type: ignore[union-attr]
    assert store.advance_schedule_cursor("missing", 1e12) is False


def test_sc_c09_a_live_lease_is_readable(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    store = _store(qstore)
    assert store.get_lease("dagwerk.scheduler") is None
    assert store.try_acquire_lease("dagwerk.scheduler", "w1", 10.0)
    lease = store.get_lease("dagwerk.scheduler")
    assert lease is not None
    assert (lease.holder, lease.expires_at) == ("w1", queue_clock.now + 10.0)
    queue_clock.advance(10.0)
    assert store.get_lease("dagwerk.scheduler") is None  # expired


def test_sc_c10_an_idempotency_key_creates_one_run_until_it_expires(
    qstore: QueueContractStore, queue_clock: FakeClock
) -> None:
    store = _store(qstore)
    first = store.create_run_once("order-1", "fp-a", _run("k1"), retention=60.0)
    assert (first.run_id, first.created, first.fingerprint) == ("k1", True, "fp-a")
    assert store.get_run_status("k1") is RunStatus.PENDING
    # A repeat (or another fingerprint) within the retention creates nothing.
    again = store.create_run_once("order-1", "fp-b", _run("k2", 2), retention=60.0)
    assert (again.run_id, again.created, again.fingerprint) == ("k1", False, "fp-a")
    assert store.get_run_status("k2") is None
    with pytest.raises(InvalidStoreValueError):
        store.create_run_once("order-2", "fp", _run("k1"), retention=60.0)  # run ID taken
    with pytest.raises(InvalidStoreValueError):
        store.create_run_once("", "fp", _run("k3"), retention=60.0)
    with pytest.raises(InvalidStoreValueError):
        store.create_run_once("order-3", "fp", _run("k3"), retention=0)
    assert store.get_run_status("k3") is None
    assert store.purge_idempotency_keys() == 0
    queue_clock.advance(60.0)
    # Expired: the key is free for a new run.
    later = store.create_run_once("order-1", "fp-b", _run("k4"), retention=60.0)
    assert (later.run_id, later.created) == ("k4", True)
    queue_clock.advance(61.0)
    assert store.purge_idempotency_keys() == 1
    assert store.purge_idempotency_keys() == 0


def test_sc_c11_concurrent_submits_with_one_key_create_one_run(
    qstore: QueueContractStore,
) -> None:
    store = _store(qstore)
    answers: list[tuple[str, bool]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def submit(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            found = store.create_run_once("same", "fp", _run(f"s{index}"), retention=60.0)
            answers.append((found.run_id, found.created))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert len({run_id for run_id, _ in answers}) == 1
    assert sorted(created for _, created in answers) == [False, False, False, True]
    assert sum(store.get_run_status(f"s{i}") is not None for i in range(4)) == 1
