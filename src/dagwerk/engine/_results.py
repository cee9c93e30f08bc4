"""What an engine reports about a run: its result, its progress and its
place among composite runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dagwerk.constants import RUN_TERMINAL_STATUSES, RunStatus, TaskStatus
from dagwerk.errors import DagwerkError
from dagwerk.json import ReadOnlyDict, thaw_json
from dagwerk.lineage import RunLink
from dagwerk.models import ResolvedOutput
from dagwerk.store import DagChildStore, RunRecord
from dagwerk.store_results import RunOutputsStore

__all__ = [
    "MAX_TREE_RUNS",
    "RunLineage",
    "RunNotFoundError",
    "RunProgress",
    "RunResult",
    "RunTree",
    "read_lineage",
    "read_progress",
    "read_result",
]

MAX_TREE_RUNS = 1_000
"""A run's lineage lists at most this many runs of its tree (the run included)."""


class RunNotFoundError(DagwerkError, LookupError):
    """No run with that ID exists in the engine's store."""

    code = "run_not_found"


@dataclass(frozen=True, slots=True)
class RunResult:
    """A run as it stands: ``outputs`` maps each node slug to the outputs its
    active generation published (each with ``.id``, ``.fields``, ``.data``)."""

    run_id: str
    status: RunStatus
    error: str | None
    outputs: Mapping[str, tuple[ResolvedOutput, ...]] = field(default_factory=ReadOnlyDict)

    @property
    def ok(self) -> bool:
        """Whether the run COMPLETED."""
        return self.status is RunStatus.COMPLETED

    @property
    def terminal(self) -> bool:
        return self.status in RUN_TERMINAL_STATUSES

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``--json`` output of the CLI)."""
        return {
            "run_id": self.run_id,
            "status": self.status.value,
            "error": self.error,
            "outputs": {
                slug: [
                    {"id": out.id, "fields": thaw_json(out.fields), "data": thaw_json(out.data)}
                    for out in outputs
                ]
                for slug, outputs in self.outputs.items()
            },
        }


@dataclass(frozen=True, slots=True)
class RunProgress:
    """Counts of a run's active generation, for progress displays."""

    run_id: str
    status: RunStatus
    nodes_total: int
    nodes_settled: int
    tasks: Mapping[TaskStatus, int]
    error: str | None = None
    fault: str | None = None
    """The store fault the run's worker waits out (its one line), if any."""
    fault_seconds: float = 0.0
    """How long that fault has lasted."""

    def count(self, status: TaskStatus) -> int:
        return self.tasks.get(status, 0)

    @property
    def terminal(self) -> bool:
        return self.status in RUN_TERMINAL_STATUSES

    def summary(self) -> str:
        """One plain line: ``running: nodes 2/4, tasks 3 done, 1 running, ...``."""
        parts = [
            f"{self.count(TaskStatus.COMPLETED)} done",
            f"{self.count(TaskStatus.RUNNING)} running",
            f"{self.count(TaskStatus.QUEUED)} queued",
        ]
        for status in (TaskStatus.WAITING, TaskStatus.FAILED, TaskStatus.CRASHED):
            if self.count(status):
                parts.append(f"{self.count(status)} {status.value}")
        line = (
            f"{self.status.value}: nodes {self.nodes_settled}/{self.nodes_total}, "
            f"tasks {', '.join(parts)}"
        )
        if self.fault is not None:
            # Without the fault's age: a plain display prints a changed line,
            # and the fault's own log lines say how long it lasts.
            line += f"; waiting out a store fault: {self.fault}"
        return line


def read_progress(store: Any, run_id: str) -> RunProgress:
    """Read the run's record and task counts (two reads; not one snapshot)."""
    run = store.get_run(run_id)
    if run is None:
        raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
    counts: dict[TaskStatus, int] = {}
    for task in store.list_tasks(run_id):
        counts[task.status] = counts.get(task.status, 0) + 1
    return RunProgress(
        run_id=run_id,
        status=run.status,
        nodes_total=run.node_count,
        nodes_settled=run.settled_nodes,
        tasks=ReadOnlyDict(counts),
        error=run.error,
    )


def read_result(store: Any, run_id: str, run_outputs: RunOutputsStore | None = None) -> RunResult:
    """The run's status, error and the outputs of every node's active
    generation; with ``run_outputs`` (the store's capability) every node's
    outputs come from one read."""
    run = store.get_run(run_id)
    if run is None:
        raise RunNotFoundError(f"run {run_id!r} does not exist", field="run_id")
    nodes = store.get_run_nodes(run_id) or []
    outputs: dict[str, tuple[ResolvedOutput, ...]] = {}
    if run_outputs is not None:
        published = run_outputs.get_run_outputs(run_id)
        for index, node in enumerate(nodes):
            outputs[node.slug] = published.get(index, ())
    else:
        for index, node in enumerate(nodes):
            ids = tuple(store.get_output_ids(run_id, index))
            resolved: Mapping[str, ResolvedOutput] = (
                store.resolve_outputs(run_id, ids) if ids else {}
            )
            outputs[node.slug] = tuple(resolved[i] for i in ids if i in resolved)
    return RunResult(
        run_id=run_id,
        status=run.status,
        error=run.error,
        outputs=ReadOnlyDict(outputs),
    )


@dataclass(frozen=True, slots=True)
class RunTree:
    """A run and the child runs its tasks started, each with its own
    children, oldest first. ``status`` is ``None`` for a child run whose
    record the store does not hold."""

    run_id: str
    status: RunStatus | None
    children: tuple[RunTree, ...] = ()


@dataclass(frozen=True, slots=True)
class RunLineage:
    """A run's place among composite runs: ``link`` to the task that started
    it (``None`` for a root run) and the tree of runs started under it."""

    link: RunLink | None
    children: tuple[RunTree, ...]


def read_lineage(
    store: Any, children: DagChildStore, run_id: str, *, max_runs: int = MAX_TREE_RUNS
) -> RunLineage:
    """The run's link and its tree of child runs, depth first, with at most
    ``max_runs`` runs in all (the run included); each run is listed once."""
    seen = {run_id}

    def tree(parent_id: str) -> tuple[RunTree, ...]:
        found: list[RunTree] = []
        for child_id in children.list_child_runs(parent_id):
            if child_id in seen or len(seen) >= max_runs:
                continue
            seen.add(child_id)
            record: RunRecord | None = store.get_run(child_id)
            status = record.status if record is not None else None
            found.append(RunTree(child_id, status, tree(child_id)))
        return tuple(found)

    return RunLineage(link=children.get_run_link(run_id), children=tree(run_id))
