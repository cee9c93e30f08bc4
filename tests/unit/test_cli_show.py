"""``dagwerk show`` and ``dagwerk outputs``: what a user reads about one run."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dagwerk import TaskContext, TaskInputs
from dagwerk.backends.sqlite.migrations import MIGRATIONS
from dagwerk.cli import cli
from dagwerk.constants import InputMode
from dagwerk.engine import Engine
from dagwerk.models import DagNode, InputEdge
from dagwerk.testing.contract_queue import FakeClock

WAITING = [
    DagNode(slug="draft", plugin="show_draft"),
    DagNode(
        slug="review",
        plugin="show_review",
        input_mode=InputMode.EACH,
        edges=(InputEdge(name="drafts", source="draft"),),
    ),
]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'show.db'}"


def _engine(url: str, tmp_path: Path) -> Engine:
    engine = Engine(url, execution_root=tmp_path)

    @engine.plugin("show_draft")
    def draft(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, object]]:
        return [{"title": f"post {n}"} for n in range(3)]

    @engine.plugin("show_review")
    def review(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        if ctx.resumed_from_wait_id is None:
            ctx.wait("approval")
        return {"approved": True}

    return engine


def _waiting_run(url: str, tmp_path: Path) -> str:
    with _engine(url, tmp_path) as engine:
        run_id = engine.submit(WAITING)
        engine.worker(concurrency=4).run_until_idle()
    return run_id


def _show_json(url: str, *args: str) -> Any:
    result = CliRunner().invoke(cli, ["show", *args, "--db", url, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_waiting_attempt_shows_its_state_not_null(url: str, tmp_path: Path) -> None:
    run_id = _waiting_run(url, tmp_path)
    shown = _show_json(url, run_id)
    reviews = [task for task in shown["tasks"] if task["node"] == "review"]
    assert len(reviews) == 3
    for task in reviews:
        assert task["status"] == "waiting"
        (attempt,) = task["attempts"]
        assert attempt["status"] == "waiting"
    (draft,) = [task for task in shown["tasks"] if task["node"] == "draft"]
    assert [a["status"] for a in draft["attempts"]] == ["completed"]


def _show(url: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["show", *args, "--db", url])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_show_summarises_per_node_and_lists_tasks_only_when_asked(url: str, tmp_path: Path) -> None:
    run_id = _waiting_run(url, tmp_path)
    summary = _show(url, run_id).splitlines()
    assert summary[0].startswith(f"run {run_id}: running (nodes 1/2, ")
    assert ", created " in summary[0]
    assert summary[1] == "nodes:"
    assert [line.split()[0] for line in summary[3:5]] == ["draft", "review"]
    assert summary[4].endswith("3 waiting")
    # No per-task table in the summary: one waiting line per wait, and a pointer.
    assert not any(line == "tasks:" for line in summary)
    assert sum(line.startswith("waiting: task ") for line in summary) == 3
    assert summary[-1] == (
        f"tasks: dagwerk show {run_id} --tasks [--node SLUG] [--status STATUS] --db {url}"
    )

    listed = _show(url, run_id, "--tasks").splitlines()
    assert listed[1] == "tasks:"
    assert len(listed) == 2 + 1 + 4  # header line, table header, 4 tasks
    waiting = _show(url, run_id, "--tasks", "--status", "waiting").splitlines()
    assert len(waiting) == 3 + 3 and all("waiting on approval" in line for line in waiting[3:])
    drafts = _show(url, run_id, "--tasks", "--node", "draft").splitlines()
    assert len(drafts) == 3 + 1 and " completed " in drafts[3]

    filtered = _show_json(url, run_id, "--node", "review", "--status", "waiting")
    assert len(filtered["tasks"]) == 3 and len(filtered["nodes"]) == 2
    unknown = CliRunner().invoke(cli, ["show", run_id, "--node", "nope", "--db", url])
    assert unknown.exit_code == 2 and "has no node 'nope'" in unknown.stderr


def test_show_tasks_prints_when_each_task_started_and_how_long_it_took(
    url: str, tmp_path: Path
) -> None:
    clock = FakeClock(1_700_000_000.0)  # 2023-11-14 22:13:20 UTC
    with Engine(url, execution_root=tmp_path, clock=clock) as engine:

        @engine.plugin("timed_fetch")
        def fetch(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            clock.advance(0.04)
            return {"page": 1}

        @engine.plugin("timed_store")
        def store(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
            clock.advance(65.0)
            return {"stored": True}

        run_id = engine.submit(
            [
                DagNode(slug="fetch", plugin="timed_fetch"),
                DagNode(
                    slug="store",
                    plugin="timed_store",
                    input_mode=InputMode.ALL,
                    edges=(InputEdge(name="pages", source="fetch"),),
                ),
            ]
        )
        engine.worker(concurrency=1).run_until_idle()
    listed = _show(url, run_id, "--tasks").splitlines()
    assert listed[2].split()[4:] == ["started", "took", "error", "/", "wait"]
    rows = {line.split()[1]: line.split() for line in listed[3:]}
    assert rows["fetch"][2:7] == ["completed", "1", "2023-11-14", "22:13:20", "40ms"]
    assert rows["store"][2:7] == ["completed", "1", "2023-11-14", "22:13:20", "1m05s"]

    times = {
        task["node"]: (task["started_at"], task["finished_at"], task["attempts"])
        for task in _show_json(url, run_id)["tasks"]
    }
    started, finished, (attempt,) = times["store"]
    assert (started, finished) == pytest.approx((1_700_000_000.04, 1_700_000_065.04))
    assert (attempt["started_at"], attempt["finished_at"]) == (started, finished)
    started, finished, (attempt,) = times["fetch"]
    assert (started, finished) == pytest.approx((1_700_000_000.0, 1_700_000_000.04))
    assert (attempt["started_at"], attempt["finished_at"]) == (started, finished)


def test_worker_burst_says_what_it_did_in_words(url: str, tmp_path: Path) -> None:
    plugins = tmp_path / "burst_words_plugins.py"
    plugins.write_text(
        "import dagwerk\n\n"
        "@dagwerk.plugin('burst_words')\n"
        "def words(inputs, ctx):\n"
        "    return {'ok': True}\n",
        encoding="utf-8",
    )
    pipeline = tmp_path / "burst.yaml"
    pipeline.write_text(
        "name: burst\nplugins: [burst_words_plugins]\nnodes:\n"
        "  - {slug: one, plugin: burst_words}\n",
        encoding="utf-8",
    )
    runner = CliRunner()
    assert runner.invoke(cli, ["submit", str(pipeline), "--db", url]).exit_code == 0
    worked = runner.invoke(cli, ["worker", "--pipeline", str(pipeline), "--db", url, "--burst"])
    assert worked.exit_code == 0, worked.output
    assert worked.stderr.strip().endswith(
        ": no work left after 1 task attempt (retries and resumes count as attempts)"
    )


def test_tasks_stored_before_attempt_times_show_none(url: str, tmp_path: Path) -> None:
    """A database of schema version 8 (no attempt times) upgrades with NULL
    times for the attempts it holds; show prints ``-`` and ``null`` for them."""
    run_id = _waiting_run(url, tmp_path)
    conn = sqlite3.connect(tmp_path / "show.db")
    with conn:  # back to version 8: the columns of version 9 dropped, and later tables
        # (and the later versions' indexes that cover them)
        conn.execute("DROP INDEX dagwerk_tasks_node_stats")
        conn.execute("DROP INDEX dagwerk_runs_created_status")
        for table in ("dagwerk_tasks", "dagwerk_attempts"):
            for column in ("started_at", "finished_at"):
                conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        # Tables of later versions go too, so every migration after 8 runs again.
        scratch = sqlite3.connect(":memory:")
        for version, path in MIGRATIONS:
            if version <= 8:
                scratch.executescript(path.read_text(encoding="utf-8"))
        kept = {row[0] for row in scratch.execute("SELECT name FROM sqlite_master")}
        scratch.close()
        tables = [
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        for table in tables:
            later = table not in kept and table.startswith("dagwerk_")
            if later and table != "dagwerk_schema_version":
                conn.execute(f"DROP TABLE {table}")
        conn.execute("ALTER TABLE dagwerk_runs DROP COLUMN traceparent")
        conn.execute("DELETE FROM dagwerk_schema_version WHERE version >= 9")
    conn.close()
    shown = _show_json(url, run_id)  # opening the store migrates forward
    for task in shown["tasks"]:
        assert (task["started_at"], task["finished_at"]) == (None, None)
        assert [(a["started_at"], a["finished_at"]) for a in task["attempts"]] == [(None, None)]
    rows = _show(url, run_id, "--tasks").splitlines()[3:]
    assert len(rows) == 4
    assert all(row.split()[4:6] == ["-", "-"] for row in rows)
