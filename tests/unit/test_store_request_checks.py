"""Every backend refuses a malformed request with the same typed error, field
and message: the checks of :mod:`dagwerk.backends.requests`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.backends.requests import check_run_definition, check_terminal_request
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import NodeDisposition, RunStatus
from dagwerk.errors import DagwerkError
from dagwerk.limits import DEFAULT_LIMITS, Limits
from dagwerk.lineage import RunLink
from dagwerk.models import DagNode
from dagwerk.store import InvalidStoreValueError

NODES = [DagNode(slug="a", plugin="a")]
LINK = RunLink(
    run_id="child", parent_run_id="run", parent_task_id="t", root_run_id="run", lineage="x"
)

BAD_REQUESTS: dict[str, Callable[[Any], object]] = {
    "run id": lambda s: s.create_run("", NODES),
    "nodes": lambda s: s.create_run("r2", "a"),
    "node type": lambda s: s.create_run("r2", [NODES[0], "b"]),
    "run input": lambda s: s.create_run("r2", NODES, run_input={"x": "y" * 200}),
    "list limit": lambda s: s.list_runs(limit=0),
    "terminal status": lambda s: s.try_finalize_run("run", RunStatus.RUNNING),
    "cause and reason": lambda s: s.try_finalize_run(
        "run", RunStatus.FAILED, cause=object(), reason="x"
    ),
    "cancel reason": lambda s: s.try_cancel_run("run", reason=3),
    "snapshot limit": lambda s: s.get_planning_snapshot(
        "run", 0, {}, max_outputs_per_edge=-1, max_outputs_total=1, max_routing_bytes=1
    ),
    "snapshot node": lambda s: s.get_planning_snapshot(
        "run", 5, {}, max_outputs_per_edge=1, max_outputs_total=1, max_routing_bytes=1
    ),
    "snapshot source": lambda s: s.get_planning_snapshot(
        "run", 0, {"e": 9}, max_outputs_per_edge=1, max_outputs_total=1, max_routing_bytes=1
    ),
    "launch plugin": lambda s: s.try_create_node_launch(
        "run", 0, "other", "token", (), NodeDisposition.SKIPPED
    ),
    "launch zero disposition": lambda s: s.try_create_node_launch("run", 0, "a", "token", (), None),
    "launch plan type": lambda s: s.try_create_node_launch(
        "run",
        0,
        "a",
        s.get_planning_snapshot(
            "run", 0, {}, max_outputs_per_edge=1, max_outputs_total=1, max_routing_bytes=9
        ).token,
        ("plan",),
        None,
    ),
    "claim limit": lambda s: s.dequeue("w", limit=0, lease_seconds=1),
    "nack reason": lambda s: s.nack("d", "w", reason=1),
    "stall nodes": lambda s: s.try_record_stall("run", "why", (-1,)),
    "lease name": lambda s: s.try_acquire_lease("", "holder", 1.0),
    "budget": lambda s: s.try_set_run_budget("run", "lots"),
    "admission": lambda s: s.try_admit_task(
        "t", expected_attempt_id="a", input_bytes=-1, cost_units=None
    ),
    "child link": lambda s: s.create_child_run("other", NODES, link=LINK),
    "wait link": lambda s: s.try_wait_for_child(
        "t", expected_attempt_id="a", expected_generation=0, nodes=NODES, link=LINK
    ),
}


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[list[Any]]:
    limits = Limits(max_run_input_bytes=100)
    opened: list[Any] = [MemoryStore(limits=limits), SqliteStore(tmp_path / "s.db", limits=limits)]
    for store in opened:
        assert store.create_run("run", NODES)
        assert store.try_start_run("run")
    yield opened
    opened[1].close()


def _refusal(call: Callable[[Any], object], store: Any) -> tuple[str, str | None, str]:
    with pytest.raises(DagwerkError) as caught:
        call(store)
    return type(caught.value).__name__, getattr(caught.value, "field", None), str(caught.value)


@pytest.mark.parametrize("request_name", sorted(BAD_REQUESTS))
def test_every_backend_refuses_a_bad_request_alike(request_name: str, stores: list[Any]) -> None:
    call = BAD_REQUESTS[request_name]
    memory, sqlite = (_refusal(call, store) for store in stores)
    assert memory == sqlite


def test_the_checks_name_the_field_and_limit() -> None:
    with pytest.raises(InvalidStoreValueError) as caught:
        check_run_definition(
            "r",
            [NODES[0], 1],
            run_input=None,
            failure_policy="fail_fast",
            pipeline=None,
            limits=DEFAULT_LIMITS,
        )
    assert caught.value.field == "nodes[1]"
    with pytest.raises(DagwerkError) as too_big:
        check_run_definition(
            "r",
            NODES,
            run_input={"x": "y" * 200},
            failure_policy="fail_fast",
            pipeline=None,
            limits=Limits(max_run_input_bytes=100),
        )
    assert (too_big.value.field, too_big.value.limit) == ("run_input", 100)
    assert check_terminal_request("completed", None, None) is RunStatus.COMPLETED
