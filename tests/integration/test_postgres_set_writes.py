"""Set-based batched writes of the PostgreSQL gateway.

``Tx.many(name, rows)`` sends one statement per call for the blocks that
have a set form in ``postgres/set_writes.sql`` (all rows travel as one JSON
array), where it used to send one statement per row. These tests count the
statements the driver is asked to run (a wrapper around psycopg's
``Connection.execute`` and ``Cursor.executemany``; an executemany of N rows
counts N), and compare what the set forms write with what the per-row
statements write: for the worker's whole cycle, and for the edge cases
(values without an exact JSON form, rows that share a key, NUL and
out-of-range values, row order, long payloads, a lost connection).

The first tests read only the ``.sql`` files and run without a server.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagwerk.backends.errors import StoreUnavailableError
from dagwerk.backends.postgres import PostgresStore, _set_writes, _tx
from dagwerk.backends.postgres import gateway as pg_gateway
from dagwerk.backends.postgres._set_writes import load_set_writes
from dagwerk.backends.postgres._statements import statement_params
from dagwerk.backends.postgres.gateway import QUERIES, SET_WRITES
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.models import EmittedOutput
from dagwerk.orchestrator import reconcile_run
from dagwerk.store import (
    ClaimedDelivery,
    CompletionRequest,
    InvalidStoreValueError,
    OutputPublicationError,
    StoreContractError,
)
from dagwerk.testing.helpers import chain, child, new_run, root

SQL = Path(__file__).resolve().parents[2] / "src" / "dagwerk" / "backends" / "sql"

# The many() calls of a worker's cycle: claims, completions, launches, leases.
HOT = {
    "task_claim",
    "output_insert",
    "task_complete",
    "node_bump",
    "queue_ack",
    "task_insert",
    "delivery_insert",
}

TRICKY = (
    'quote " and backslash \\',
    "a literal \\u0000 escape, not a NUL",
    "tab\tnewline\ncarriage\rreturn",
    "ünïcödé ß 漢字",
    "astral 😀 \U0010fffd",
    "line\u2028separator\u2029",
    "control \x01\x1f\x7f",
    "",
    "{not json",
)

TABLES = (
    "dagwerk_runs",
    "dagwerk_nodes",
    "dagwerk_launches",
    "dagwerk_tasks",
    "dagwerk_attempts",
    "dagwerk_outputs",
    "dagwerk_deliveries",
    "dagwerk_dead_letters",
)


# --- the .sql file (no server) -----------------------------------------------------------


def test_the_worker_cycles_batched_blocks_have_set_forms() -> None:
    assert sorted(HOT - set(SET_WRITES)) == []


def test_every_set_form_stands_for_a_block_that_many_runs() -> None:
    """A set form no many() call uses would be dead code nobody tests."""
    code = "\n".join(path.read_text() for path in SQL.glob("*.py"))
    # Called as tx.many("name", ...), or as a ("name", rows) call of many_of.
    used = set(re.findall(r"(?:\.many\(|\.append\(\(|= \[\()\s*\"([a-z_0-9]+)\"", code))
    assert sorted(set(SET_WRITES) - used) == []


def test_set_forms_take_their_blocks_parameters_as_columns() -> None:
    for name, variant in SET_WRITES.items():
        columns = [column for column, _ in variant.columns]
        assert set(columns) == statement_params(QUERIES[name]), name
        assert set(variant.key) <= set(columns), name
        assert variant.statement.preludes == (), name
        assert not QUERIES[name].preludes, name
        assert statement_params(variant.statement) == {"rows"}, name
        # Inserts assign identity values in row order.
        main = variant.statement.main.decode()
        if main.lstrip().upper().startswith("INSERT"):
            assert "WITH ORDINALITY AS e (v, ord)" in main, name
            assert main.rstrip().endswith("ORDER BY r.ord"), name


_GOOD = """-- name: node_bump
-- key: run_id, node_index
UPDATE dagwerk_nodes AS n SET revision = n.revision + 1
FROM (SELECT j.*
      FROM unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb)))) AS e (v),
           jsonb_to_record(e.v) AS j (run_id text, node_index bigint)
      WHERE jsonb_typeof(e.v) = 'object'
      OFFSET 0) AS r
WHERE n.run_id = r.run_id AND n.node_index = r.node_index;
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("node_bump", "nodes_bump"), "no block in queries.sql"),
        (("-- key: run_id, node_index\n", ""), "key"),
        (("-- key: run_id, node_index", "-- key: run_id, revision"), "key"),
        (("node_index bigint)", "node_index bigint, revision bigint)"), "columns differ"),
        (("node_index bigint)", "node_index numeric)"), "unsupported type"),
        (("= r.node_index;", "= r.node_index AND n.revision = :revision;"), ":rows"),
        (
            (
                "UPDATE dagwerk_nodes",
                "SELECT 1 FROM dagwerk_nodes FOR UPDATE;\nUPDATE dagwerk_nodes",
            ),
            "prelude",
        ),
        (("jsonb_to_record(e.v) AS j", "json_to_record(e.v) AS j"), "rows once"),
        (("unnest(ARRAY(SELECT jsonb", "unnest(ARRAY(SELECT DISTINCT jsonb"), "rows once"),
        (("WHERE jsonb_typeof(e.v) = 'object'\n", ""), "rows once"),
        (("OFFSET 0) AS r", ") AS r"), "rows once"),
    ],
)
def test_the_loader_refuses_malformed_set_forms(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    good = tmp_path / "good.sql"
    good.write_text(_GOOD)
    assert set(load_set_writes(good, QUERIES)) == {"node_bump"}
    bad = tmp_path / "bad.sql"
    bad.write_text(_GOOD.replace(*change))
    with pytest.raises(ValueError, match=message):
        load_set_writes(bad, QUERIES)


# --- fixtures ----------------------------------------------------------------------------


@pytest.fixture
def make_store(postgres_url: str) -> Iterator[Callable[..., PostgresStore]]:
    """Stores in fresh schemas with a fixed clock and predictable IDs, so two
    stores that run the same calls hold the same rows."""
    opened: list[PostgresStore] = []

    def make(**settings: Any) -> PostgresStore:
        schema = f"setw_{uuid.uuid4().hex[:16]}"
        store = PostgresStore(
            postgres_url, schema=schema, pool_size=2, clock=lambda: 1_700_000_000.25, **settings
        )
        ids = itertools.count()
        store._new_id = lambda: f"id-{next(ids):06d}"  # type: ignore[method-assign]
        store._new_ids = lambda count: [store._new_id() for _ in range(count)]  # type: ignore[method-assign]
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for store in opened:
            conn.execute(f'DROP SCHEMA IF EXISTS "{store.schema}" CASCADE')


@pytest.fixture
def store(make_store: Callable[..., PostgresStore]) -> PostgresStore:
    return make_store()


class Sent:
    """The statements the driver is asked to run, by block name, and the
    ``many()`` calls with the statements each of them sent."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, str, int]] = []  # (block, "set" | "row", rows)
        self.calls: list[tuple[str, int, int]] = []  # (block, rows, statements)

    def of(self, name: str) -> list[tuple[str, int]]:
        return [(kind, rows) for block, kind, rows in self.statements if block == name]

    def per_row(self, name: str) -> bool:
        """Whether every many() call of ``name`` sent one statement per row."""
        calls = [(rows, sent) for block, rows, sent in self.calls if block == name]
        return bool(calls) and all(rows == sent for rows, sent in calls)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Sent:
    found = Sent()
    rows_of = {q.main: name for name, q in QUERIES.items()}
    sets_of = {v.statement.main: name for name, v in SET_WRITES.items()}
    execute = psycopg.Connection.execute
    executemany = psycopg.Cursor.executemany
    many, many_of = pg_gateway.PostgresTx.many, pg_gateway.PostgresTx.many_of

    def counting_execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        together = {main: label for label, main in _tx._TOGETHER.items()}
        if query in together:
            found.statements.append((together[query], "together", 1))
        elif query in sets_of:
            rows = len(json.loads(params["rows"]))
            found.statements.append((sets_of[query], "set", rows))
        elif query in rows_of:
            found.statements.append((rows_of[query], "row", 1))
        return execute(self, query, params, **kwargs)

    def counting_executemany(self: Any, query: Any, params_seq: Any, **kwargs: Any) -> Any:
        rows = list(params_seq)
        found.statements.extend((rows_of[query], "row", 1) for _ in rows)
        return executemany(self, query, rows, **kwargs)

    def counting_many(self: Any, name: str, rows: Any) -> None:
        rows = list(rows)
        before = len(found.statements)
        try:
            many(self, name, rows)
        finally:
            found.calls.append((name, len(rows), len(found.statements) - before))

    def counting_many_of(self: Any, calls: Any) -> None:
        calls = [(name, list(rows)) for name, rows in calls]
        before, seen = len(found.statements), len(found.calls)
        try:
            many_of(self, calls)
        finally:
            if len(found.calls) == seen and len(found.statements) == before + 1:
                # One statement for all the calls: each call's rows went in it.
                found.calls.extend((name, len(rows), 1) for name, rows in calls if rows)

    monkeypatch.setattr(psycopg.Connection, "execute", counting_execute)
    monkeypatch.setattr(pg_gateway.PostgresTx, "many_of", counting_many_of)
    monkeypatch.setattr(psycopg.Cursor, "executemany", counting_executemany)
    monkeypatch.setattr(pg_gateway.PostgresTx, "many", counting_many)
    return found


@contextmanager
def per_row() -> Iterator[None]:
    """Run every many() call per row, without the set forms, and every
    many_of() call as its many() calls, one after another."""
    saved, together = _tx.SET_WRITES, _tx.PostgresTx.many_of

    def one_by_one(self: Any, calls: Any) -> None:
        for name, rows in calls:
            self.many(name, rows)

    _tx.SET_WRITES = {}
    _tx.PostgresTx.many_of = one_by_one  # type: ignore[method-assign]
    try:
        yield
    finally:
        _tx.SET_WRITES = saved
        _tx.PostgresTx.many_of = together  # type: ignore[method-assign]


def _dump(store: PostgresStore) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the store's tables, in a stable order."""
    url = store._pg.url
    with psycopg.connect(url, options=f"-c search_path={store.schema}") as conn:
        return {
            table: sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
            for table in TABLES
        }


def _same(left: object, right: object) -> bool:
    """Equality that also holds for NaN and tells -0.0 from 0.0."""
    if isinstance(left, float) and isinstance(right, float):
        return repr(left) == repr(right)
    if isinstance(left, tuple | list) and isinstance(right, tuple | list):
        if len(left) != len(right):
            return False
        return all(_same(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    return left == right


def _both(
    make_store: Callable[..., PostgresStore],
    setup: Callable[[PostgresStore], None],
    action: Callable[[PostgresStore], object],
) -> tuple[PostgresStore, object]:
    """Run ``action`` after ``setup`` on two equal stores, with set forms and
    per row; assert that both wrote the same rows and returned (or raised)
    the same; returns the set-form store and its result."""
    outcomes: list[tuple[object, dict[str, Any]]] = []
    first: PostgresStore | None = None
    for mode in ("set", "row"):
        store = make_store()
        first = first or store
        setup(store)
        result: object
        try:
            if mode == "set":
                result = action(store)
            else:
                with per_row():
                    result = action(store)
        except Exception as exc:  # compared below
            result = (type(exc), getattr(exc, "code", None))
        outcomes.append((result, _dump(store)))
    (done, rows), (expected, expected_rows) = outcomes
    assert done == expected
    assert _same(rows, expected_rows)
    assert first is not None
    return first, done


def _started(store: PostgresStore) -> None:
    new_run(store, chain(3))


def _request(entry: ClaimedDelivery, outputs: tuple[EmittedOutput, ...]) -> CompletionRequest:
    row = entry.delivery
    return CompletionRequest(
        task_id=row.task_id,
        expected_attempt_id=row.attempt_id,
        outputs=outputs,
        delivery_id=row.delivery_id,
    )


def _cycle(store: PostgresStore, size: int) -> None:
    """A fan-out and its completions as a worker runs them: the root emits
    ``size`` outputs, the EACH child's ``size`` tasks are leased and claimed
    in one call and completed (one output each) in one call."""
    log = new_run(store, [root("r"), child("c", "r")])
    (entry,) = store.claim_deliveries("w1", limit=1, lease_seconds=30.0)
    outputs = tuple(
        EmittedOutput(
            id=f"o-{i:03d}",
            fields={"i": i, "text": TRICKY[i % len(TRICKY)], "x": i / 7},
            data={"blob": TRICKY[(i + 1) % len(TRICKY)], "n": None},
        )
        for i in range(size)
    )
    assert store.complete_and_ack("w1", [_request(entry, outputs)])[0] is not None
    reconcile_run(store, "run-1", callbacks=log.callbacks)
    entries = store.claim_deliveries("w1", limit=size, lease_seconds=30.0)
    assert len(entries) == size and all(e.task is not None for e in entries)
    done = store.complete_and_ack(
        "w1",
        [
            _request(e, (EmittedOutput(id=f"c-{k}", fields={"k": k, "t": TRICKY[k % 9]}),))
            for k, e in enumerate(entries)
        ],
    )
    assert all(outcome is not None for outcome in done)


# --- statement counts ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [3, 40])
def test_a_batched_call_sends_one_statement_whatever_its_size(
    store: PostgresStore, sent: Sent, size: int
) -> None:
    """Every many() call of the cycle sends one statement, so the cycle's
    batched writes cost as many statements for 3 tasks as for 40 (per row,
    each call of N rows cost N)."""
    _cycle(store, size)
    by_block: dict[str, list[tuple[int, int]]] = {}
    for name, rows, statements in sent.calls:
        by_block.setdefault(name, []).append((rows, statements))
    for name in HOT:
        assert name in by_block, name
        assert all(statements == 1 for _, statements in by_block[name]), (name, by_block[name])
    # The calls of the fan-out really carried the batch.
    for name in ("task_insert", "delivery_insert"):
        assert max(rows for rows, _ in by_block[name]) == size, name
    for name in ("task_claim", "task_complete", "queue_ack"):
        assert max(rows for rows, _ in by_block[name]) == size, name
    assert max(rows for rows, _ in by_block["output_insert"]) == size
    assert sum(statements for _, _, statements in sent.calls) == len(sent.calls)


def test_a_batch_claim_writes_each_task_row_once(store: PostgresStore, sent: Sent) -> None:
    """claim_deliveries records the worker in the statement that sets the
    task RUNNING: its leases write no task row (they used to record the
    worker with a task update of their own, a second write of each row)."""
    new_run(store, [root("a"), root("b"), root("c")])
    sent.statements.clear()
    entries = store.claim_deliveries("w1", limit=3, lease_seconds=30.0)
    assert len(entries) == 3 and all(e.task is not None for e in entries)
    task_writes = [(block, rows) for block, _, rows in sent.statements if block.startswith("task_")]
    assert task_writes == [("task_claim", 3)]
    for entry in entries:
        assert store.list_attempts(entry.delivery.task_id)[-1].worker_id == "w1"


def test_a_failed_batch_claim_still_records_the_leases_worker(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the claim's transaction fails after the leases committed, the
    rows come back unclaimed (the worker takes them one by one) and the
    worker is recorded on their tasks as a lease records it."""
    new_run(store, [root("a"), root("b")])

    def unavailable(*args: object, **kwargs: object) -> None:
        raise StoreUnavailableError("the claim's transaction failed")

    monkeypatch.setattr(store, "_claim_many", unavailable)
    entries = store.claim_deliveries("w1", limit=2, lease_seconds=30.0)
    assert len(entries) == 2 and all(e.task is None for e in entries)
    for entry in entries:
        record = store.get_task(entry.delivery.task_id)
        assert record is not None and record.status is TaskStatus.QUEUED
        assert store.list_attempts(entry.delivery.task_id)[-1].worker_id == "w1"


def test_a_single_row_runs_its_blocks_own_statement(store: PostgresStore, sent: Sent) -> None:
    """For one row the block's own statement is cheaper than the set form."""
    _started(store)
    sent.statements.clear()
    with store._pg.write() as tx:
        tx.many("node_bump", [{"run_id": "run-1", "node_index": 1}])
        tx.many("node_bump", [{"run_id": "run-1", "node_index": n} for n in (1, 2)])
    assert sent.of("node_bump") == [("row", 1), ("set", 2)]


def test_empty_calls_send_nothing(store: PostgresStore, sent: Sent) -> None:
    _started(store)
    sent.statements.clear()
    with store._pg.write() as tx:
        for name in SET_WRITES:
            tx.many(name, [])
        assert not tx._sent  # not even BEGIN
    assert sent.statements == []


# --- the same rows as per-row statements --------------------------------------------------------


def test_a_worker_cycle_writes_the_same_rows_as_per_row_statements(
    make_store: Callable[..., PostgresStore], sent: Sent
) -> None:
    _both(make_store, lambda store: None, lambda store: _cycle(store, 25))
    for name in HOT - {"node_bump"}:
        assert (name, 25, 1) in sent.calls, name


def _lease_rows(store: PostgresStore, expires: Sequence[object]) -> list[dict[str, object]]:
    """Queue rows for the root task, one per value, and the lease rows that
    set each one's expiry to its value."""
    task = store.list_tasks("run-1")[0]
    with store._pg.write() as tx:
        tx.many(
            "delivery_insert",
            [
                {
                    "delivery_id": f"d-{n}",
                    "task_id": task.task_id,
                    "attempt_id": task.attempt_id,
                    "generation": 0,
                    "run_id": "run-1",
                    "node_index": 0,
                    "launch_id": "run-1:launch:0:0",
                    "queue": "default",
                    "priority": 0,
                    "now": 1.5,
                    "delivery_count": 0,
                }
                for n in range(len(expires))
            ],
        )
    return [
        {"delivery_id": f"d-{n}", "worker_id": "w", "expires": value}
        for n, value in enumerate(expires)
    ]


EXACT_FLOATS: tuple[float | int, ...] = (
    0.1 + 0.2,
    1e-7,
    5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    -1712345678.123456,
    1712345678.1234567,
    0.0,
    7,
    2**53 + 1,
    -(2**62),
)


def test_floats_and_ints_of_double_columns_round_trip_exactly(
    make_store: Callable[..., PostgresStore], sent: Sent
) -> None:
    def lease(store: PostgresStore) -> list[object]:
        rows = _lease_rows(store, EXACT_FLOATS)
        with store._pg.write() as tx:
            tx.many("queue_lease", rows)
        with store._pg.read() as tx:
            found = {
                row["delivery_id"]: row["lease_expires_at"]
                for row in tx.all("deliveries_list", {"run_id": "run-1"})
            }
        return [found[row["delivery_id"]] for row in rows]

    _, stored = _both(make_store, _started, lease)
    assert _same(stored, [float(value) for value in EXACT_FLOATS])
    assert ("queue_lease", len(EXACT_FLOATS), 1) in sent.calls
    assert sent.of("queue_lease")[0] == ("set", len(EXACT_FLOATS))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -0.0])
def test_floats_without_an_exact_json_form_run_per_row(
    make_store: Callable[..., PostgresStore], sent: Sent, value: float
) -> None:
    def lease(store: PostgresStore) -> object:
        rows = _lease_rows(store, [1.0, value])
        with store._pg.write() as tx:
            tx.many("queue_lease", rows)
        with store._pg.read() as tx:
            return sorted(
                (row["delivery_id"], repr(row["lease_expires_at"]))
                for row in tx.all("deliveries_list", {"run_id": "run-1"})
            )

    _, stored = _both(make_store, _started, lease)
    assert ("d-1", repr(value)) in stored  # type: ignore[operator]
    assert sent.per_row("queue_lease")


@pytest.mark.parametrize(
    "odd",
    [
        {"node_index": 1.0},  # a float where the column is bigint: the driver compares it
        {"node_index": True},  # a bool: the driver sends a boolean
        {"run_id": 5},  # an int where the column is text
    ],
)
def test_values_of_other_types_run_per_row_as_before(
    make_store: Callable[..., PostgresStore], sent: Sent, odd: dict[str, object]
) -> None:
    def bump(store: PostgresStore) -> object:
        with store._pg.write() as tx:
            tx.many(
                "node_bump",
                [{"run_id": "run-1", "node_index": 2}, {"run_id": "run-1", "node_index": 1, **odd}],
            )
        with store._pg.read() as tx:
            return sorted(
                (row["node_index"], row["revision"])
                for row in tx.all("nodes_of_run", {"run_id": "run-1"})
            )

    _both(make_store, _started, bump)
    assert ("node_bump", 2, 2) in sent.calls
    assert sent.per_row("node_bump")


def test_text_round_trips_through_the_set_form(
    make_store: Callable[..., PostgresStore], sent: Sent
) -> None:
    rows = [
        {
            "run_id": "run-1",
            "output_id": f"o-{n}-{text[:3]}",
            "node_index": 0,
            "fields": text,
            "data": text[::-1],
            "correlation_id": None if n % 2 else text,
            "routing_size": 2**63 - 1 - n,
        }
        for n, text in enumerate(TRICKY)
    ]

    def insert(store: PostgresStore) -> object:
        with store._pg.write() as tx:
            tx.many("output_insert", rows)
        with psycopg.connect(store._pg.url, options=f"-c search_path={store.schema}") as conn:
            return conn.execute(
                "SELECT run_id, output_id, node_index, fields, data, correlation_id, "
                "routing_size FROM dagwerk_outputs ORDER BY seq"
            ).fetchall()

    _, stored = _both(make_store, _started, insert)
    assert stored == [tuple(row.values()) for row in rows]
    assert ("output_insert", len(rows), 1) in sent.calls


def test_nul_and_out_of_range_values_are_refused_before_anything_is_sent(
    store: PostgresStore, sent: Sent
) -> None:
    _started(store)
    output = {
        "run_id": "run-1",
        "output_id": "o",
        "node_index": 0,
        "fields": "{}",
        "data": "{}",
        "correlation_id": None,
        "routing_size": 2,
    }
    sent.statements.clear()
    with pytest.raises(OutputPublicationError, match="NUL"), store._pg.write() as tx:
        tx.many("output_insert", [output, {**output, "output_id": "p", "data": "a\x00b"}])
    with pytest.raises(InvalidStoreValueError, match="64-bit"), store._pg.write() as tx:
        tx.many("node_bump", [{"run_id": "run-1", "node_index": 2**63}])
    assert sent.statements == []
    assert store.resolve_outputs("run-1", ("o",)) == {}


def test_rows_that_share_a_key_run_per_row_in_order(
    make_store: Callable[..., PostgresStore], sent: Sent
) -> None:
    """Per-row statements apply such rows one after another (a node bumped
    twice, a task moved twice, a row leased twice); a set statement would
    apply one of them, so the call runs per row."""

    def twice(store: PostgresStore) -> object:
        task = store.list_tasks("run-1")[0]
        rows = _lease_rows(store, [2.0])
        with store._pg.write() as tx:
            tx.many(
                "node_bump",
                [{"run_id": "run-1", "node_index": n} for n in (1, 1, 2)],
            )
            tx.many(
                "task_set_status",
                [
                    {
                        "task_id": task.task_id,
                        "attempt_id": task.attempt_id,
                        "old": old,
                        "new": new,
                        "error": None,
                        "now": 3.0,
                    }
                    for old, new in (("queued", "running"), ("running", "failed"))
                ],
            )
            tx.many("queue_lease", rows + rows)
        with store._pg.read() as tx:
            return (
                sorted(
                    (row["node_index"], row["revision"])
                    for row in tx.all("nodes_of_run", {"run_id": "run-1"})
                ),
                [row["status"] for row in tx.all("tasks_of_run", {"run_id": "run-1", "all": 1})],
                [
                    row["delivery_count"]
                    for row in tx.all("deliveries_list", {"run_id": "run-1"})
                    if row["delivery_id"] == "d-0"
                ],
            )

    _, done = _both(make_store, _started, twice)
    assert isinstance(done, tuple), done
    revisions, statuses, counts = done
    assert statuses == ["failed"]
    assert counts == [2]
    assert dict(revisions)[1] == 2
    for name in ("node_bump", "task_set_status", "queue_lease"):
        assert sent.per_row(name), name


# --- several blocks' writes as one statement (many_of) ---------------------------------------


def _output(output_id: str) -> dict[str, object]:
    return {
        "run_id": "run-1",
        "output_id": output_id,
        "node_index": 0,
        "fields": "{}",
        "data": "{}",
        "correlation_id": None,
        "routing_size": 2,
    }


def _writes_of_three_tables(store: PostgresStore) -> object:
    """One row and two-row calls of three tables in one many_of; what they left."""
    rows = _lease_rows(store, [2.0, 3.0])
    with store._pg.write() as tx:
        tx.many_of(
            [
                ("output_insert", [_output("o-1"), _output("o-2")]),
                ("node_bump", [{"run_id": "run-1", "node_index": 1}]),
                ("queue_lease", rows),
            ]
        )
    with store._pg.read() as tx:
        return (
            sorted(
                (row["node_index"], row["revision"])
                for row in tx.all("nodes_of_run", {"run_id": "run-1"})
            ),
            sorted(
                (row["delivery_id"], row["lease_owner"], row["delivery_count"])
                for row in tx.all("deliveries_list", {"run_id": "run-1"})
            ),
            sorted(store.resolve_outputs("run-1", ("o-1", "o-2"))),
        )


def test_writes_of_different_tables_go_as_one_statement(
    make_store: Callable[..., PostgresStore], sent: Sent
) -> None:
    """A many_of of one-row and set calls sends one statement, which writes
    what the calls write one after another, per row."""
    sent.statements.clear()
    _, done = _both(make_store, _started, _writes_of_three_tables)
    assert isinstance(done, tuple), done
    revisions, deliveries, outputs = done
    assert dict(revisions)[1] == 1
    assert [(d, owner, count) for d, owner, count in deliveries if d.startswith("d-")] == [
        ("d-0", "w", 1),
        ("d-1", "w", 1),
    ]
    assert outputs == ["o-1", "o-2"]
    together = [block for block, kind, _ in sent.statements if kind == "together"]
    assert together.count("output_insert (set) + node_bump + queue_lease (set)") == 1, together
    assert ("node_bump", 1, 1) in sent.calls and ("queue_lease", 2, 1) in sent.calls


def test_an_empty_call_sends_nothing_and_leaves_the_others_together(
    store: PostgresStore, sent: Sent
) -> None:
    _started(store)
    sent.statements.clear()
    with store._pg.write() as tx:
        tx.many_of(
            [
                ("output_insert", []),
                ("node_bump", [{"run_id": "run-1", "node_index": 1}]),
                ("queue_ack", [{"delivery_id": "none", "worker_id": "w"}]),
            ]
        )
    assert sent.statements == [("node_bump + queue_ack", "together", 1)]


def test_a_failing_write_fails_the_statement_with_its_error_and_writes_nothing(
    store: PostgresStore, sent: Sent
) -> None:
    _started(store)
    with store._pg.write() as tx:
        tx.many("output_insert", [_output("taken")])
    with pytest.raises(StoreContractError) as alone, store._pg.write() as tx:
        tx.many("output_insert", [_output("taken")])
    sent.statements.clear()
    with pytest.raises(StoreContractError) as together, store._pg.write() as tx:
        tx.many_of(
            [
                ("node_bump", [{"run_id": "run-1", "node_index": 2}]),
                ("output_insert", [_output("new"), _output("taken")]),
            ]
        )
    assert type(together.value) is type(alone.value)
    assert together.value.code == alone.value.code
    assert "output_insert" in str(together.value)
    assert [kind for _, kind, _ in sent.statements] == ["together"]
    with store._pg.read() as tx:
        nodes = {
            row["node_index"]: row["revision"]
            for row in tx.all("nodes_of_run", {"run_id": "run-1"})
        }
    assert nodes[2] == 0  # the bump rolled back with the insert
    assert store.resolve_outputs("run-1", ("new",)) == {}


def test_calls_a_set_statement_cannot_carry_run_one_by_one(
    store: PostgresStore, sent: Sent
) -> None:
    """Rows that share a key cannot go in a set statement, so neither can
    the calls beside them: each call runs as many() runs it."""
    _started(store)
    sent.statements.clear()
    with store._pg.write() as tx:
        tx.many_of(
            [
                ("node_bump", [{"run_id": "run-1", "node_index": n} for n in (1, 1)]),
                ("output_insert", [_output("o")]),
            ]
        )
    assert [kind for _, kind, _ in sent.statements] == ["row", "row", "row"]
    assert sent.per_row("node_bump") and sent.per_row("output_insert")


def test_inserts_keep_row_order(make_store: Callable[..., PostgresStore], sent: Sent) -> None:
    """Identity values (seq) follow the rows' order, not their keys'."""
    order = [(n * 37) % 101 for n in range(101)]

    def insert(store: PostgresStore) -> object:
        with store._pg.write() as tx:
            tx.many(
                "task_insert",
                [
                    {
                        "task_id": f"t-{n:03d}",
                        "run_id": "run-1",
                        "node_index": 1,
                        "generation": 0,
                        "launch_id": "run-1:launch:0:0",
                        "status": "queued",
                        "attempt_id": f"a-{n}",
                        "plan": f'{{"n":{n}}}',
                    }
                    for n in order
                ],
            )
        with store._pg.read() as tx:
            return [
                row["task_id"]
                for row in tx.all("tasks_of_run", {"run_id": "run-1", "all": 1})
                if row["node_index"] == 1
            ]

    _, ids = _both(make_store, _started, insert)
    assert ids == [f"t-{n:03d}" for n in order]
    assert ("task_insert", len(order), 1) in sent.calls


def test_long_payloads_are_split_in_row_order(
    make_store: Callable[..., PostgresStore], sent: Sent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A payload longer than the limit is split; a row longer on its own
    runs per row, between the set statements of its neighbours."""
    monkeypatch.setattr(_set_writes, "MAX_PAYLOAD_CHARS", 2_000)
    plans = ['{"p":"' + "x" * (3_000 if n == 17 else 50) + '"}' for n in range(40)]
    rows = [
        {
            "task_id": f"t-{39 - n:02d}",
            "run_id": "run-1",
            "node_index": 1,
            "generation": 0,
            "launch_id": "run-1:launch:0:0",
            "status": "queued",
            "attempt_id": f"a-{n}",
            "plan": plan,
        }
        for n, plan in enumerate(plans)
    ]
    segments = SET_WRITES["task_insert"].segments(rows)
    assert segments is not None and len(segments) > 3
    assert [rows[17]] in segments
    flat = [
        row
        for segment in segments
        for row in (segment if isinstance(segment, list) else [{}] * segment.count('{"task_id"'))
    ]
    assert len(flat) == 40
    assert all(len(segment) <= 2_000 for segment in segments if isinstance(segment, str))

    def insert(store: PostgresStore) -> object:
        with store._pg.write() as tx:
            tx.many("task_insert", rows)
        with store._pg.read() as tx:
            return [
                (row["task_id"], row["plan"])
                for row in tx.all("tasks_of_run", {"run_id": "run-1", "all": 1})
                if row["node_index"] == 1
            ]

    _, stored = _both(make_store, _started, insert)
    assert stored == [(row["task_id"], row["plan"]) for row in rows]
    assert ("task_insert", 40, len(segments)) in sent.calls


def test_queue_rows_keep_the_queue_and_priority_they_are_given(
    make_store: Callable[..., PostgresStore], sent: Sent
) -> None:
    def insert(store: PostgresStore) -> object:
        task = store.list_tasks("run-1")[0]
        row = {
            "task_id": task.task_id,
            "attempt_id": task.attempt_id,
            "generation": 0,
            "run_id": "run-1",
            "node_index": 0,
            "launch_id": "run-1:launch:0:0",
            "now": 3.5,
            "delivery_count": 0,
        }
        with store._pg.write() as tx:
            tx.many(
                "delivery_insert",
                [
                    {**row, "delivery_id": "d-a", "queue": "default", "priority": 0},
                    {**row, "delivery_id": "d-b", "queue": "q", "priority": 1},
                    {**row, "delivery_id": "d-c", "queue": "q", "priority": 9},
                ],
            )
        with store._pg.read() as tx:
            return sorted(
                (row["delivery_id"], row["queue"], row["priority"])
                for row in tx.all("deliveries_list", {"run_id": None})
            )

    _, stored = _both(make_store, _started, insert)
    assert isinstance(stored, list)
    assert {("d-a", "default", 0), ("d-b", "q", 1), ("d-c", "q", 9)} <= set(stored)
    assert ("delivery_insert", 3, 1) in sent.calls


def test_a_row_without_a_parameter_fails_as_per_row(
    make_store: Callable[..., PostgresStore],
) -> None:
    def bump(store: PostgresStore) -> object:
        with store._pg.write() as tx:
            tx.many("node_bump", [{"run_id": "run-1", "node_index": 1}, {"run_id": "run-1"}])
        return None

    _, result = _both(make_store, _started, bump)
    assert result is not None  # both raised, the same way


def test_a_failing_set_statement_fails_its_transaction_with_its_own_type(
    store: PostgresStore,
) -> None:
    _started(store)
    task = store.list_tasks("run-1")[0]
    row = {
        "task_id": task.task_id,  # exists: the unique key refuses it
        "run_id": "run-1",
        "node_index": 0,
        "generation": 0,
        "launch_id": "run-1:launch:0:0",
        "status": "queued",
        "attempt_id": "a",
        "plan": "{}",
    }
    with pytest.raises(StoreContractError, match="task_insert") as caught, store._pg.write() as tx:
        tx.run("run_set_status", {"run_id": "run-1", "old": "running", "new": "pending"})
        tx.many("task_insert", [{**row, "task_id": "fresh"}, row])
    assert "constraint" in str(caught.value)
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    assert [t.task_id for t in store.list_tasks("run-1")] == [task.task_id]


def test_a_set_statement_whose_connection_is_lost_first_is_sent_again_once(
    make_store: Callable[..., PostgresStore], postgres_url: str, sent: Sent
) -> None:
    label = f"dagwerk-setw-{uuid.uuid4().hex[:8]}"
    store = make_store(application_name=label)
    _started(store)

    def revisions() -> list[int]:
        with store._pg.read() as tx:
            rows = tx.all("nodes_of_run", {"run_id": "run-1"})
        return [row["revision"] for row in sorted(rows, key=lambda row: row["node_index"])]

    before = revisions()  # parks the connection
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (label,),
        ).fetchall()
    assert killed
    with store._pg.write() as tx:
        tx.many("node_bump", [{"run_id": "run-1", "node_index": n} for n in (0, 2)])
    assert revisions() == [before[0] + 1, before[1], before[2] + 1]
    assert ("set", 2) in sent.of("node_bump")


def test_a_lost_connection_inside_the_write_is_still_unavailable(
    make_store: Callable[..., PostgresStore], postgres_url: str
) -> None:
    label = f"dagwerk-setw-{uuid.uuid4().hex[:8]}"
    store = make_store(application_name=label)
    _started(store)
    with pytest.raises(StoreUnavailableError), store._pg.write() as tx:
        tx.one("run_status", {"run_id": "run-1"})
        tx.many("node_bump", [{"run_id": "run-1", "node_index": n} for n in (0, 2)])
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (label,),
            )


# --- plans ------------------------------------------------------------------------------------


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for sub in plan.get("Plans", []):
        yield from _plan_nodes(sub)


def _work(plan: dict[str, Any]) -> int:
    """Rows that the plan's nodes produced or filtered out, over all loops."""
    counted = ("Actual Rows", "Rows Removed by Filter", "Rows Removed by Join Filter")
    return sum(
        round(sum(node.get(key, 0) for key in counted) * node["Actual Loops"])
        for node in _plan_nodes(plan)
    )


@pytest.mark.parametrize("analyzed", [False, True])
@pytest.mark.parametrize(("size", "batch"), [(100, 100), (1_000, 200)])
def test_set_forms_do_work_linear_in_rows_and_table_whatever_the_statistics(
    store: PostgresStore, analyzed: bool, size: int, batch: int
) -> None:
    """The planner cannot see the JSON rows; a plan that put the target
    table outside and the rows inside a nested loop would read every row
    again for each table row (a 1,000-row lease took a second that way on
    a young table). On tables of 100 and 1,000 rows, with and without statistics,
    under custom and generic plans, each JSON row is decoded once and the
    plan handles O(rows + table) rows, not O(rows x table)."""
    _started(store)
    with store._pg.write() as tx:
        tx.many(
            "task_insert",
            [
                {
                    "task_id": f"t{i}",
                    "run_id": "run-1",
                    "node_index": 1,
                    "generation": 0,
                    "launch_id": "run-1:launch:0:0",
                    "status": "queued",
                    "attempt_id": "a",
                    "plan": "{}",
                }
                for i in range(size)
            ],
        )
        tx.many(
            "delivery_insert",
            [
                {
                    "delivery_id": f"d{i}",
                    "task_id": f"t{i}",
                    "attempt_id": "a",
                    "generation": 0,
                    "run_id": "run-1",
                    "node_index": 1,
                    "launch_id": "run-1:launch:0:0",
                    "queue": "default",
                    "priority": 0,
                    "now": 1.0,
                    "delivery_count": 0,
                }
                for i in range(size)
            ],
        )
    keys = range(0, size, size // batch)
    rows: dict[str, list[dict[str, object]]] = {
        "task_set_status": [
            {
                "task_id": f"t{i}",
                "old": "queued",
                "attempt_id": "a",
                "new": "running",
                "error": None,
                "now": 3.0,
            }
            for i in keys
        ],
        "task_set_worker": [
            {"task_id": f"t{i}", "attempt_id": "a", "worker_id": "w"} for i in keys
        ],
        "task_claim": [
            {
                "task_id": f"t{i}",
                "old": "queued",
                "attempt_id": "a",
                "new": "running",
                "error": None,
                "worker_id": "w",
                "now": 3.0,
            }
            for i in keys
        ],
        "task_complete": [
            {"task_id": f"t{i}", "attempt_id": "a", "launch_complete": 0, "now": 3.0} for i in keys
        ],
        "queue_lease": [{"delivery_id": f"d{i}", "worker_id": "w", "expires": 2.0} for i in keys],
        "queue_ack": [{"delivery_id": f"d{i}", "worker_id": "w"} for i in keys],
        "node_bump": [{"run_id": "run-1", "node_index": n} for n in (0, 1, 2)],
        "launch_count_completions": [{"launch_id": "run-1:launch:0:0", "n": 2}],
    }
    assert sorted(rows) == sorted(
        name for name, v in SET_WRITES.items() if not v.statement.main.startswith(b"INSERT")
    )
    with psycopg.connect(store._pg.url, options=f"-c search_path={store.schema}") as conn:
        if analyzed:
            conn.execute("ANALYZE")
        for mode in ("auto", "force_generic_plan"):
            conn.execute(f"SET plan_cache_mode = {mode}")
            for name, payload in rows.items():
                main = SET_WRITES[name].statement.main
                explained = conn.execute(
                    b"EXPLAIN (ANALYZE, FORMAT JSON) " + main, {"rows": json.dumps(payload)}
                ).fetchone()
                assert explained is not None
                conn.rollback()
                plan = explained[0][0]["Plan"]
                decoded = [
                    node["Actual Loops"]
                    for node in _plan_nodes(plan)
                    if node.get("Function Name") == "jsonb_to_record"
                ]
                assert decoded == [len(payload)], (name, mode, decoded)
                assert _work(plan) <= 10 * (size + batch), (name, mode, _work(plan))


# --- the keys -------------------------------------------------------------------------------


def test_set_form_keys_are_unique_keys_of_their_tables(store: PostgresStore) -> None:
    """Distinct keys in a call then mean distinct target rows: no UPDATE
    meets a target row twice, and an INSERT conflicts as per row would."""
    with psycopg.connect(store._pg.url) as conn:
        for name, variant in SET_WRITES.items():
            unique = {
                frozenset(row[0])
                for row in conn.execute(
                    """
                    SELECT array_agg(a.attname::text)
                    FROM pg_index i
                    JOIN pg_class c ON c.oid = i.indrelid
                    JOIN pg_namespace s ON s.oid = c.relnamespace
                    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY (i.indkey)
                    WHERE s.nspname = %s AND c.relname = %s AND i.indisunique
                      AND i.indpred IS NULL
                    GROUP BY i.indexrelid
                    """,
                    (store.schema, variant.table),
                ).fetchall()
            }
            assert frozenset(variant.key) in unique, (name, variant.table, unique)


# --- any batch: set form and per row agree ------------------------------------------------------


class _Rollback(Exception):
    def __init__(self, state: object) -> None:
        super().__init__("roll back")
        self.state = state


_STATUSES = st.sampled_from(["queued", "running", "failed", "completed"])


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    statuses=st.lists(
        st.tuples(st.booleans(), _STATUSES, _STATUSES, st.booleans(), st.none() | st.just("boom")),
        max_size=5,
    ),
    bumps=st.lists(st.integers(0, 3), max_size=5),
    acks=st.lists(st.tuples(st.sampled_from(["d-0", "d-1", "d-9"]), st.booleans()), max_size=4),
)
def test_any_batch_writes_what_per_row_statements_write(
    setup_store: PostgresStore,
    statuses: list[tuple[bool, str, str, bool, str | None]],
    bumps: list[int],
    acks: list[tuple[str, bool]],
) -> None:
    store = setup_store
    task = store.list_tasks("run-1")[0]
    status_rows = [
        {
            "task_id": task.task_id if known else "nope",
            "old": old,
            "new": new,
            "attempt_id": task.attempt_id if current else "other",
            "error": error,
            "now": 3.0,
        }
        for known, old, new, current, error in statuses
    ]
    bump_rows = [{"run_id": "run-1", "node_index": n} for n in bumps]
    ack_rows = [{"delivery_id": d, "worker_id": "w" if mine else "x"} for d, mine in acks]
    states = []
    for mode in ("set", "row"):
        try:
            with nullcontext() if mode == "set" else per_row(), store._pg.write() as tx:
                tx.many("task_set_status", status_rows)
                tx.many("node_bump", bump_rows)
                tx.many("queue_ack", ack_rows)
                raise _Rollback(
                    (
                        tx.all("tasks_of_run", {"run_id": "run-1", "all": 1}),
                        sorted(
                            tx.all("nodes_of_run", {"run_id": "run-1"}),
                            key=lambda row: row["node_index"],
                        ),
                        tx.all("deliveries_list", {"run_id": "run-1"}),
                    )
                )
        except _Rollback as rolled:
            states.append(rolled.state)
    assert states[0] == states[1]


@pytest.fixture
def setup_store(store: PostgresStore) -> PostgresStore:
    """A started run whose queue holds two rows leased to worker ``w``."""
    _started(store)
    rows = _lease_rows(store, [10.0, 11.0])
    with store._pg.write() as tx:
        tx.many("queue_lease", rows)
    return store
