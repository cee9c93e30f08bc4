"""The read-only views of the dashboard (``RunViewStore``) over the memory store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.json import JsonValue, ReadOnlyDict
from dagwerk.models import ResolvedOutput
from dagwerk.store import TaskRecord
from dagwerk.store_views import (
    NodeTaskStats,
    RunCursor,
    RunPage,
    RunQuery,
    TaskQuery,
    TaskWait,
    check_run_ids,
    check_since,
)

from ._base import MemoryStoreBase
from ._runs import run_record
from ._state import RunState, TaskState
from ._tasks import task_record


def _matches(run: RunState, query: RunQuery) -> bool:
    if query.status is not None and run.status is not query.status:
        return False
    if query.pipeline is not None and run.pipeline != query.pipeline:
        return False
    if query.created_after is not None and run.created_at < query.created_after:
        return False
    if query.created_before is not None and run.created_at >= query.created_before:
        return False
    after = query.after
    return after is None or (run.created_at, run.run_id) < (after.created_at, after.run_id)


class ViewsMixin(MemoryStoreBase):
    def list_runs_page(self, query: RunQuery) -> RunPage:
        with self._lock:
            ordered = sorted(
                (run for run in self._runs.values() if _matches(run, query)),
                key=lambda run: (run.created_at, run.run_id),
                reverse=True,
            )
            page = tuple(run_record(run) for run in ordered[: query.limit])
        more = len(ordered) > query.limit
        last = page[-1] if page else None
        cursor = RunCursor(last.created_at, last.run_id) if more and last is not None else None
        return RunPage(page, cursor)

    def run_status_counts_since(self, since: float) -> Mapping[RunStatus, int]:
        start = check_since(since)
        counts: dict[RunStatus, int] = {}
        with self._lock:
            for run in self._runs.values():
                if run.created_at >= start:
                    counts[run.status] = counts.get(run.status, 0) + 1
        return ReadOnlyDict(counts)

    def run_task_counts(self, run_ids: Sequence[str]) -> Mapping[str, Mapping[TaskStatus, int]]:
        wanted = check_run_ids(run_ids)
        found: dict[str, Mapping[TaskStatus, int]] = {}
        with self._lock:
            for run_id in wanted:
                run = self._runs.get(run_id)
                if run is not None:
                    found[run_id] = ReadOnlyDict({s: n for s, n in run.counts.items() if n})
        return found

    def node_task_stats(self, run_id: str) -> list[NodeTaskStats] | None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return None
            by_node: dict[int, list[TaskState]] = {}
            for task_id in run.task_ids:
                task = self._tasks[task_id]
                if not task.invalidated:
                    by_node.setdefault(task.node_index, []).append(task)
            stats: list[NodeTaskStats] = []
            for index, launch in sorted(run.launches.items()):
                tasks = by_node.get(index, [])
                counts: dict[TaskStatus, int] = {}
                for task in tasks:
                    counts[task.status] = counts.get(task.status, 0) + 1
                started = [t.started_at for t in tasks if t.started_at is not None]
                finished = [t.finished_at for t in tasks if t.finished_at is not None]
                stats.append(
                    NodeTaskStats(
                        node_index=index,
                        disposition=launch.disposition,
                        complete=launch.complete,
                        error=launch.error or None,
                        counts=ReadOnlyDict(counts),
                        attempts=sum(t.attempt_number for t in tasks),
                        first_started_at=min(started) if started else None,
                        last_finished_at=max(finished) if finished else None,
                    )
                )
            return stats

    def list_tasks_page(self, run_id: str, query: TaskQuery) -> list[TaskRecord]:
        found: list[TaskRecord] = []
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return found
            ids = run.task_ids
            start = 0
            if query.after is not None:
                after = self._tasks.get(query.after)
                if after is None or after.run_id != run_id:
                    return found
                start = ids.index(query.after) + 1
            for task_id in ids[start:]:
                task = self._tasks[task_id]
                if task.invalidated:
                    continue
                if query.node_index is not None and task.node_index != query.node_index:
                    continue
                if query.status is not None and task.status is not query.status:
                    continue
                found.append(task_record(task))
                if len(found) == query.limit:
                    break
        return found

    def list_task_waits(self, task_id: str) -> list[TaskWait]:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return []
            entries = sorted(
                (self._waits[(task_id, wait_id)] for wait_id in task.wait_ids),
                key=lambda entry: (entry.waited_at, entry.wait_id),
            )
            return [
                TaskWait(
                    wait_id=entry.wait_id,
                    state=entry.state.value,
                    attempt_id=entry.attempt_id,
                    waited_at=entry.waited_at,
                    resumed_attempt_id=(
                        None if entry.resume is None else entry.resume.resumed_attempt_id
                    ),
                    response=entry.response,
                )
                for entry in entries
            ]

    def list_task_outputs(self, task_id: str) -> list[ResolvedOutput]:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return []
            run = self._runs[task.run_id]
            prefix = f"{task_id}/"
            return [
                run.outputs[output_id].resolved
                for output_id in run.node_outputs.get(task.node_index, ())
                if output_id.startswith(prefix) and not run.outputs[output_id].invalidated
            ]

    def get_run_input(self, run_id: str) -> JsonValue | None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return None
            return run.run_input
