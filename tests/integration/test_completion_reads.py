"""On PostgreSQL a worker's completions read, with their commit, what the
reconcile after them reads next (``CompletionReadsStore``): a chain's hop
makes one read transaction (the run's status before the task runs), not
three, and what the reconcile decides from those reads is what it decides
from reads of its own (through ``Engine``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from dagwerk.backends.postgres import gateway as pg_gateway
from dagwerk.backends.postgres.store import PostgresStore
from dagwerk.constants import InputMode, RunStatus
from dagwerk.engine import Engine
from dagwerk.models import EmittedOutput
from dagwerk.store import ClaimedDelivery, CompletionRequest, TaskCompletionResult
from dagwerk.testing.helpers import chain, child, root

STEPS = 6


@pytest.fixture
def url(postgres_url: str, pg_schema: str) -> str:
    return f"{postgres_url}{'&' if '?' in postgres_url else '?'}schema={pg_schema}"


@pytest.fixture
def transactions(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Transactions of the PostgreSQL gateway that sent a statement, by kind
    (read, write); one opened and left without a statement costs nothing."""
    seen: Counter[str] = Counter()
    sent: dict[int, object] = {}  # held, so that no id() is reused
    call = pg_gateway.PostgresTx._call

    def on_call(self: Any, kind: str, name: str, params: Any, rows: Any = None) -> Any:
        if id(self) not in sent:
            sent[id(self)] = self
            seen["write" if self._write else "read"] += 1
        seen[f"call {kind}"] += 1
        return call(self, kind, name, params, rows)

    monkeypatch.setattr(pg_gateway.PostgresTx, "_call", on_call)
    return seen


def test_a_chains_hop_reads_its_frontier_and_snapshot_with_the_completion(
    url: str, transactions: Counter[str], tmp_path: Any
) -> None:
    with Engine(url, execution_root=tmp_path) as engine:
        for n in range(STEPS):
            engine.plugin(f"n{n}")(lambda inputs, ctx: [{"n": 1}])
        run_id = engine.submit(chain(STEPS))
        # The attempt monitor's status polls (every cancel_check_interval
        # while a task runs) would add reads on a slow machine.
        worker = engine.worker(concurrency=1, cancel_check_interval=600.0)
        assert worker.process_once() == 1  # the root: from its completion on, hops
        transactions.clear()
        hops = STEPS - 2
        for _ in range(hops):
            assert worker.process_once() == 1
        # Per hop: the status read, and one write transaction for the
        # completion (with the next node's frontier and snapshot) and the
        # launch (which claims the next task): each task is its launch's
        # only one, so the worker expects its completion to end the launch.
        # Calls that wait for the server: the status; the completion's reads,
        # then its writes with the reads ahead; the launch's look at the
        # queue. The launch reads nothing else: the unit holds the run, so
        # the snapshot read with the completion is still current. Its writes
        # go with the transaction's COMMIT.
        assert transactions == Counter(
            {
                "read": hops,
                "write": hops,
                "call one": hops,
                "call all_of": 2 * hops,
                "call all": hops,
                # Writes sent without waiting: the completion's five in one
                # statement, the launch's four in another.
                "call together": 2 * hops,
            }
        ), transactions
        worker.run_until_idle()
        worker.stop()
        assert engine.store.get_run_status(run_id) is RunStatus.COMPLETED
        result = engine.result(run_id)
        assert all(len(result.outputs[f"n{n}"]) == 1 for n in range(STEPS))


def _claim_one(store: PostgresStore, worker: str) -> ClaimedDelivery:
    (claimed,) = store.claim_deliveries(worker, limit=1, lease_seconds=60.0)
    assert claimed.task is not None
    return claimed


def _complete(store: PostgresStore, worker: str, claimed: ClaimedDelivery, value: int) -> Any:
    assert claimed.task is not None
    request = CompletionRequest(
        task_id=claimed.task.task_id,
        expected_attempt_id=claimed.task.attempt_id,
        outputs=(EmittedOutput(id=f"o{value}", fields={"v": value}, data={"v": value}),),
        delivery_id=claimed.delivery.delivery_id,
        run_id=claimed.task.run_id,
    )
    (outcome,) = store.complete_and_ack(worker, [request])
    assert isinstance(outcome, TaskCompletionResult)
    return outcome


@pytest.fixture
def theirs(url: str) -> Iterator[PostgresStore]:
    """A second store on the same database: another worker process's."""
    store = PostgresStore(url)
    try:
        yield store
    finally:
        store.close()


def test_the_reads_ahead_answer_as_reads_of_their_own_and_only_once(
    url: str, theirs: PostgresStore, transactions: Counter[str], tmp_path: Any
) -> None:
    """Roots ``a`` and ``b``; ``j`` joins them, ``c`` follows ``b`` alone. The
    parents complete on two stores (as two workers would): the second
    completion's frontier sees both parents complete, ``c``'s snapshot comes
    with it, and both equal reads of their own made after the block."""
    with Engine(url, execution_root=tmp_path) as engine:
        ours: PostgresStore = engine.store
        nodes = [root("a"), root("b"), child("j", "a", "b", mode=InputMode.ALL), child("c", "b")]
        for node in nodes:
            engine.plugin(node.plugin)(lambda inputs, ctx: [{"v": 1}])
        run_id = engine.submit(nodes)
        for store in (ours, theirs):  # what the worker has at hand after its first claim
            assert store.get_run_topology(run_id) is not None
        claims = [_claim_one(theirs, "w1"), _claim_one(ours, "w2")]
        by_node = {claim.task.node_index: claim for claim in claims if claim.task}
        with theirs.reads_with_completions():
            _complete(theirs, "w1", by_node[0], 1)  # a
        limits = ours.limits
        snapshot_args: dict[str, Any] = {
            "max_outputs_per_edge": limits.max_snapshot_outputs_per_edge,
            "max_outputs_total": limits.max_snapshot_outputs_per_node,
            "max_routing_bytes": limits.max_snapshot_routing_bytes,
        }
        with ours.reads_with_completions():
            assert _complete(ours, "w2", by_node[1], 2).launch_complete  # b
            transactions.clear()
            ahead = ours.get_run_frontier(run_id, [0, 1, 2, 3])
            snapshot_ahead = ours.get_planning_snapshot(run_id, 3, {"b": 1}, **snapshot_args)
            assert +transactions == Counter(), transactions  # neither read on its own
            again = ours.get_run_frontier(run_id, [0, 1, 2, 3])
            snapshot_again = ours.get_planning_snapshot(run_id, 3, {"b": 1}, **snapshot_args)
            assert transactions["read"] == 2, transactions  # once each
        assert ahead is not None
        assert ahead == again == ours.get_run_frontier(run_id, [0, 1, 2, 3])
        assert sorted(i for i, launch in ahead.launches.items() if launch.complete) == [0, 1]
        assert {2, 3}.isdisjoint(ahead.launches)
        fresh = ours.get_planning_snapshot(run_id, 3, {"b": 1}, **snapshot_args)
        for snapshot in (snapshot_ahead, snapshot_again):
            assert snapshot.model_dump() == fresh.model_dump()
        assert [ref.id for ref in fresh.outputs_by_edge["b"]] == ["o2"]
