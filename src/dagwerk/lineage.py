"""Composite child lineage: what a child run records about its ancestry.

A task may start a child run (``ctx.start_child``). The child is stored with
a :class:`RunLineage`: its root run, its parent run and task, its depth and
the *pipeline identity* of every ancestor. The lineage is persisted as text
(:func:`encode_lineage`) and every worker decodes it (:func:`decode_lineage`)
before executing any task of the run, so a worker in another process that
never saw the parent still enforces the rules:

- depth: a run deeper than the worker's ``max_child_depth`` (default 8) or
  than the ``max_depth`` cap carried in its lineage is refused;
- recursion: a pipeline that already appears in its own ancestry is refused
  unless it declares ``allow_recursion`` with ``max_recursion``, the number
  of times it may appear above itself;
- cancellation: the root and the immediate parent of a child (depth >= 1)
  are checked; a committed cancelled one stops the child. A depth-0 lineage
  names a root only to anchor depth caps, and an ancestor with no stored run
  is not a cancellation signal (CL-04, CL-05).

Pipeline identity is ``"sha256:" + hex`` of the canonical JSON of the node
definitions (:func:`pipeline_identity`), unless the caller names the
pipeline explicitly. This module is pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from dagwerk.errors import DagwerkError
from dagwerk.json import canonical_json_bytes
from dagwerk.models import DagNode

__all__ = [
    "CHILD_WAIT_PREFIX",
    "DEFAULT_MAX_CHILD_DEPTH",
    "MAX_LINEAGE_TEXT",
    "Ancestor",
    "ChildDepthExceededError",
    "ChildRecursionError",
    "LineageInvalidError",
    "RunLineage",
    "RunLink",
    "cancellation_anchors",
    "check_lineage",
    "child_lineage",
    "child_result_payload",
    "child_wait_id",
    "decode_lineage",
    "encode_lineage",
    "pipeline_identity",
    "sink_indices",
]

DEFAULT_MAX_CHILD_DEPTH = 8
"""How deep a child run may nest below its root unless the worker says otherwise."""

MAX_LINEAGE_TEXT = 1_000_000
"""Persisted lineage longer than this is corrupt, not decoded."""

_FORMAT = 1
_KEYS = frozenset(
    {
        "v",
        "root_run_id",
        "parent_run_id",
        "parent_task_id",
        "depth",
        "pipeline_id",
        "ancestors",
        "allow_recursion",
        "max_recursion",
        "max_depth",
    }
)


class LineageInvalidError(DagwerkError, ValueError):
    """Persisted lineage cannot be decoded or contradicts itself."""

    code = "lineage_invalid"


class ChildDepthExceededError(DagwerkError, ValueError):
    """A child run is nested deeper than the depth limit allows."""

    code = "child_depth_exceeded"


class ChildRecursionError(DagwerkError, ValueError):
    """A pipeline appears in its own ancestry without (enough) permission."""

    code = "child_recursion_refused"


def _bad(message: str, field: str | None = None) -> LineageInvalidError:
    return LineageInvalidError(f"lineage_invalid: {message}", field=field)


def _check_id(value: object, name: str) -> str:
    if not isinstance(value, str) or not value or "\x00" in value:
        raise _bad(f"{name} must be a non-empty string", name)
    return value


def _check_int(value: object, name: str, minimum: int) -> int:
    # bool is an int subclass; structural integers reject it.
    if type(value) is not int or value < minimum:
        raise _bad(f"{name} must be an int >= {minimum}", name)
    return value


@dataclass(frozen=True, slots=True)
class Ancestor:
    """One run above a child: its ID and its pipeline identity."""

    run_id: str
    pipeline_id: str

    def __post_init__(self) -> None:
        _check_id(self.run_id, "ancestors.run_id")
        _check_id(self.pipeline_id, "ancestors.pipeline_id")


@dataclass(frozen=True, slots=True)
class RunLineage:
    """The persisted ancestry of a run; it validates itself on construction.

    ``ancestors`` run from the root (first) to the parent (last), so
    ``len(ancestors) == depth``. A depth-0 lineage has no parent; its
    ``root_run_id`` only anchors caps. ``allow_recursion`` requires
    ``max_recursion`` (how often the run's pipeline may appear among its
    ancestors). Invalid values raise :class:`LineageInvalidError`.
    """

    root_run_id: str
    depth: int
    pipeline_id: str
    ancestors: tuple[Ancestor, ...] = ()
    parent_run_id: str | None = None
    parent_task_id: str | None = None
    allow_recursion: bool = False
    max_recursion: int | None = None
    max_depth: int | None = None

    def __post_init__(self) -> None:
        _check_id(self.root_run_id, "root_run_id")
        depth = _check_int(self.depth, "depth", 0)
        _check_id(self.pipeline_id, "pipeline_id")
        if not isinstance(self.ancestors, tuple) or not all(
            isinstance(a, Ancestor) for a in self.ancestors
        ):
            raise _bad("ancestors must be a tuple of Ancestor", "ancestors")
        if len(self.ancestors) != depth:
            raise _bad(f"depth {depth} but {len(self.ancestors)} ancestors", "depth")
        if depth == 0:
            if self.parent_run_id is not None or self.parent_task_id is not None:
                raise _bad("a depth-0 lineage has no parent", "parent_run_id")
        else:
            _check_id(self.parent_run_id, "parent_run_id")
            _check_id(self.parent_task_id, "parent_task_id")
            if self.ancestors[0].run_id != self.root_run_id:
                raise _bad("the first ancestor must be the root run", "root_run_id")
            if self.ancestors[-1].run_id != self.parent_run_id:
                raise _bad("the last ancestor must be the parent run", "parent_run_id")
        if not isinstance(self.allow_recursion, bool):
            raise _bad("allow_recursion must be a bool", "allow_recursion")
        if self.max_recursion is not None:
            _check_int(self.max_recursion, "max_recursion", 1)
            if not self.allow_recursion:
                raise _bad("max_recursion needs allow_recursion", "max_recursion")
        elif self.allow_recursion:
            raise _bad("allow_recursion needs a max_recursion limit", "max_recursion")
        if self.max_depth is not None:
            _check_int(self.max_depth, "max_depth", 0)


def pipeline_identity(nodes: Sequence[DagNode]) -> str:
    """``"sha256:<hex>"`` of the canonical JSON of the node definitions, so the
    same definition has the same identity in every process."""
    dumped = [node.model_dump(mode="json") for node in nodes]
    return "sha256:" + hashlib.sha256(canonical_json_bytes(dumped)).hexdigest()


def child_lineage(
    parent: RunLineage | None,
    *,
    parent_run_id: str,
    parent_task_id: str,
    parent_pipeline_id: str,
    pipeline_id: str,
    allow_recursion: bool = False,
    max_recursion: int | None = None,
) -> RunLineage:
    """The lineage of a child started by ``parent_task_id`` of ``parent_run_id``.

    ``parent`` is the parent run's own lineage (``None`` for a root run
    without one); its ``max_depth`` cap is inherited.
    """
    inherited = () if parent is None else parent.ancestors
    ancestors = (*inherited, Ancestor(parent_run_id, parent_pipeline_id))
    return RunLineage(
        root_run_id=ancestors[0].run_id,
        depth=len(ancestors),
        pipeline_id=pipeline_id,
        ancestors=ancestors,
        parent_run_id=parent_run_id,
        parent_task_id=parent_task_id,
        allow_recursion=allow_recursion,
        max_recursion=max_recursion,
        max_depth=None if parent is None else parent.max_depth,
    )


def check_lineage(lineage: RunLineage, *, max_child_depth: int) -> None:
    """Enforce the depth limit and the recursion rule (CL-01).

    Raises :class:`ChildDepthExceededError` or :class:`ChildRecursionError`.
    """
    caps = [max_child_depth] + ([lineage.max_depth] if lineage.max_depth is not None else [])
    cap = min(caps)
    if lineage.depth > cap:
        raise ChildDepthExceededError(
            f"child_depth_exceeded: run depth {lineage.depth} exceeds the limit of {cap}",
            field="max_child_depth",
            limit=cap,
        )
    seen = sum(1 for ancestor in lineage.ancestors if ancestor.pipeline_id == lineage.pipeline_id)
    if seen == 0:
        return
    if not lineage.allow_recursion:
        raise ChildRecursionError(
            f"child_recursion_refused: pipeline {lineage.pipeline_id} already appears in its "
            "ancestry and does not declare allow_recursion",
            field="allow_recursion",
        )
    limit = lineage.max_recursion
    assert limit is not None  # RunLineage guarantees it with allow_recursion
    if seen > limit:
        raise ChildRecursionError(
            f"child_recursion_refused: pipeline {lineage.pipeline_id} appears {seen} times in "
            f"its ancestry; max_recursion is {limit}",
            field="max_recursion",
            limit=limit,
        )


def cancellation_anchors(lineage: RunLineage) -> tuple[str, ...]:
    """The runs whose committed cancellation stops this run: its root and its
    immediate parent; none for a depth-0 lineage (CL-02..CL-04)."""
    if lineage.depth == 0:
        return ()
    assert lineage.parent_run_id is not None
    if lineage.parent_run_id == lineage.root_run_id:
        return (lineage.root_run_id,)
    return (lineage.root_run_id, lineage.parent_run_id)


def encode_lineage(lineage: RunLineage) -> str:
    """Canonical JSON text of the lineage (what the store persists)."""
    payload = {
        "v": _FORMAT,
        "root_run_id": lineage.root_run_id,
        "parent_run_id": lineage.parent_run_id,
        "parent_task_id": lineage.parent_task_id,
        "depth": lineage.depth,
        "pipeline_id": lineage.pipeline_id,
        "ancestors": [[a.run_id, a.pipeline_id] for a in lineage.ancestors],
        "allow_recursion": lineage.allow_recursion,
        "max_recursion": lineage.max_recursion,
        "max_depth": lineage.max_depth,
    }
    return canonical_json_bytes(payload).decode("utf-8")


def decode_lineage(text: object) -> RunLineage:
    """Decode persisted lineage; anything else raises :class:`LineageInvalidError`."""
    if not isinstance(text, str):
        raise _bad("persisted lineage is not text")
    if len(text) > MAX_LINEAGE_TEXT:
        raise _bad(f"persisted lineage is longer than {MAX_LINEAGE_TEXT} characters")
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _bad(f"persisted lineage is not JSON: {exc}") from None
    if not isinstance(payload, dict) or set(payload) != _KEYS:
        raise _bad("persisted lineage does not have the expected keys")
    if payload["v"] != _FORMAT or type(payload["v"]) is not int:
        raise _bad(f"unknown lineage format {payload['v']!r}", "v")
    raw = payload["ancestors"]
    if not isinstance(raw, list) or not all(
        isinstance(item, list) and len(item) == 2 for item in raw
    ):
        raise _bad("ancestors must be a list of [run_id, pipeline_id] pairs", "ancestors")
    ancestors = tuple(Ancestor(item[0], item[1]) for item in raw)
    return RunLineage(
        root_run_id=payload["root_run_id"],
        depth=payload["depth"],
        pipeline_id=payload["pipeline_id"],
        ancestors=ancestors,
        parent_run_id=payload["parent_run_id"],
        parent_task_id=payload["parent_task_id"],
        allow_recursion=payload["allow_recursion"],
        max_recursion=payload["max_recursion"],
        max_depth=payload["max_depth"],
    )


# --- what the store keeps with a child run ------------------------------------

CHILD_WAIT_PREFIX = "child:"
"""Wait IDs with this prefix are reserved for waits on child runs."""


def child_wait_id(child_run_id: str) -> str:
    """The wait key under which a parent task waits for ``child_run_id``."""
    return CHILD_WAIT_PREFIX + child_run_id


@dataclass(frozen=True, slots=True)
class RunLink:
    """The store's record of a child run: who started it, the wait it resumes
    (``None`` for a child nobody waits for) and the encoded lineage.

    ``lineage`` is opaque to the store: workers decode it, so corrupt text
    is stored as given and fails only the tasks of that run (CL-06).
    """

    run_id: str
    parent_run_id: str
    parent_task_id: str
    root_run_id: str
    lineage: str
    wait_id: str | None = None

    def __post_init__(self) -> None:
        for name in ("run_id", "parent_run_id", "parent_task_id", "root_run_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise _bad(f"{name} must be a non-empty string", name)
        if not isinstance(self.lineage, str):
            raise _bad("lineage must be text", "lineage")
        if self.wait_id is not None and self.wait_id != child_wait_id(self.run_id):
            raise _bad("a child's wait ID must be child_wait_id(run_id)", "wait_id")


def sink_indices(dependencies: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Nodes no other node depends on, given ``RunTopology.dependencies``."""
    used = {parent for parents in dependencies for parent in parents}
    return tuple(index for index in range(len(dependencies)) if index not in used)


def child_result_payload(
    run_id: str,
    status: str,
    error: str | None,
    outputs: dict[str, list[dict[str, object]]],
) -> dict[str, object]:
    """The JSON a finished child hands its waiting parent (the wait response):
    its status and error and the outputs of its sink nodes by slug."""
    return {"run_id": run_id, "status": status, "error": error, "outputs": outputs}
