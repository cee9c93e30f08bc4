"""``trusted_model`` builds what validation builds from valid values."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from pydantic import BaseModel

from dagwerk._trusted import trusted_model
from dagwerk.constants import InputRole, LaunchCreateStatus, NodeDisposition
from dagwerk.json import FrozenDict
from dagwerk.models import (
    LaunchCreateResult,
    NodeLaunch,
    OutputRef,
    PlannedEdgeInput,
    ResolvedOutput,
    TaskInputPlan,
    TaskInputs,
)

_REF = {"id": "r:1:0:0:o0", "fields": FrozenDict({"n": 1}), "correlation_id": None}
_RESOLVED = {
    "id": "r:1:0:0:o0",
    "fields": FrozenDict({"n": 1}),
    "data": MappingProxyType({"blob": [1, 2]}),
}
_EDGE = {
    "edge": "prev",
    "source_index": 0,
    "role": InputRole.MAIN,
    "output_ids": ("r:1:0:0:o0",),
}
_PLAN = {
    "schema_version": 1,
    "generation": 0,
    "edges": (PlannedEdgeInput.model_validate(_EDGE),),
    "parameters": FrozenDict({"k": "v"}),
    "secret_refs": MappingProxyType({}),
    "correlation_id": "c1",
}

_LAUNCH_FIELDS = {
    "id": "r:launch:1:0",
    "run_id": "r",
    "node_index": 1,
    "plugin_name": "p",
    "generation": 0,
    "disposition": NodeDisposition.LAUNCHED,
    "task_ids": ("r:1:0:0",),
    "complete": False,
    "error": "",
}
_CREATED = {"status": LaunchCreateStatus.CREATED, "launch": NodeLaunch(**_LAUNCH_FIELDS)}

CASES: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (OutputRef, _REF),
    (NodeLaunch, _LAUNCH_FIELDS),
    (LaunchCreateResult, _CREATED),
    (ResolvedOutput, _RESOLVED),
    (PlannedEdgeInput, _EDGE),
    (TaskInputPlan, _PLAN),
]


@pytest.mark.parametrize(("cls", "values"), CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_trusted_equals_validated_and_constructed(
    cls: type[BaseModel], values: dict[str, Any]
) -> None:
    built = trusted_model(cls, dict(values))
    validated = cls.model_validate(values)
    assert type(built) is cls
    assert built == validated
    assert built == cls.model_construct(**values)
    assert built.model_fields_set == set(cls.model_fields)
    assert built.model_dump() == validated.model_dump()
    assert built.model_dump_json() == validated.model_dump_json()


def test_trusted_task_inputs_read_like_constructed_ones() -> None:
    resolved = ResolvedOutput.model_validate(_RESOLVED)
    values: dict[str, Any] = {
        "edges": MappingProxyType({"prev": (resolved,)}),
        "parameters": FrozenDict(),
    }
    built = trusted_model(TaskInputs, dict(values))
    constructed = TaskInputs.model_construct(**values)
    assert built.edges == constructed.edges
    assert built.parameters == constructed.parameters
    assert built.model_fields_set == set(TaskInputs.model_fields)


def test_trusted_models_stay_frozen() -> None:
    ref = trusted_model(OutputRef, dict(_REF))
    with pytest.raises(ValueError, match="frozen"):
        ref.id = "other"  # type: ignore[misc]
