"""Prepared statements of the PostgreSQL gateway.

Every statement is prepared on its first use on a connection (psycopg's
``prepare_threshold=0``; its default prepared a statement at its sixth
call): a worker's young connections used to parse and plan most statements
of a short run afresh at every call, about a fifth of the server's time in a
1,000-task fan-out. The server's plan cache then plans a prepared statement
for its values five times before it settles on a generic plan that is no
worse, so a plan is never fixed while a new run's tables are still tiny.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from dagwerk.backends.postgres import PostgresStore
from dagwerk.backends.postgres.gateway import QUERIES, PostgresGateway
from dagwerk.orchestrator import reconcile_run
from dagwerk.store import CompletionRequest
from dagwerk.testing.helpers import child, emit, new_run, root

_NAMED = re.compile(r"%\((\w+)\)s")


def _server_text(query: bytes) -> str:
    """``query`` as the server holds it once psycopg prepared it: each
    ``%(name)s`` a ``$n``, numbered by first appearance."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    return _NAMED.sub(number, query.decode()).replace("%%", "%")


# --- against a server ---------------------------------------------------------------------------


@pytest.fixture
def store(postgres_url: str, pg_schema: str) -> Iterator[PostgresStore]:
    with PostgresStore(postgres_url, schema=pg_schema, pool_size=1) as opened:
        yield opened


def _fan_out(store: PostgresStore, size: int) -> None:
    """A root emits ``size`` outputs; its EACH child's tasks are claimed and
    completed in one call each, as a worker does."""
    log = new_run(store, [root("r"), child("c", "r")])
    for _ in range(2):
        entries = store.claim_deliveries("w1", limit=size, lease_seconds=30.0)
        done = store.complete_and_ack(
            "w1",
            [
                CompletionRequest(
                    task_id=e.delivery.task_id,
                    expected_attempt_id=e.delivery.attempt_id,
                    outputs=emit(*(f"{e.delivery.task_id}-{k}" for k in range(size))),
                    delivery_id=e.delivery.delivery_id,
                )
                for e in entries
            ],
        )
        assert entries and all(outcome is not None for outcome in done)
        reconcile_run(store, "run-1", callbacks=log.callbacks)


def _prepared(store: PostgresStore) -> list[tuple[str, int]]:
    """The statements prepared on the store's connection, with the number of
    times each ran prepared."""
    with store._pg.read() as tx:
        rows = (
            tx.plain()
            .execute(
                "SELECT statement, generic_plans + custom_plans AS n FROM pg_prepared_statements"
            )
            .fetchall()
        )
    return [(row["statement"], row["n"]) for row in rows]


def test_the_worker_cycles_statements_are_prepared_at_their_first_call(
    store: PostgresStore,
) -> None:
    _fan_out(store, 3)
    texts = {_server_text(QUERIES[name].main): name for name in QUERIES}
    prepared = {texts[text]: calls for text, calls in _prepared(store) if text in texts}
    # The claim's and the completion's reads ran twice each on the store's
    # one connection: both times prepared (by default, neither would be).
    assert prepared["tasks_claimable_many"] == 2
    assert prepared["tasks_get_owned_many"] == 2
    assert "queue_lease_next" in prepared


def test_the_urls_options_are_kept_and_the_schema_wins(postgres_url: str) -> None:
    schema = f"plans_{uuid.uuid4().hex[:16]}"
    joiner = "&" if "?" in postgres_url else "?"
    url = (
        f"{postgres_url}{joiner}options="
        "-c%20statement_timeout%3D12345%20-c%20search_path%3Delsewhere"
    )
    gateway = PostgresGateway(url, schema=schema, pool_size=1)
    try:
        with gateway.read() as tx:
            conn = tx.plain()
            shown = {
                name: conn.execute(f"SHOW {name}").fetchone()
                for name in ("statement_timeout", "search_path")
            }
    finally:
        gateway.close()
    assert shown["statement_timeout"] == {"statement_timeout": "12345ms"}
    assert shown["search_path"] == {"search_path": schema}
