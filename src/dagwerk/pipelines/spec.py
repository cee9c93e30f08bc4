"""The pipeline file format: one pydantic model, and its JSON Schema.

A pipeline file is a mapping with ``nodes`` (each node has exactly the
fields of :class:`~dagwerk.models.DagNode`) and the optional top-level
fields ``name``, ``description``, ``defaults`` (default run input),
``plugins`` (modules a worker imports to find the plugins) and
``failure_policy``. ``$schema`` may name the schema file for editors and is
otherwise ignored.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Final, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from dagwerk.constants import FailurePolicy
from dagwerk.models import DagNode

__all__ = [
    "EDGE_NAME_PATTERN",
    "MAX_PIPELINE_NODES",
    "PLUGIN_MODULE_PATTERN",
    "PipelineSpec",
    "ScheduleSpec",
    "pipeline_json_schema",
]

# A file with more nodes than this is refused before model validation; far
# more than a reviewable pipeline holds, far less than memory allows.
MAX_PIPELINE_NODES: Final = 10_000

# ``package.module`` or ``package.module:attribute``.
PLUGIN_MODULE_PATTERN: Final = (
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?$"
)
# The edge-name grammar of dagwerk.models.validate_edge_name, for editors.
EDGE_NAME_PATTERN: Final = r"^(?!input$)[A-Za-z_][A-Za-z0-9_-]*$"

PluginModule: TypeAlias = Annotated[
    str, StringConstraints(strict=True, pattern=PLUGIN_MODULE_PATTERN, max_length=512)
]


class ScheduleSpec(BaseModel):
    """One entry of a pipeline file's ``schedules:`` (``dagwerk schedule sync``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="dagwerk schedule")

    name: str = Field(description="The schedule's name (letters, digits, _ . : -).")
    cron: str | None = Field(
        default=None, description="A 5-field cron expression or @hourly, @daily, ..."
    )
    every: str | int | None = Field(
        default=None, description="A fixed interval instead of cron: 30s, 10m, 2h, 1d."
    )
    input: dict[str, Any] = Field(
        default_factory=dict, description="Run input of each run (over the pipeline defaults)."
    )
    timezone: str = Field(default="UTC", description="IANA time zone of the cron expression.")
    start: str | None = Field(default=None, description="No tick before this date or time.")
    end: str | None = Field(default=None, description="No tick after this date or time.")
    catchup: str = Field(default="skip", description="skip, latest or all (missed ticks).")
    catchup_limit: int = Field(default=100, description="With catchup all: at most this many.")
    overlap: str = Field(
        default="allow", description="allow, skip or cancel_previous (a run still going)."
    )

    def options(self) -> dict[str, Any]:
        """The keyword arguments of ``Engine.schedule`` (all but name and pipeline)."""
        return {
            "cron": self.cron,
            "every": self.every,
            "input": self.input,
            "timezone": self.timezone,
            "start": self.start,
            "end": self.end,
            "catchup": self.catchup,
            "catchup_limit": self.catchup_limit,
            "overlap": self.overlap,
        }


class PipelineSpec(BaseModel):
    """The top level of a pipeline file, as written (before graph validation)."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="dagwerk pipeline")

    schema_ref: str | None = Field(
        default=None,
        alias="$schema",
        description="Location of this JSON Schema, for editors; ignored by dagwerk.",
    )
    name: str = Field(default="", description="Pipeline name; defaults to the file name.")
    description: str = Field(default="", description="What the pipeline does.")
    defaults: dict[str, Any] = Field(
        default_factory=dict,
        description="Default run input (a JSON object); values supplied to a run override it.",
    )
    plugins: list[PluginModule] = Field(
        default_factory=list,
        description="Modules to import so that the plugins the nodes name are registered "
        "(`package.module` or `package.module:function`).",
    )
    failure_policy: FailurePolicy = Field(
        default=FailurePolicy.FAIL_FAST,
        description="What a run does after its first failure.",
    )
    nodes: list[DagNode] = Field(description="The steps of the pipeline (DagNode fields).")
    schedules: list[ScheduleSpec] = Field(
        default_factory=list,
        description="Schedules of this pipeline, applied by `dagwerk schedule sync FILE`.",
    )


def _patch_edge_names(defs: dict[str, Any]) -> None:
    # Edge names are checked by a plain validator, which pydantic cannot
    # describe; spell the grammar out so editors can check it too.
    edge_name = {"type": "string", "pattern": EDGE_NAME_PATTERN}
    for model, prop in (("InputEdge", "name"), ("EdgeSource", "edge")):
        properties = defs.get(model, {}).get("properties", {})
        if prop in properties:
            properties[prop] = {**properties[prop], **edge_name}


_SCHEMA_CACHE: dict[str, Any] = {}


def pipeline_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a pipeline file.

    Generated from :class:`PipelineSpec` and :class:`~dagwerk.models.DagNode`,
    so it always describes the fields the loader accepts. Every call returns
    a fresh copy.
    """
    if not _SCHEMA_CACHE:
        schema = PipelineSpec.model_json_schema(by_alias=True)
        _patch_edge_names(schema.get("$defs", {}))
        properties = schema["properties"]
        properties["nodes"]["minItems"] = 1
        properties["nodes"]["maxItems"] = MAX_PIPELINE_NODES
        properties["defaults"] = {
            "type": "object",
            "description": properties["defaults"].get("description", ""),
            "default": {},
        }
        _SCHEMA_CACHE.update(
            {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                **schema,
                "title": "dagwerk pipeline",
                "description": "A dagwerk pipeline file (YAML or JSON): the nodes of a DAG "
                "and the defaults of its runs.",
            }
        )
    return copy.deepcopy(_SCHEMA_CACHE)
