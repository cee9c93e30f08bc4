"""Pure lineage and budget rules (CL-01, CL-04, CL-06, BG-03, BG-05)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagwerk.budgets import AccountUsage, Budget, cost_to_units, output_bytes, refuse_charge
from dagwerk.lineage import (
    Ancestor,
    ChildDepthExceededError,
    ChildRecursionError,
    LineageInvalidError,
    RunLineage,
    cancellation_anchors,
    check_lineage,
    child_lineage,
    decode_lineage,
    encode_lineage,
    pipeline_identity,
)
from dagwerk.models import DagNode, EmittedOutput


def _chain(depth: int, pipeline: str = "p", *, recursive: int | None = None) -> RunLineage:
    lineage: RunLineage | None = None
    for level in range(depth):
        lineage = child_lineage(
            lineage,
            parent_run_id=f"r{level}",
            parent_task_id=f"t{level}",
            parent_pipeline_id=f"q{level}" if lineage is None else lineage.pipeline_id,
            pipeline_id=pipeline if level == depth - 1 else f"q{level + 1}",
            allow_recursion=recursive is not None,
            max_recursion=recursive,
        )
    assert lineage is not None
    return lineage


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12))
def test_cl_01_lineage_round_trips_and_depth_is_enforced(depth: int) -> None:
    lineage = _chain(depth)
    assert decode_lineage(encode_lineage(lineage)) == lineage
    assert lineage.depth == depth and lineage.root_run_id == "r0"
    if depth > 8:
        with pytest.raises(ChildDepthExceededError):
            check_lineage(lineage, max_child_depth=8)
    else:
        check_lineage(lineage, max_child_depth=8)


def test_cl_01_recursion_rule() -> None:
    refused = child_lineage(
        None, parent_run_id="r0", parent_task_id="t", parent_pipeline_id="p", pipeline_id="p"
    )
    with pytest.raises(ChildRecursionError, match="allow_recursion"):
        check_lineage(refused, max_child_depth=8)
    allowed = child_lineage(
        refused,
        parent_run_id="r1",
        parent_task_id="t",
        parent_pipeline_id="p",
        pipeline_id="p",
        allow_recursion=True,
        max_recursion=2,
    )
    check_lineage(allowed, max_child_depth=8)
    with pytest.raises(LineageInvalidError):
        RunLineage(root_run_id="r", depth=0, pipeline_id="p", allow_recursion=True)


def test_cl_04_depth_zero_has_no_cancellation_anchors() -> None:
    assert cancellation_anchors(RunLineage(root_run_id="r", depth=0, pipeline_id="p")) == ()
    assert cancellation_anchors(_chain(2)) == ("r0", "r1")


@pytest.mark.parametrize(
    "text",
    [None, "", "{", "[]", '{"v": 1}', encode_lineage(_chain(2)).replace('"depth":2', '"depth":3')],
)
def test_cl_06_corrupt_lineage_is_lineage_invalid(text: object) -> None:
    with pytest.raises(LineageInvalidError) as caught:
        decode_lineage(text)
    assert caught.value.code == "lineage_invalid"


def test_pipeline_identity_is_stable_and_content_based() -> None:
    a = [DagNode(slug="a", plugin="x")]
    assert pipeline_identity(a) == pipeline_identity([DagNode(slug="a", plugin="x")])
    assert pipeline_identity(a) != pipeline_identity([DagNode(slug="a", plugin="y")])
    assert Ancestor("r", pipeline_identity(a)).pipeline_id.startswith("sha256:")


def test_bg_05_cost_arithmetic_is_exact() -> None:
    account = AccountUsage("r", Budget(max_cost=1), charged_units=cost_to_units(0.3))
    assert refuse_charge([account], cost_units=cost_to_units(0.7)) is None
    refusal = refuse_charge([account], cost_units=cost_to_units(0.700001))
    assert refusal is not None and refusal.startswith("budget_exhausted")


def test_bg_03_output_bytes_are_canonical_json_bytes() -> None:
    out = EmittedOutput(id="o", fields={"b": 1, "a": "é"})
    assert output_bytes([out]) == len('{"data":{},"fields":{"a":"é","b":1},"id":"o"}'.encode())


def test_budget_validation() -> None:
    with pytest.raises(ValueError):
        Budget(max_cost=float("nan"))
    with pytest.raises(ValueError):
        Budget(max_input_bytes=-1)
    assert Budget(max_cost=0.5).within(Budget(max_cost=1))
    assert not Budget().within(Budget(max_cost=1))
