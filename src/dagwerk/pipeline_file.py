"""Pipeline files: load a YAML or JSON pipeline, or get the format's JSON Schema.

>>> pipeline = load_pipeline("examples/pipelines/etl.yaml")  # doctest: +SKIP
>>> [node.slug for node in pipeline.nodes]  # doctest: +SKIP

This module is an interface (it reads files); the pure core never imports it.
"""

from __future__ import annotations

from dagwerk.pipelines.loader import Pipeline, load_pipeline, parse_pipeline
from dagwerk.pipelines.source import (
    MAX_PIPELINE_FILE_BYTES,
    MAX_PIPELINE_NESTING,
    MAX_REPORTED_PROBLEMS,
    PipelineFileError,
)
from dagwerk.pipelines.spec import MAX_PIPELINE_NODES, PipelineSpec, pipeline_json_schema

__all__ = [
    "MAX_PIPELINE_FILE_BYTES",
    "MAX_PIPELINE_NESTING",
    "MAX_PIPELINE_NODES",
    "MAX_REPORTED_PROBLEMS",
    "Pipeline",
    "PipelineFileError",
    "PipelineSpec",
    "load_pipeline",
    "parse_pipeline",
    "pipeline_json_schema",
]
