"""The claim-ahead policy: untimed and long plugins are never claimed ahead,
the count never exceeds its limit nor what the runners start within the
horizon, a slow attempt stops the claim ahead of its plugin at once; and the
batched path claims within that bound with at most ``concurrency`` plugins
running at once."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import InputMode, RunStatus
from dagwerk.errors import DagwerkError
from dagwerk.models import DagNode, EdgeSource, InputEdge, TaskInputs
from dagwerk.orchestrator import OrchestratorCallbacks, start_run
from dagwerk.runtime.claim_ahead import ClaimAheadPolicy
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.settings import WorkerSettings
from dagwerk.runtime.worker import Worker


def test_untimed_plugins_are_never_claimed_ahead() -> None:
    policy = ClaimAheadPolicy(concurrency=4, limit=64, horizon=0.05)
    assert policy.plan({"a", "b"}) == (0, frozenset())
    policy.observe("a", 0.0001)
    assert policy.plan({"a", "b"}) == (64, frozenset({"a"}))
    assert policy.plan({"b"}) == (0, frozenset())  # only what the worker serves


def test_long_plugins_are_never_claimed_ahead() -> None:
    policy = ClaimAheadPolicy(concurrency=4, limit=64, horizon=0.05)
    policy.observe("long", 1.0)  # 4 runners start 0.2 of these within 50 ms
    assert policy.plan({"long"}) == (0, frozenset())
    policy.observe("medium", 0.02)  # 10 within 50 ms
    assert policy.plan({"long", "medium"}) == (10, frozenset({"medium"}))


def test_a_slow_attempt_stops_the_claim_ahead_at_once_and_fast_ones_resume_it() -> None:
    policy = ClaimAheadPolicy(concurrency=1, limit=8, horizon=0.1)
    policy.observe("p", 0.001)
    assert policy.plan({"p"})[0] == 8
    policy.observe("p", 5.0)
    assert policy.plan({"p"}) == (0, frozenset())
    rounds = 0
    while policy.plan({"p"})[0] == 0:
        policy.observe("p", 0.001)
        rounds += 1
    assert 10 < rounds < 40  # decays, no single fast attempt forgets the slow one


def test_a_rare_slow_plugin_does_not_shrink_the_claim_of_fast_ones() -> None:
    policy = ClaimAheadPolicy(concurrency=4, limit=64, horizon=0.05)
    policy.observe("fast", 0.00005)
    policy.observe("root", 0.01)  # 20 start within the horizon: under half of 64
    assert policy.plan({"fast", "root"}) == (64, frozenset({"fast"}))
    policy.observe("twin", 0.0001)
    assert policy.plan({"fast", "root", "twin"}) == (64, frozenset({"fast", "twin"}))


def test_the_claim_never_exceeds_its_bound() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        concurrency = rng.randint(1, 32)
        limit = rng.randint(0, 128)
        horizon = rng.uniform(0.001, 1.0)
        policy = ClaimAheadPolicy(concurrency=concurrency, limit=limit, horizon=horizon)
        names = [f"p{n}" for n in range(rng.randint(1, 6))]
        for _ in range(rng.randint(0, 20)):
            policy.observe(rng.choice(names), rng.choice([0.0, rng.uniform(0, 2.0) ** 3]))
        count, plugins = policy.plan(set(names))
        assert 0 <= count <= limit
        assert plugins <= set(names)
        assert (count == 0) == (not plugins)
        for name in plugins:
            estimate = policy.estimate(name)
            assert estimate is not None
            # Every plugin taken lets its whole count start within the horizon.
            assert count * estimate <= concurrency * horizon + 1e-12


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("claim_ahead", -1),
        ("claim_ahead", 1025),
        ("claim_ahead", 2.0),
        ("claim_ahead", True),
        ("claim_ahead_horizon", 0),
        ("claim_ahead_horizon", float("nan")),
        ("claim_ahead_horizon", 61.0),
        ("claim_ahead_horizon", True),
    ],
)
def test_settings_refuse_a_bad_claim_ahead(field: str, value: object, tmp_path: Path) -> None:
    with pytest.raises(DagwerkError) as raised:
        WorkerSettings(execution_root=tmp_path, **{field: value})  # type: ignore[arg-type]
    assert raised.value.field == field


class _CountingStore(SqliteStore):
    """Records the limit of every claim and the deliveries claimed per batch."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.claim_limits: list[int] = []

    def claim_deliveries(self, worker_id: str, *, limit: int, **kwargs: object):  # type: ignore[no-untyped-def]
        self.claim_limits.append(limit)
        return super().claim_deliveries(worker_id, limit=limit, **kwargs)  # type: ignore[arg-type]


def test_a_worker_claims_ahead_within_its_bound_and_runs_at_most_concurrency(
    tmp_path: Path,
) -> None:
    lock = threading.Lock()
    inside = [0, 0]  # now, most ever

    def gen(inputs: TaskInputs, ctx: TaskContext) -> object:
        return [{"n": n} for n in range(300)]

    def step(inputs: TaskInputs, ctx: TaskContext) -> object:
        with lock:
            inside[0] += 1
            inside[1] = max(inside)
        try:
            if int(str(inputs.parameters["n"])) % 50 >= 44:
                ctx.cancelled.wait(0.01)  # six in a row: long enough for more runners
            return {}
        finally:
            with lock:
                inside[0] -= 1

    store = _CountingStore(str(tmp_path / "c.db"))
    nodes = [
        DagNode(slug="gen", plugin="gen"),
        DagNode(
            slug="step",
            plugin="step",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="items", source="gen"),),
            bindings={"n": EdgeSource(edge="items", field="n")},
        ),
    ]
    assert store.create_run("run-1", nodes)
    callbacks = OrchestratorCallbacks(*(lambda run_id: None,) * 4)
    start_run(store, "run-1", callbacks=callbacks)
    worker = Worker(
        store,
        {"gen": gen, "step": step},
        concurrency=3,
        claim_ahead=10,
        execution_root=tmp_path,
        backstop_interval=None,
    )
    try:
        handled = worker.run_until_idle()
    finally:
        worker.stop()
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    assert handled == 301
    assert 10 in store.claim_limits  # it did claim ahead
    assert max(store.claim_limits) <= 10 and set(store.claim_limits) <= set(range(1, 11))
    assert inside[1] <= 3
    # Fewer rounds than the concurrency alone allows.
    assert len([limit for limit in store.claim_limits if limit == 3]) < 300 / 3
    store.close()
