"""Query plans of the PostgreSQL store where a list of IDs meets a large run.

A join (ALL) node names every output of its source: resolving, validating
and reserving such a list used ``output_id = ANY (ARRAY(...))``, which the
planner applied as a filter on the run's outputs fetched by another index,
comparing each row with the whole list (1,000 IDs against 2,000 outputs took
~19 ms per query, ~1.5 ms as a join). The test reads the plans on a fresh
table, as a new run's are, and asserts that no list is scanned per row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dagwerk.backends.postgres import PostgresStore
from dagwerk.backends.postgres.gateway import QUERIES
from dagwerk.testing.helpers import new_run, root

RUN_ID = "run-1"
OUTPUTS = 2_000


def _row(cursor: psycopg.Cursor[Any]) -> Any:
    row = cursor.fetchone()
    assert row is not None
    return row


def _filters(plan: dict[str, Any]) -> Iterator[str]:
    for key in ("Filter", "Join Filter"):
        if key in plan:
            yield plan[key]
    for child in plan.get("Plans", []):
        yield from _filters(child)


@pytest.mark.parametrize("name", ["outputs_resolve", "outputs_valid_by_ids", "outputs_reserved"])
def test_a_long_id_list_is_joined_not_scanned_per_row(
    postgres_url: str, pg_schema: str, name: str
) -> None:
    with PostgresStore(postgres_url, schema=pg_schema) as store:
        new_run(store, [root("src")], RUN_ID)
    with psycopg.connect(
        postgres_url, autocommit=True, options=f"-c search_path={pg_schema}"
    ) as conn:
        conn.execute(
            "INSERT INTO dagwerk_outputs (run_id, output_id, node_index, fields, data, "
            "routing_size) SELECT %s, 'o' || n, 0, '{}', 'null', 2 "
            "FROM generate_series(1, %s) AS n",
            (RUN_ID, OUTPUTS),
        )
        wanted = json.dumps([f"o{n}" for n in range(1, OUTPUTS, 2)] + ["o1", "missing"])
        params = {"run_id": RUN_ID, "ids": wanted}
        rows = conn.execute(QUERIES[name].main, params).fetchall()
        assert len(rows) == OUTPUTS // 2  # each wanted output once, duplicates folded
        (plan,) = _row(conn.execute(b"EXPLAIN (FORMAT JSON) " + QUERIES[name].main, params))
        filters = list(_filters(plan[0]["Plan"]))
        assert not [f for f in filters if "ANY" in f], filters
        # The gateway's connections keep one generic plan per statement
        # (test_postgres_plan_cache.py): that plan joins the list too.
        generic = _generic_plan(conn, QUERIES[name].main, params)
        filters = list(_filters(generic))
        assert not [f for f in filters if "ANY" in f], filters


def _generic_plan(
    conn: psycopg.Connection[Any], query: bytes, params: dict[str, Any], *, analyze: bool = False
) -> Any:
    """The plan a prepared ``query`` runs with under ``force_generic_plan``
    (run, with its actual rows, when ``analyze``)."""
    order: list[str] = []

    def number(match: re.Match[bytes]) -> bytes:
        name = match.group(1).decode()
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}".encode()

    text = re.sub(rb"%\((\w+)\)s", number, query).replace(b"%%", b"%")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(b"PREPARE generic_probe AS " + text)
    try:
        # The arguments as literals: EXPLAIN cannot type parameters of its own.
        arguments = sql.SQL(", ").join(sql.Literal(params[name]) for name in order)
        (plan,) = _row(
            conn.execute(
                sql.SQL("EXPLAIN ({}FORMAT JSON) EXECUTE generic_probe ({})").format(
                    sql.SQL("ANALYZE, " if analyze else ""), arguments
                )
            )
        )
    finally:
        conn.execute("DEALLOCATE generic_probe")
        conn.execute("RESET plan_cache_mode")
    return plan[0]["Plan"]


def _rows_read(plan: dict[str, Any], relation: str) -> int:
    """Rows the plan's scans of ``relation`` returned (EXPLAIN ANALYZE)."""
    own = int(plan.get("Actual Rows", 0)) * int(plan.get("Actual Loops", 1))
    found = own if plan.get("Relation Name") == relation else 0
    return found + sum(_rows_read(child, relation) for child in plan.get("Plans", []))


@pytest.mark.parametrize("statistics", ["fresh", "analyzed"])
@pytest.mark.parametrize("name", ["outputs_resolve", "outputs_valid_by_ids", "outputs_reserved"])
def test_a_batch_of_ids_reads_only_its_outputs_of_a_wide_run(
    postgres_url: str, pg_schema: str, name: str, statistics: str
) -> None:
    """A worker resolves the inputs of a batch of 32 tasks by their output
    IDs. On a table without statistics (a new store's, until autovacuum
    analyses it, up to a minute later) the join read every output of the run
    into a hash, ~45 ms a batch at 100,000 outputs: one W3 run in two on
    PostgreSQL took twice as long. Each plan must read only the wanted rows."""
    with PostgresStore(postgres_url, schema=pg_schema) as store:
        new_run(store, [root("src")], RUN_ID)
    with psycopg.connect(
        postgres_url, autocommit=True, options=f"-c search_path={pg_schema}"
    ) as conn:
        # Statistics as the test says, not as autovacuum's timing has them.
        conn.execute("ALTER TABLE dagwerk_outputs SET (autovacuum_enabled = false)")
        conn.execute(
            "INSERT INTO dagwerk_outputs (run_id, output_id, node_index, fields, data, "
            "routing_size, invalidated) SELECT %s, 'o' || n, 0, '{}', 'null', 2, "
            "CASE WHEN n = 7 THEN 1 ELSE 0 END FROM generate_series(1, %s) AS n",
            (RUN_ID, OUTPUTS),
        )
        if statistics == "analyzed":
            conn.execute("ANALYZE dagwerk_outputs")
        ids = [f"o{n}" for n in range(1, 31)] + ["o1", "missing"]
        params = {"run_id": RUN_ID, "ids": json.dumps(ids)}
        found = sorted(row[0] for row in conn.execute(QUERIES[name].main, params))
        valid = [i for i in ids[:30] if name == "outputs_reserved" or i != "o7"]
        assert found == sorted(valid)  # each once; an invalidated one stays reserved
        (plan,) = _row(
            conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + QUERIES[name].main, params)
        )
        generic = _generic_plan(conn, QUERIES[name].main, params, analyze=True)
        for each in (plan[0]["Plan"], generic):
            assert _rows_read(each, "dagwerk_outputs") <= len(ids), each


def test_stopping_a_run_finds_its_queue_rows_without_reading_every_task(
    postgres_url: str, pg_schema: str
) -> None:
    """A run's stop (its finish, a cancel, a node's reset) locks and drops
    the queue rows of its active tasks. It finds them by the queue rows' own
    run: reading every task of the run took ~2 ms per 1,000 tasks, at every
    finish, although a finished run's queue is empty."""
    tasks = 2_000
    with PostgresStore(postgres_url, schema=pg_schema) as store:
        new_run(store, [root("src")], RUN_ID)
    with psycopg.connect(postgres_url, options=f"-c search_path={pg_schema}") as conn:
        conn.execute(
            "INSERT INTO dagwerk_tasks (task_id, run_id, node_index, generation, launch_id, "
            "status, attempt_id, plan, invalidated) "
            "SELECT 't' || n, r.run_id, 0, 0, l.launch_id, 'completed', 'a' || n, '{}', "
            "CASE WHEN n = 3 THEN 1 ELSE 0 END "
            "FROM generate_series(1, %s) AS n, dagwerk_runs AS r, dagwerk_launches AS l "
            "WHERE r.run_id = %s AND l.run_id = r.run_id",
            (tasks, RUN_ID),
        )
        # Queue rows of two active tasks and of an invalidated one (kept).
        conn.execute(
            "INSERT INTO dagwerk_deliveries (delivery_id, task_id, attempt_id, generation, "
            "run_id, node_index, launch_id, queue, priority, available_at) "
            "SELECT 'd' || t.task_id, t.task_id, t.attempt_id, 0, t.run_id, 0, t.launch_id, "
            "'default', 0, 0 FROM dagwerk_tasks AS t WHERE t.task_id IN ('t1', 't2', 't3')"
        )
        # No ANALYZE: the plans of a fresh table, as a new store's are.
        (queued,) = _row(conn.execute("SELECT count(*) FROM dagwerk_deliveries"))
        assert queued == 4  # with the root task's
        params = {"run_id": RUN_ID, "node_index": None}
        for statement in (
            QUERIES["waits_invalidate_active"].preludes[0],
            QUERIES["deliveries_drop_active"].main,
        ):
            (plan,) = _row(conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params))
            # At most one task per queue row of the run, not every task.
            assert _rows_read(plan[0]["Plan"], "dagwerk_tasks") <= queued, plan
        left = conn.execute("SELECT task_id FROM dagwerk_deliveries ORDER BY task_id").fetchall()
        conn.rollback()
    # The rolled-back EXPLAIN ANALYZE of the delete removed exactly the
    # queue rows of the active tasks.
    assert [row[0] for row in left] == ["t3"]
