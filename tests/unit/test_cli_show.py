"""``dagwerk show`` and ``dagwerk outputs``: what a user reads about one run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dagwerk import TaskContext, TaskInputs
from dagwerk.cli import cli
from dagwerk.constants import InputMode
from dagwerk.engine import Engine
from dagwerk.models import DagNode, InputEdge

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
