"""Loading and validating pipeline files.

:func:`load_pipeline` reads a YAML or JSON file (see
:mod:`dagwerk.pipelines.source` for the limits on untrusted input), checks it
against :class:`~dagwerk.pipelines.spec.PipelineSpec`, then validates the
graph with :func:`dagwerk.graph.validate_graph`. Every problem is one
:class:`PipelineFileError` naming the file, the line (when known), the node
(its slug, or ``Node N`` when it has none) and the field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from dagwerk.constants import MAX_RUN_INPUT_BYTES, FailurePolicy
from dagwerk.errors import DagwerkError, GraphValidationError
from dagwerk.graph import validate_graph
from dagwerk.json import FrozenDict, bounded_json_size, freeze_object
from dagwerk.models import DagNode
from dagwerk.pipelines.source import (
    MAX_REPORTED_PROBLEMS,
    FieldPath,
    PipelineFileError,
    SourceDocument,
    SourceFormat,
    parse_source_text,
    read_source,
)
from dagwerk.pipelines.spec import MAX_PIPELINE_NODES, PipelineSpec, ScheduleSpec
from dagwerk.scheduling.definitions import ScheduleDefinition

__all__ = ["Pipeline", "PipelineFileError", "load_pipeline", "parse_pipeline"]

_FIELD_TOKEN: Final = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
_NODE_NUMBER: Final = re.compile(r"Node (\d+)")
_BINDING_TAGS: Final = frozenset({"edge", "literal", "runtime", "secret", "expression"})


@dataclass(frozen=True)
class Pipeline:
    """A validated pipeline file.

    ``nodes`` passed :func:`~dagwerk.graph.validate_graph`; ``defaults`` is
    the frozen default run input (at most ``MAX_RUN_INPUT_BYTES``);
    ``plugins`` are module paths to import before running; ``source`` is the
    file it came from.
    """

    name: str
    description: str
    defaults: FrozenDict
    plugins: tuple[str, ...]
    failure_policy: FailurePolicy
    nodes: tuple[DagNode, ...]
    source: str
    document: SourceDocument | None = field(default=None, repr=False, compare=False)
    """The parsed file, for locating problems found after loading."""
    schedules: tuple[ScheduleSpec, ...] = ()
    """The file's ``schedules:`` (checked), applied by ``dagwerk schedule sync``."""

    def error_at(self, path: FieldPath, reason: str, *, rule: str) -> PipelineFileError:
        """A :class:`PipelineFileError` for the field at ``path`` (such as
        ``("nodes", 2, "plugin")``), with its line when the file is known."""
        if self.document is None:
            return PipelineFileError(reason, path=self.source, field=format_field(path), rule=rule)
        return _located(self.document, path, reason, rule=rule)

    @property
    def edge_count(self) -> int:
        """The number of input edges over all nodes."""
        return sum(len(node.edges) for node in self.nodes)

    @property
    def root_slugs(self) -> tuple[str, ...]:
        """Slugs of the nodes without input edges, in file order."""
        return tuple(node.slug for node in self.nodes if not node.edges)


def load_pipeline(path: str | os.PathLike[str]) -> Pipeline:
    """Read, parse and validate the pipeline file at ``path``.

    Raises :class:`PipelineFileError` (a ``ValueError``) for the first
    problem found: unreadable or hostile input, a field that does not fit
    the format, or a graph that :func:`~dagwerk.graph.validate_graph`
    rejects.
    """
    document = read_source(path)
    return _build(document, default_name=Path(os.fspath(path)).stem)


def parse_pipeline(
    text: str, *, source: str = "<string>", source_format: SourceFormat = "yaml"
) -> Pipeline:
    """Like :func:`load_pipeline`, for pipeline text already in memory."""
    document = parse_source_text(text, path=source, source_format=source_format)
    return _build(document, default_name=Path(source).stem or "pipeline")


def _build(document: SourceDocument, *, default_name: str) -> Pipeline:
    data = document.data
    if not isinstance(data, dict):
        raise PipelineFileError(
            "a pipeline file must be a mapping with a 'nodes' list",
            path=document.path,
            line=1,
            rule="not_a_mapping",
        )
    nodes_value = data.get("nodes")
    if isinstance(nodes_value, list) and len(nodes_value) > MAX_PIPELINE_NODES:
        raise _located(
            document,
            ("nodes",),
            f"pipeline has {len(nodes_value)} nodes; maximum is {MAX_PIPELINE_NODES}",
            rule="too_many_nodes",
            limit=MAX_PIPELINE_NODES,
        )
    try:
        spec = PipelineSpec.model_validate(data)
    except ValidationError as error:
        raise _from_validation_error(error, document) from None
    defaults = _defaults(spec, document)
    try:
        validate_graph(spec.nodes)
    except GraphValidationError as error:
        raise _from_graph_error(error, spec.nodes, document) from error
    _check_schedules(spec, document)
    return Pipeline(
        name=spec.name or default_name,
        description=spec.description,
        defaults=defaults,
        plugins=tuple(spec.plugins),
        failure_policy=spec.failure_policy,
        nodes=tuple(spec.nodes),
        source=document.path,
        document=document,
        schedules=tuple(spec.schedules),
    )


def _check_schedules(spec: PipelineSpec, document: SourceDocument) -> None:
    """Each schedule entry as ``ScheduleDefinition.build`` checks it; the first
    bad value is a problem at ``schedules[i].field``."""
    seen: set[str] = set()
    for index, entry in enumerate(spec.schedules):
        if entry.name in seen:
            raise _located(
                document,
                ("schedules", index, "name"),
                f"schedule {entry.name!r} is declared twice",
                rule="duplicate_schedule",
            )
        seen.add(entry.name)
        try:
            options = entry.options()
            options["run_input"] = options.pop("input")
            ScheduleDefinition.build(entry.name, document.path, spec.nodes, **options)
        except DagwerkError as error:
            raise _located(
                document,
                ("schedules", index, error.field or "name"),
                error.message,
                rule="invalid_schedule",
                limit=error.limit,
            ) from None


def _defaults(spec: PipelineSpec, document: SourceDocument) -> FrozenDict:
    try:
        defaults = freeze_object(spec.defaults)
    except ValueError as error:
        raise _located(document, ("defaults",), str(error), rule="invalid_json") from None
    size = bounded_json_size(defaults, MAX_RUN_INPUT_BYTES)
    if size > MAX_RUN_INPUT_BYTES:
        raise _located(
            document,
            ("defaults",),
            f"default run input is over {MAX_RUN_INPUT_BYTES} bytes",
            rule="run_input_too_large",
            limit=MAX_RUN_INPUT_BYTES,
        )
    return defaults


# --- locating errors --------------------------------------------------------


def format_field(path: Sequence[str | int]) -> str:
    """``("edges", 0, "filter")`` as ``"edges[0].filter"``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _node_label(document: SourceDocument, index: int) -> str:
    data = document.data
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if isinstance(nodes, list) and index < len(nodes) and isinstance(nodes[index], dict):
        slug = nodes[index].get("slug")
        if isinstance(slug, str) and slug:
            return slug
    return f"Node {index + 1}"


def _located(
    document: SourceDocument,
    path: FieldPath,
    reason: str,
    *,
    rule: str,
    limit: int | None = None,
) -> PipelineFileError:
    node: str | None = None
    field: str | None
    if len(path) >= 2 and path[0] == "nodes" and isinstance(path[1], int):
        node = _node_label(document, path[1])
        field = format_field(path[2:]) or None
    else:
        field = format_field(path) or None
    return PipelineFileError(
        reason,
        path=document.path,
        line=document.line_of(path),
        node=node,
        field=field,
        rule=rule,
        limit=limit,
    )


def _data_path(location: Sequence[int | str], data: object) -> FieldPath:
    """The path of ``location`` in the file's data, without union tags.

    Pydantic adds the tag of a discriminated union to error locations
    (``bindings.x.<source>.field``); that tag, and any other step that is
    not in the data and is not the last one, is dropped.
    """
    path: list[str | int] = []
    current: Any = data
    for position, step in enumerate(location):
        if (
            isinstance(current, dict)
            and position < len(location) - 1
            and current.get("source") == step
            and step in _BINDING_TAGS
        ):
            continue
        in_mapping = isinstance(current, dict) and isinstance(step, str) and step in current
        in_list = isinstance(current, list) and isinstance(step, int) and 0 <= step < len(current)
        if in_mapping or in_list:
            current = current[step]
        elif position < len(location) - 1:
            continue
        else:
            current = None
        path.append(step)
    return tuple(path)


def _problem(detail: Any, document: SourceDocument, *, suffix: str = "") -> PipelineFileError:
    path = _data_path(detail["loc"], document.data)
    reason = str(detail["msg"]).removeprefix("Value error, ")
    if detail["type"] == "extra_forbidden":
        reason = "unknown field"
    elif detail["type"] == "missing":
        reason = "missing required field"
    return _located(document, path, reason + suffix, rule=str(detail["type"]))


def _from_validation_error(error: ValidationError, document: SourceDocument) -> PipelineFileError:
    details = error.errors(include_url=False)
    suffix = f" (and {len(details) - 1} more problems)" if len(details) > 1 else ""
    first = _problem(details[0], document, suffix=suffix)
    if len(details) > 1:
        first.problems = tuple(
            _problem(detail, document) for detail in details[:MAX_REPORTED_PROBLEMS]
        )
        first.problem_count = len(details)
    return first


def _node_index(label: str | None, nodes: Sequence[DagNode], rule: str) -> int | None:
    if label is None:
        return None
    matches = [index for index, node in enumerate(nodes) if node.slug == label]
    if matches:
        # A duplicate slug is reported where it repeats, not where it is first used.
        return matches[1] if rule == "duplicate_slug" and len(matches) > 1 else matches[0]
    number = _NODE_NUMBER.fullmatch(label)
    return int(number.group(1)) - 1 if number else None


def _from_graph_error(
    error: GraphValidationError, nodes: Sequence[DagNode], document: SourceDocument
) -> PipelineFileError:
    reason = error.message
    for prefix in (f"node '{error.node}': ", f"{error.node}: ", f"node '{error.node}' "):
        reason = reason.removeprefix(prefix)
    field_steps: list[str | int] = []
    for name, number in _FIELD_TOKEN.findall(error.field or ""):
        field_steps.append(int(number) if number else name)
    index = _node_index(error.node, nodes, error.rule)
    if index is not None:
        path: FieldPath = ("nodes", index, *field_steps)
        return _located(document, path, reason, rule=error.rule, limit=error.limit)
    return PipelineFileError(
        reason,
        path=document.path,
        line=document.line_of(("nodes",)),
        node=error.node,
        field=error.field,
        rule=error.rule,
        limit=error.limit,
    )
