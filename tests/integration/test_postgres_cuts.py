"""A connection cut in the middle of a write transaction, at every point a
settle or a launch can be cut, through the proxy of
``dagwerk.testing.pg_proxy``.

For each cut point the cut write either applied all of its transaction or
none of it (never a part), a call that fails raises a transient
``StoreUnavailableError`` naming the server, and the same call repeated on
the same store object applies once: a completion is settled once with one
output and no delivery left, a launch makes one task and one delivery. A
cut before the server got a write leaves nothing; a cut of a settle's
``COMMIT`` flight after the server got it (its answer lost) leaves the
settle applied, and the repeat returns the first result. A cut before the server acknowledged
anything of the transaction does not fail the call at all: the gateway
sends the transaction again on a new connection.

The cut points are the client's writes counted from the transaction's
``BEGIN`` of a write (a statement's first use on a connection sends its
text, later ones its prepared name, so the count varies with the
connection), and the write's ``COMMIT`` flight found by its text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from dagwerk.backends.errors import StoreUnavailableError
from dagwerk.backends.postgres import PostgresStore
from dagwerk.constants import TaskStatus
from dagwerk.orchestrator import reconcile_run
from dagwerk.runtime.faults import FaultKind, classify
from dagwerk.store import CompletionRequest, TaskCompletionResult
from dagwerk.testing.helpers import CallbackLog, chain, emit, new_run, tasks_of
from dagwerk.testing.pg_proxy import DelayProxy

BEGIN_WRITE = b"BEGIN ISOLATION LEVEL READ COMMITTED"
BEGIN_READ = b"BEGIN ISOLATION LEVEL REPEATABLE READ"
# The COMMIT statement's Parse message (unnamed statement, then its text).
COMMIT = b"\x00COMMIT\x00"
# More client writes than a settle or a launch makes: the loops end when a
# cut no longer fires.
MAX_POINTS = 40


@dataclass
class Stores:
    proxy: DelayProxy
    store: PostgresStore  # through the proxy
    direct: PostgresStore  # to the server itself, for setting up and looking


@pytest.fixture
def stores(postgres_url: str, pg_schema: str) -> Iterator[Stores]:
    schema = pg_schema
    proxy = DelayProxy(postgres_url, 0.0)
    store = PostgresStore(proxy.url, schema=schema, pool_size=2, reconnect_timeout=10.0)
    direct = PostgresStore(postgres_url, schema=schema, pool_size=1)
    try:
        yield Stores(proxy, store, direct)
    finally:
        store.close()
        direct.close()
        proxy.stop()


@dataclass
class Case:
    """One cut operation: ``call`` is cut, ``state`` tells before from after."""

    call: Callable[[], object]
    state: Callable[[], object]
    before: object
    after: object


def _settle_case(stores: Stores, run_id: str) -> Case:
    direct = stores.direct
    new_run(direct, chain(2), run_id)
    (claimed,) = direct.claim_deliveries("w", limit=1, lease_seconds=600.0)
    row = claimed.delivery
    request = CompletionRequest(
        row.task_id, row.attempt_id, emit("out-0", k=1), row.delivery_id, run_id
    )

    def call() -> None:
        (outcome,) = stores.store.complete_and_ack("w", [request])
        assert isinstance(outcome, TaskCompletionResult), outcome

    def state() -> object:
        task = direct.get_task(row.task_id)
        assert task is not None
        attempts = [a.status for a in direct.list_attempts(row.task_id)]
        outputs = direct.get_output_ids(run_id, 0)
        return (task.status, attempts, outputs, len(direct.list_deliveries(run_id)))

    before = state()
    assert before == (TaskStatus.RUNNING, [None], (), 1)  # the attempt runs, unsettled
    return Case(call, state, before, (TaskStatus.COMPLETED, [TaskStatus.COMPLETED], ("out-0",), 0))


def _launch_case(stores: Stores, run_id: str) -> Case:
    direct = stores.direct
    log = CallbackLog()
    new_run(direct, chain(2), run_id, log=log)
    # The earlier cases' launched tasks come along; they stay leased.
    claimed = direct.claim_deliveries("w", limit=5, lease_seconds=600.0)
    (row,) = [c.delivery for c in claimed if c.delivery.run_id == run_id]
    request = CompletionRequest(
        row.task_id, row.attempt_id, emit("out-0", k=1), row.delivery_id, run_id
    )
    assert isinstance(direct.complete_and_ack("w", [request])[0], TaskCompletionResult)

    def state() -> object:
        return (
            direct.list_node_launches(run_id).get(1) is not None,
            len(tasks_of(direct, run_id, 1)),
            len(direct.list_deliveries(run_id)),
        )

    return Case(
        lambda: reconcile_run(stores.store, run_id, callbacks=log.callbacks),
        state,
        (False, 0, 0),
        (True, 1, 1),
    )


def _cut(
    stores: Stores, case: Case, chunk: int, *, forward: bool, at: bytes | None = None
) -> tuple[bool, object]:
    """Cut ``case`` at ``chunk`` writes after a write's ``BEGIN`` (or at the
    first write holding ``at``), check the outcome and
    the repeat; whether the cut fired, and the state it left. (A call of
    more than one transaction may be cut after its first committed, so even
    a cut write the server never got may leave the call's state done.)"""
    assert case.state() == case.before
    rule = stores.proxy.cut_after(
        BEGIN_WRITE, chunk, forward=forward, at=at, until=None if at is None else BEGIN_READ
    )
    error: StoreUnavailableError | None = None
    try:
        case.call()
    except StoreUnavailableError as caught:
        error = caught
    finally:
        stores.proxy.disarm()
    fired = rule.fired.is_set()
    if fired:
        assert rule.ended.wait(30), "the server did not end the cut session"
    cut = _settled(case)
    if error is None:
        # Not cut, or cut before the server acknowledged anything of the
        # transaction, which was sent again on a new connection.
        assert cut == case.after, (chunk, cut)
    else:
        assert fired
        assert classify(error) is FaultKind.TRANSIENT
        assert f"lost the connection to PostgreSQL at 127.0.0.1:{stores.proxy.port}" in str(error)
        assert cut in (case.before, case.after), (chunk, cut)
    case.call()  # the repeat, on the same store object
    assert case.state() == case.after
    case.call()  # and once more: nothing changes
    assert case.state() == case.after
    return fired, cut


def _settled(case: Case) -> object:
    """The state once two reads in a row agree. The proxy closing the cut
    session does not wait for the server: a ``COMMIT`` it received before the
    cut may still be landing, and the state's separate reads could straddle
    it (the commit itself is atomic, so the next read after it agrees)."""
    deadline = time.monotonic() + 20
    seen = case.state()
    while (again := case.state()) != seen:
        assert time.monotonic() < deadline, f"the state kept changing: {seen} then {again}"
        seen = again
    return seen


MAKERS = {"settle": _settle_case, "launch": _launch_case}


@pytest.mark.parametrize("forward", [False, True], ids=["before-server", "answer-lost"])
@pytest.mark.parametrize("operation", sorted(MAKERS))
def test_a_write_cut_anywhere_is_all_or_nothing_and_its_repeat_applies_once(
    stores: Stores, operation: str, forward: bool
) -> None:
    for point in range(MAX_POINTS):
        case = MAKERS[operation](stores, f"run-{point}")
        if not _cut(stores, case, point, forward=forward)[0]:
            assert point > 0
            return
    pytest.fail(f"a {operation} made more than {MAX_POINTS} client writes")


def test_a_commit_whose_answer_is_lost_was_applied_and_its_repeat_changes_nothing(
    stores: Stores,
) -> None:
    # A settle is one write transaction; a reconcile's launch may be
    # followed by other writes, whose COMMIT the rule could find instead.
    case = _settle_case(stores, "run-commit")
    rule = stores.proxy.cut_after(BEGIN_WRITE, 0, forward=True, at=COMMIT, until=BEGIN_READ)
    with pytest.raises(StoreUnavailableError, match="the write may or may not have been applied"):
        case.call()
    stores.proxy.disarm()
    assert rule.fired.is_set()
    assert rule.ended.wait(30), "the server did not end the cut session"
    assert case.state() == case.after
    case.call()
    assert case.state() == case.after


def test_a_commit_cut_before_the_server_got_it_applied_nothing(stores: Stores) -> None:
    # A settle is one write transaction; a reconcile's launch may be
    # followed by other writes, whose COMMIT the rule could find instead.
    case = _settle_case(stores, "run-commit")
    assert _cut(stores, case, 0, forward=False, at=COMMIT) == (True, case.before)
