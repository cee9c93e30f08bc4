"""The checks of a chaos run: the report, the queue probe and the final check
of the database and the ledger (see ``driver.py``)."""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos_plugins import ledger_name

from dagwerk.constants import RUN_TERMINAL_STATUSES, RunStatus, TaskStatus
from dagwerk.models import DagNode


@dataclass(frozen=True)
class Planned:
    """One run to submit: its nodes and what its plugins dictate."""

    kind: str
    nodes: list[DagNode]
    status: RunStatus
    # slug -> expected sorted output values of field ``key`` (completed runs)
    expected: dict[str, tuple[str, list[int]]]
    # slug -> expected number of outputs (completed runs)
    counts: dict[str, int]


# --- the report ------------------------------------------------------------------


@dataclass
class ChaosReport:
    seed: int
    backend: str
    seconds: float = 0.0
    runs: int = 0
    runs_by_kind: Counter[str] = field(default_factory=Counter)
    tasks: int = 0
    attempts: int = 0
    plugin_executions: int = 0
    crashed_attempts: int = 0
    failed_attempts: int = 0
    duplicate_executions: int = 0
    abandoned_executions: int = 0
    resumes: int = 0
    kills: int = 0
    workers_started: int = 0
    unexpected_worker_exits: int = 0
    locks_held: int = 0
    probes: int = 0
    queued_seen: int = 0
    worker_errors: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.runs_by_kind.items()))
        return (
            f"chaos {self.backend} seed={self.seed}: {self.seconds:.0f}s, "
            f"{self.runs} runs ({kinds}), "
            f"{self.tasks} tasks, {self.attempts} attempts, {self.plugin_executions} plugin "
            f"executions ({self.abandoned_executions} by abandoned attempts, "
            f"{self.duplicate_executions} of one attempt twice), {self.crashed_attempts} crashed "
            f"attempts, {self.failed_attempts} failed attempts, {self.resumes} resumes, "
            f"{self.kills} kills, {self.workers_started} workers started, "
            f"{self.unexpected_worker_exits} unexpected exits, "
            f"{self.locks_held} SQLite locks held, {self.probes} invariant probes "
            f"({self.queued_seen} QUEUED tasks seen), "
            f"{len(self.worker_errors)} worker log errors; lost {len(self.lost)}, "
            f"violations {len(self.violations)}"
        )


def store_options(url: str) -> dict[str, Any]:
    return {"pool_size": 2} if url.startswith("postgres") else {}


# --- the queue invariants, read in one snapshot ------------------------------------

_QUEUED_WITHOUT_DELIVERY = (
    "SELECT t.task_id FROM dagwerk_tasks t WHERE t.status = 'queued' AND NOT EXISTS "
    "(SELECT 1 FROM dagwerk_deliveries d "
    "WHERE d.task_id = t.task_id AND d.attempt_id = t.attempt_id)"
)
_DELIVERY_WITHOUT_TASK = (
    "SELECT d.delivery_id FROM dagwerk_deliveries d WHERE NOT EXISTS "
    "(SELECT 1 FROM dagwerk_tasks t WHERE t.task_id = d.task_id)"
)
_QUEUED = "SELECT COUNT(*) FROM dagwerk_tasks WHERE status = 'queued'"


def probe_queue(url: str, report: ChaosReport) -> None:
    """Check, in one read snapshot of the raw tables, that every QUEUED task
    has a delivery of its current attempt and every delivery has its task."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN")
            missing = [row[0] for row in conn.execute(_QUEUED_WITHOUT_DELIVERY)]
            orphans = [row[0] for row in conn.execute(_DELIVERY_WITHOUT_TASK)]
            (queued,) = conn.execute(_QUEUED).fetchone()
            conn.execute("COMMIT")
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(url) as pg:
            pg.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            missing = [row[0] for row in pg.execute(_QUEUED_WITHOUT_DELIVERY)]
            orphans = [row[0] for row in pg.execute(_DELIVERY_WITHOUT_TASK)]
            row = pg.execute(_QUEUED).fetchone()
            queued = row[0] if row else 0
            pg.execute("COMMIT")
    report.probes += 1
    report.queued_seen += int(queued)
    report.violations.extend(f"{task}: QUEUED without a delivery (probe)" for task in missing)
    report.violations.extend(f"delivery {d} has no task (probe)" for d in orphans)


# --- the check -----------------------------------------------------------------------


def _ledger(ledger: Path) -> tuple[set[str], Counter[str]]:
    """(ledger names of the attempts that executed, name -> extra executions).

    Names, not contents: a worker killed between creating its entry and
    writing it leaves an empty file, which still counts as an execution.
    """
    names: set[str] = set()
    extra: Counter[str] = Counter()
    for path in ledger.iterdir():
        if path.name == "stop" or path.name.startswith("."):
            continue
        if path.name.startswith("dup-"):
            extra[path.name.removeprefix("dup-").rsplit("-", 2)[0]] += 1
        else:
            names.add(path.name)
    return names, extra


RAN_TO_AN_END = {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.WAITING}


def check(url: str, planned: dict[str, Planned], ledger: Path, report: ChaosReport) -> None:
    """Check the database and the ledger; fills ``report.lost`` and ``report.violations``."""
    from dagwerk.engine import open_store

    store = open_store(url, **store_options(url))
    entries, extra = _ledger(ledger)
    report.plugin_executions = len(entries) + sum(extra.values())
    report.duplicate_executions = sum(extra.values())
    known_attempts: set[str] = set()
    known_tasks: set[str] = set()
    bad = report.violations.append
    try:
        for run_id, plan in planned.items():
            run = store.get_run(run_id)
            if run is None or run.status not in RUN_TERMINAL_STATUSES:
                report.lost.append(f"{run_id}: {run.status if run else 'missing'}")
                if run is not None:
                    report.lost.extend(_describe(store, run_id))
                continue
            if run.status is not plan.status:
                report.lost.append(
                    f"{run_id}: {run.status.value}, expected {plan.status.value} ({run.error})"
                )
            nodes = store.get_run_nodes(run_id)
            slugs = [n.slug for n in nodes]
            tasks = store.list_tasks(run_id, include_invalidated=True)
            report.tasks += len(tasks)
            for task in tasks:
                known_tasks.add(task.task_id)
                node = nodes[task.node_index]
                attempts = store.list_attempts(task.task_id)
                report.attempts += len(attempts)
                for attempt in attempts:
                    known_attempts.add(ledger_name(attempt.attempt_id))
                    report.crashed_attempts += attempt.status is TaskStatus.CRASHED
                    report.failed_attempts += attempt.status is TaskStatus.FAILED
                completed = [a for a in attempts if a.status is TaskStatus.COMPLETED]
                if len(completed) != (task.status is TaskStatus.COMPLETED):
                    bad(
                        f"{task.task_id}: {task.status.value} with "
                        f"{len(completed)} completed attempts"
                    )
                limit = node.retry.max_attempts if node.retry is not None else 1
                for attempt in attempts[:-1]:
                    if attempt.status is TaskStatus.FAILED and attempt.number >= limit:
                        bad(f"{task.task_id}: retried after attempt {attempt.number} (max {limit})")
                for attempt in attempts:
                    name = ledger_name(attempt.attempt_id)
                    ran = name in entries
                    if (
                        attempt.status in RAN_TO_AN_END
                        and not ran
                        and not _failed_before_plugin(attempt)
                    ):
                        bad(
                            f"{task.task_id}: attempt {attempt.number} {attempt.status} "
                            "is not in the ledger"
                        )
                    if extra[name] and attempt.status is not TaskStatus.CRASHED:
                        bad(
                            f"{task.task_id}: attempt {attempt.number} ran twice "
                            f"but is {attempt.status}"
                        )
                    if ran and attempt.status is TaskStatus.CRASHED:
                        report.abandoned_executions += 1
                if (
                    run.status is RunStatus.COMPLETED
                    and task.status is not TaskStatus.COMPLETED
                    and not task.invalidated
                ):
                    bad(f"{task.task_id}: {task.status.value} in a completed run")
            if run.status is RunStatus.COMPLETED:
                for slug, count in plan.counts.items():
                    ids = store.get_output_ids(run_id, slugs.index(slug))
                    if len(ids) != count or len(set(ids)) != len(ids):
                        report.lost.append(f"{run_id}/{slug}: {len(ids)} outputs, expected {count}")
                for slug, (key, values) in plan.expected.items():
                    ids = store.get_output_ids(run_id, slugs.index(slug))
                    got = sorted(
                        int(str(o.fields[key])) for o in store.resolve_outputs(run_id, ids).values()
                    )
                    if got != sorted(values):
                        report.lost.append(f"{run_id}/{slug}: {got}, expected {sorted(values)}")
            by_attempt = {d.attempt_id for d in store.list_deliveries(run_id)}
            for task in tasks:
                if task.status is TaskStatus.QUEUED and task.attempt_id not in by_attempt:
                    bad(f"{task.task_id}: QUEUED without a delivery")
        for delivery in store.list_deliveries(None):
            if delivery.task_id not in known_tasks and store.get_task(delivery.task_id) is None:
                bad(f"delivery {delivery.delivery_id} points at missing task {delivery.task_id}")
        for dead in store.list_dead_letters(None):
            bad(f"dead letter {dead.dead_letter_id} of {dead.task_id}: {dead.reason}")
        for name in sorted(entries - known_attempts):
            bad(f"ledger entry {name} is unknown to the store")
    finally:
        store.close()


def _describe(store: Any, run_id: str) -> list[str]:
    """The state of a run that did not end: its tasks, attempts and deliveries."""
    lines = []
    deliveries = store.list_deliveries(run_id)
    for task in store.list_tasks(run_id, include_invalidated=True):
        attempts = [
            (a.number, a.status, a.worker_id, a.error) for a in store.list_attempts(task.task_id)
        ]
        queued = [d.delivery_id for d in deliveries if d.task_id == task.task_id]
        lines.append(
            f"    {task.task_id} {task.status.value} attempt {task.attempt_number} "
            f"wait={task.active_wait_id} invalidated={task.invalidated} "
            f"attempts={attempts} deliveries={queued}"
        )
    launches = store.list_node_launches(run_id)
    lines.append(f"    launches: {dict(launches)}")
    activity = getattr(store, "get_run_activity", None)
    if activity is not None:
        lines.append(f"    activity: {activity(run_id)}")
    return lines


def _failed_before_plugin(attempt: Any) -> bool:
    """A FAILED attempt whose plugin never started: a fail-fast cancellation
    or input resolution, recorded with a non-plugin error."""
    return attempt.status is TaskStatus.FAILED and "ChaosFailure" not in (attempt.error or "")
