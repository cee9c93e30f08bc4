"""Every model exported from ``dagwerk`` and ``dagwerk.models`` survives
``copy.copy``, ``copy.deepcopy`` and ``pickle`` (every protocol) as an equal
value that is still read-only."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import dagwerk
from dagwerk import models
from dagwerk.constants import (
    FilterOperator,
    InputMode,
    InputRole,
    LaunchCreateStatus,
    NodeDisposition,
    RunStatus,
)

NESTED: dict[str, Any] = {"customer": {"id": "c-1", "tags": ["a", {"deep": [1, 2.5, None]}]}}


def _output_ref() -> models.OutputRef:
    return models.OutputRef(id="o-1", fields=NESTED, correlation_id="c-1")


def _resolved() -> models.ResolvedOutput:
    return models.ResolvedOutput(id="o-1", fields=NESTED, data={"rows": [{"n": 1}, {"n": 2}]})


def _launch() -> models.NodeLaunch:
    return models.NodeLaunch(
        id="l-1",
        run_id="r-1",
        node_index=1,
        plugin_name="p",
        generation=0,
        disposition=NodeDisposition.LAUNCHED,
        task_ids=("t-1", "t-2"),
    )


def _plan() -> models.TaskInputPlan:
    return models.TaskInputPlan(
        generation=0,
        edges=(
            models.PlannedEdgeInput(
                edge="orders", source_index=0, role=InputRole.MAIN, output_ids=("o-1", "o-2")
            ),
        ),
        parameters=NESTED,
        secret_refs={"token": "api-token"},
        correlation_id="c-1",
    )


def _node() -> models.DagNode:
    return models.DagNode(
        slug="join",
        plugin="join",
        input_mode=InputMode.ALL,
        edges=(
            models.InputEdge(
                name="orders",
                source="extract",
                filter=models.EdgeFilter(
                    rules=(
                        models.FilterRule(
                            field="customer", operator=FilterOperator.IN, value=["a", "b"]
                        ),
                    )
                ),
            ),
        ),
        bindings={
            "limit": models.LiteralSource(value={"max": [1, {"n": 2}]}),
            "who": models.EdgeSource(edge="orders", field="customer"),
            "when": models.RuntimeSource(key="since"),
            "token": models.SecretSource(name="api-token"),
            "total": models.ExpressionSource(expression="1 + 2"),
        },
    )


EXAMPLES: dict[str, Callable[[], object]] = {
    "DagNode": _node,
    "EdgeFilter": lambda: models.EdgeFilter(
        rules=(models.FilterRule(field="x", operator=FilterOperator.EQ, value={"a": [1]}),)
    ),
    "EdgeSource": lambda: models.EdgeSource(edge="orders", field="customer"),
    "EmittedOutput": lambda: models.EmittedOutput(
        id="o-1", fields=NESTED, data={"rows": [{"n": 1}], "meta": {"k": "v"}}
    ),
    "ExpressionSource": lambda: models.ExpressionSource(expression="input.a + 1"),
    "FilterRule": lambda: models.FilterRule(
        field="tags", operator=FilterOperator.IN, value=[{"a": 1}, [2, 3]]
    ),
    "InputEdge": lambda: models.InputEdge(
        name="orders", source="extract", selection=models.Selection(field="amount", limit=3)
    ),
    "LaunchCreateResult": lambda: models.LaunchCreateResult(
        status=LaunchCreateStatus.CREATED, launch=_launch()
    ),
    "LiteralSource": lambda: models.LiteralSource(value={"a": [1, {"b": [True, None]}]}),
    "NodeLaunch": _launch,
    "OutputRef": _output_ref,
    "PlannedEdgeInput": lambda: models.PlannedEdgeInput(
        edge="orders", source_index=0, role=InputRole.MAIN, output_ids=("o-1",)
    ),
    "PlanningSnapshot": lambda: models.PlanningSnapshot(
        token="tok",
        generation=0,
        outputs_by_edge={"orders": (_output_ref(),)},
        source_dispositions={"orders": NodeDisposition.LAUNCHED},
        runtime_inputs=NESTED,
    ),
    "ResolvedOutput": _resolved,
    "RetryPolicySpec": lambda: models.RetryPolicySpec(max_attempts=3),
    "RuntimeSource": lambda: models.RuntimeSource(key="since", default={"d": [1]}),
    "SecretSource": lambda: models.SecretSource(name="api-token"),
    "Selection": lambda: models.Selection(field="amount", limit=2),
    "TaskContext": lambda: models.TaskContext(run_id="r-1", node_index=0, generation=1),
    "TaskInputPlan": _plan,
    "TaskInputs": lambda: models.TaskInputs(edges={"orders": (_resolved(),)}, parameters=NESTED),
    "RunResult": lambda: dagwerk.RunResult(
        run_id="r-1", status=RunStatus.COMPLETED, error=None, outputs={"join": (_resolved(),)}
    ),
    "RetryPolicy": lambda: dagwerk.RetryPolicy(max_attempts=3),
}


def _exported_models() -> dict[str, type]:
    """Value classes exported from ``dagwerk`` and ``dagwerk.models``:
    pydantic models and dataclasses (the runtime's task context, which holds
    a live store, is not a value)."""
    found: dict[str, type] = {}
    for module in (dagwerk, models):
        for name in module.__all__:
            value = getattr(module, name)
            if not inspect.isclass(value) or value is dagwerk.TaskContext:
                continue
            if issubclass(value, BaseModel) or dataclasses.is_dataclass(value):
                found[name] = value
    return found


def test_every_exported_model_has_an_example() -> None:
    exported = _exported_models()
    assert set(exported) == set(EXAMPLES)
    for name, cls in exported.items():
        assert type(EXAMPLES[name]()) is cls


def _mappings(value: object, seen: set[int] | None = None) -> list[Mapping[Any, Any]]:
    """Every mapping reachable through model fields, dataclass fields,
    tuples and mappings."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, BaseModel):
        names = type(value).model_fields
        return [m for name in names for m in _mappings(getattr(value, name), seen)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [
            m for f in dataclasses.fields(value) for m in _mappings(getattr(value, f.name), seen)
        ]
    if isinstance(value, Mapping):
        return [value, *(m for item in value.values() for m in _mappings(item, seen))]
    if isinstance(value, tuple):
        return [m for item in value for m in _mappings(item, seen)]
    return []


def _frozen(value: object) -> bool:
    if isinstance(value, BaseModel):
        return bool(type(value).model_config.get("frozen"))
    params = getattr(type(value), "__dataclass_params__", None)
    return bool(params is not None and params.frozen)


def _first_field(value: object) -> str:
    if isinstance(value, BaseModel):
        return next(iter(type(value).model_fields))
    assert dataclasses.is_dataclass(value) and not isinstance(value, type)
    return dataclasses.fields(value)[0].name


def _assert_read_only(value: object) -> None:
    if not _frozen(value):
        assert isinstance(value, models.DagNode)  # the one model users edit in place
        return
    with pytest.raises((ValidationError, dataclasses.FrozenInstanceError, TypeError)):
        setattr(value, _first_field(value), None)
    for mapping in _mappings(value):
        if type(mapping) is dict:
            continue  # members a read-only container shares as given (materialised data)
        with pytest.raises(TypeError, match="immutable"):
            mapping["added"] = 1  # type: ignore[index]


def _pickled(protocol: int) -> Callable[[object], object]:
    def round_trip(value: object) -> object:
        return pickle.loads(pickle.dumps(value, protocol))

    return round_trip


COPIES: dict[str, Callable[[object], object]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    **{f"pickle-{p}": _pickled(p) for p in range(pickle.HIGHEST_PROTOCOL + 1)},
}


@pytest.mark.parametrize("how", sorted(COPIES))
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_an_exported_model_round_trips_equal_and_read_only(name: str, how: str) -> None:
    original = EXAMPLES[name]()
    copied = COPIES[how](original)
    assert type(copied) is type(original)
    assert copied == original
    _assert_read_only(copied)
    if isinstance(original, BaseModel):
        assert isinstance(copied, BaseModel)
        assert copied.model_dump(mode="json") == original.model_dump(mode="json")


def test_a_deep_copy_of_materialised_data_does_not_share_its_members() -> None:
    original = models.ResolvedOutput(id="o-1", data={"rows": [{"n": 1}]})
    copied = copy.deepcopy(original)
    assert copied.data == original.data
    assert copied.data["rows"] is not original.data["rows"]
