"""The dashboard's actions: cancel, retry, re-run, resume, re-inject and
start a run. Each checks its input with the CLI's typed errors, calls
:class:`~dagwerk.Engine`, logs who did it and returns a JSON-ready answer.
Pages (form POSTs) and the API (JSON POSTs) call the same functions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagwerk.engine import Engine
from dagwerk.errors import DagwerkError
from dagwerk.pipelines.loader import Pipeline
from dagwerk.retry import RunRetryResult
from dagwerk.store import validate_wait_id
from dagwerk.web.security import Caller

__all__ = [
    "ACTION_LOG",
    "MAX_IDEMPOTENCY_KEY_LENGTH",
    "MAX_NODES_PER_ACTION",
    "ActionInputError",
    "NotFoundError",
    "PipelineNotFoundError",
    "ServedPipelines",
    "cancel",
    "check_idempotency_key",
    "check_nodes",
    "parse_json_text",
    "reinject",
    "rerun",
    "resume",
    "retry",
    "start_run",
]

ACTION_LOG = logging.getLogger("dagwerk.web.actions")
MAX_NODES_PER_ACTION = 1_000
MAX_IDEMPOTENCY_KEY_LENGTH = 200


class ActionInputError(DagwerkError, ValueError):
    """An action's input is malformed (the field says which)."""

    code = "invalid_input"


class NotFoundError(DagwerkError, LookupError):
    """A task or dead letter named in the URL does not exist."""

    code = "not_found"


class PipelineNotFoundError(DagwerkError, LookupError):
    """``POST /api/runs`` named a pipeline this server does not serve."""

    code = "pipeline_not_found"


def parse_json_text(text: str, name: str) -> object:
    """``text`` as JSON; :class:`ActionInputError` naming ``name`` otherwise."""

    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError as error:
        raise ActionInputError(f"{name} is not valid JSON: {error}", field=name) from None


def check_nodes(nodes: object, *, required: bool) -> list[str] | None:
    """A list of node slugs (``None`` when absent and not ``required``)."""
    if nodes is None or nodes == []:
        if required:
            raise ActionInputError("name at least one node", field="nodes")
        return None
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes):
        raise ActionInputError("nodes must be a list of node slugs", field="nodes")
    if len(nodes) > MAX_NODES_PER_ACTION:
        raise ActionInputError(
            f"nodes names {len(nodes)} nodes; at most {MAX_NODES_PER_ACTION}",
            field="nodes",
            limit=MAX_NODES_PER_ACTION,
        )
    return list(dict.fromkeys(nodes))


def check_idempotency_key(key: str | None) -> str | None:
    """The ``Idempotency-Key`` header: 1 to 200 printable ASCII characters."""
    if key is None:
        return None
    if (
        not key
        or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH
        or not key.isprintable()
        or not key.isascii()
    ):
        raise ActionInputError(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters",
            field="Idempotency-Key",
            limit=MAX_IDEMPOTENCY_KEY_LENGTH,
        )
    return key


def _log(action: str, target: str, caller: Caller, detail: str = "") -> None:
    ACTION_LOG.info("%s %s by %s%s", action, target, caller, f": {detail}" if detail else "")


def cancel(
    engine: Engine, run_id: str, caller: Caller, reason: str | None = None
) -> dict[str, Any]:
    if reason is not None and (not isinstance(reason, str) or len(reason) > 1_000):
        raise ActionInputError("reason must be a string of at most 1000 characters", field="reason")
    cancelled = engine.cancel(run_id, reason=reason or f"cancelled from the dashboard by {caller}")
    _log("cancel", run_id, caller, "cancelled" if cancelled else "nothing to cancel")
    return {"run_id": run_id, "cancelled": cancelled}


def retry(engine: Engine, run_id: str, nodes: object, caller: Caller) -> dict[str, Any]:
    boundary = check_nodes(nodes, required=False)
    result = engine.retry(run_id, boundary)
    _log("retry", run_id, caller, "from " + ", ".join(boundary) if boundary else "whole run")
    return {
        "run_id": run_id,
        "retried": True,
        "nodes": boundary,
        **_reopened(engine, run_id, result),
    }


def rerun(engine: Engine, run_id: str, nodes: object, caller: Caller) -> dict[str, Any]:
    named = check_nodes(nodes, required=True)
    assert named is not None
    result = engine.rerun(run_id, named)
    _log("rerun", run_id, caller, ", ".join(named))
    return {"run_id": run_id, "rerun": True, "nodes": named, **_reopened(engine, run_id, result)}


def _reopened(engine: Engine, run_id: str, result: RunRetryResult) -> dict[str, Any]:
    nodes = engine.nodes(run_id)
    return {
        "affected_nodes": [nodes[i].slug for i in result.affected_nodes],
        "retry_count": result.retry_count,
    }


def resume(
    engine: Engine, task_id: str, wait_id: object, response: object, caller: Caller
) -> dict[str, Any]:
    if not isinstance(wait_id, str):
        raise ActionInputError("wait_id must be a string", field="wait_id")
    validate_wait_id(wait_id)
    result = engine.resume(task_id, wait_id, response)
    _log("resume", f"{task_id}/{wait_id}", caller)
    return {
        "task_id": task_id,
        "wait_id": wait_id,
        "resumed_attempt_id": result.resumed_attempt_id,
    }


def reinject(engine: Engine, dead_letter_id: str, caller: Caller) -> dict[str, Any]:
    attempt = engine.reinject(dead_letter_id)
    _log("reinject", dead_letter_id, caller, "refused" if attempt is None else attempt)
    if attempt is None:
        raise ActionInputError(
            f"dead letter {dead_letter_id!r} cannot be re-injected (unknown, already "
            "re-injected, or its task moved on)",
            code="reinject_refused",
            field="dead_letter_id",
        )
    return {"dead_letter_id": dead_letter_id, "attempt_id": attempt}


@dataclass(slots=True)
class ServedPipelines:
    """The pipelines ``POST /api/runs`` may start, by name and by the file
    path they were loaded from (``dagwerk serve --pipeline FILE``). A request
    never makes the server read a file it was not given at start (unlike
    ``Engine.pipelines``, which loads a pipeline file it is named)."""

    by_name: dict[str, Pipeline] = field(default_factory=dict)
    by_path: dict[str, Pipeline] = field(default_factory=dict)

    def add(self, pipeline: Pipeline) -> None:
        if pipeline.name:
            self.by_name[pipeline.name] = pipeline
        self.by_path[str(pipeline.source)] = pipeline
        self.by_path[str(Path(pipeline.source).resolve())] = pipeline

    def get(self, name: str) -> Pipeline:
        found = self.by_name.get(name) or self.by_path.get(name)
        if found is None:
            try:
                found = self.by_path.get(str(Path(name).resolve()))
            except (OSError, ValueError):
                found = None
        if found is None:
            served = ", ".join(sorted(self.by_name)) or "none (start serve with --pipeline FILE)"
            raise PipelineNotFoundError(
                f"pipeline {name!r} is not served here (pipelines: {served})", field="pipeline"
            )
        return found


def start_run(
    engine: Engine,
    registry: ServedPipelines,
    body: object,
    idempotency_key: str | None,
    caller: Caller,
) -> dict[str, Any]:
    """``POST /api/runs``: ``{"pipeline": NAME_OR_PATH, "input": {...}}``."""
    if not isinstance(body, Mapping):
        raise ActionInputError("the request body must be a JSON object", field="body")
    unknown = sorted(set(body) - {"pipeline", "input", "run_id"})
    if unknown:
        raise ActionInputError(f"unknown field {unknown[0]!r}", field=unknown[0])
    name = body.get("pipeline")
    if not isinstance(name, str) or not name:
        raise ActionInputError("pipeline must name a served pipeline", field="pipeline")
    run_input = body.get("input")
    if run_input is not None and not isinstance(run_input, Mapping):
        raise ActionInputError("input must be a JSON object", field="input")
    run_id = body.get("run_id")
    if run_id is not None and not isinstance(run_id, str):
        raise ActionInputError("run_id must be a string", field="run_id")
    key = check_idempotency_key(idempotency_key)
    pipeline = registry.get(name)
    if key is None:
        new_id = engine.submit(pipeline, run_input, run_id=run_id)
        created = True
    else:
        # A repeat of the key (from any process) answers with the first run.
        outcome = engine.submit_once(pipeline, run_input, idempotency_key=key, run_id=run_id)
        new_id, created = outcome.run_id, outcome.created
    _log(
        "submit",
        new_id,
        caller,
        f"pipeline {pipeline.name or name}" + (f", key {key}" if key else ""),
    )
    return {"run_id": new_id, "pipeline": pipeline.name or name, "created": created}


def nodes_from_form(values: Sequence[str]) -> list[str]:
    """Node slugs from repeated ``nodes`` form fields (blank ones dropped)."""
    return [value for value in values if value]
