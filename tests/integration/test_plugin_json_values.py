"""JSON a plugin receives behaves like JSON: every object is a ``dict``
(read-only), ``json.dump`` writes it without a ``default=``, and it pickles.
Run through ``Engine`` on SQLite, as a user's plugins see it."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

import dagwerk
from dagwerk import DagNode, EmittedOutput, Engine, InputEdge, RunStatus, TaskContext, TaskInputs
from dagwerk.constants import TaskStatus
from dagwerk.models import EdgeSource, LiteralSource
from dagwerk.testing.waits import wait_until

RUN_INPUT: dict[str, Any] = {"customer": {"id": "c-1", "tags": ["gold", {"since": 2019}]}}
RESPONSE: dict[str, Any] = {"approved": True, "notes": [{"by": "ada", "ok": True}]}


def _check_json_object(value: object, what: str) -> Any:
    """What plain code does with a JSON object: ``isinstance``, ``json.dumps``
    and ``pickle``; returns the value as JSON text parsed back."""
    assert isinstance(value, dict), f"{what} is {type(value).__name__}, not a dict"
    text = json.dumps(value)
    assert pickle.loads(pickle.dumps(value)) == value
    with pytest.raises(TypeError, match="immutable"):
        value["added"] = 1
    return json.loads(text)


NODES = [
    DagNode(slug="emit", plugin="emit"),
    DagNode(
        slug="consume",
        plugin="consume",
        input_mode="each",
        edges=(InputEdge(name="rows", source="emit"),),
        bindings={
            "customer": EdgeSource(edge="rows", field="customer"),
            "limits": LiteralSource(value={"max": [1, {"n": 2}]}),
        },
    ),
    DagNode(slug="parent", plugin="parent"),
]


def test_every_json_value_a_plugin_receives_is_a_dict_json_can_write(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    dumped = tmp_path / "inputs.json"
    with Engine(f"sqlite:///{tmp_path / 'json.db'}", execution_root=tmp_path) as engine:

        @engine.plugin("emit")
        def emit(inputs: TaskInputs, ctx: TaskContext) -> EmittedOutput:
            seen["run input"] = _check_json_object(inputs.parameters, "a root's parameters")
            return EmittedOutput(
                id="row-1",
                fields={"customer": inputs.parameters["customer"]},
                data={"rows": [{"n": 1}, {"n": 2}]},
            )

        @engine.plugin("consume")
        def consume(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            if ctx.resumed_from_wait_id is None:
                # The obvious way to keep a task's inputs: write them to a file.
                with dumped.open("w", encoding="utf-8") as handle:
                    json.dump(inputs.parameters, handle)
                (row,) = inputs.edges["rows"]
                assert isinstance(inputs.edges, dict)
                seen["fields"] = _check_json_object(row.fields, "an output's fields")
                seen["data"] = _check_json_object(row.data, "an output's data")
                seen["nested"] = _check_json_object(
                    inputs.parameters["customer"], "a nested parameter"
                )
                ctx.wait("review")
            seen["response"] = _check_json_object(ctx.wait_response, "a wait's response")
            return {"approved": True}

        @engine.plugin("leaf")
        def leaf(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            return {"value": {"deep": [1, {"x": inputs.parameters["x"]}]}}

        @engine.plugin("parent")
        def parent(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            result = ctx.child_result()
            if result is None:
                ctx.run_child([DagNode(slug="leaf", plugin="leaf")], {"x": 4})
            assert result is not None
            (output,) = result.outputs["leaf"]
            seen["child output"] = _check_json_object_or_plain(output, "a child's output")
            seen["child outputs"] = json.loads(json.dumps(result.outputs))
            return {"ok": result.ok}

        run_id = engine.submit(NODES, input=RUN_INPUT)
        worker = engine.worker(concurrency=2)
        worker.start()
        try:

            def waiting() -> list[str]:
                return [
                    t.task_id
                    for t in engine.list_tasks(run_id)
                    if t.status is TaskStatus.WAITING and t.node_index == 1
                ]

            wait_until(lambda: bool(waiting()), "the consume task to wait", timeout=60)
            (task_id,) = waiting()
            engine.resume(task_id, "review", response=RESPONSE)
            result = engine.wait(run_id, timeout=60)
        finally:
            worker.stop()
    assert result.status is RunStatus.COMPLETED, result.error
    assert seen["run input"] == RUN_INPUT
    assert seen["fields"] == {"customer": RUN_INPUT["customer"]}
    assert seen["data"] == {"rows": [{"n": 1}, {"n": 2}]}
    assert seen["nested"] == RUN_INPUT["customer"]
    assert seen["response"] == RESPONSE
    assert seen["child output"]["fields"] == {"value": {"deep": [1, {"x": 4}]}}
    assert seen["child outputs"]["leaf"][0]["fields"] == {"value": {"deep": [1, {"x": 4}]}}
    assert json.loads(dumped.read_text(encoding="utf-8")) == {
        "customer": RUN_INPUT["customer"],
        "limits": {"max": [1, {"n": 2}]},
    }
    # What the run hands back is JSON as well.
    (published,) = result.outputs["emit"]
    assert json.loads(json.dumps(published.fields)) == {"customer": RUN_INPUT["customer"]}


def _check_json_object_or_plain(value: object, what: str) -> Any:
    """A child's result is a plain (mutable) copy: a dict JSON can write."""
    assert isinstance(value, dict), f"{what} is {type(value).__name__}, not a dict"
    return json.loads(json.dumps(value))


def test_thaw_json_gives_a_plugin_a_mutable_copy() -> None:
    frozen = dagwerk.FrozenDict({"a": [1, {"b": 2}]})
    plain = dagwerk.thaw_json(frozen)
    assert isinstance(plain, dict)
    plain["c"] = 3
    nested = plain["a"]
    assert isinstance(nested, list)
    nested.append(4)
    assert frozen == {"a": (1, {"b": 2})}
