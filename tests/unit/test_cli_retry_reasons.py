"""``dagwerk retry`` says why a run cannot be retried, and what happened when it can."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dagwerk import TaskContext, TaskInputs
from dagwerk.cli import cli
from dagwerk.constants import InputMode
from dagwerk.engine import Engine
from dagwerk.models import DagNode, InputEdge

NODES = [
    DagNode(slug="fetch", plugin="retry_reasons_fetch"),
    DagNode(
        slug="store",
        plugin="retry_reasons_store",
        input_mode=InputMode.ALL,
        edges=(InputEdge(name="pages", source="fetch"),),
    ),
]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'retry.db'}"


def _engine(url: str, tmp_path: Path, *, store_fails: bool) -> Engine:
    engine = Engine(url, execution_root=tmp_path)

    @engine.plugin("retry_reasons_fetch")
    def fetch(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        return {"page": "<html>"}

    @engine.plugin("retry_reasons_store")
    def store(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        if store_fails:
            raise RuntimeError("the page store is down")
        return {"stored": True}

    return engine


def _retry(url: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["retry", *args, "--db", url])
    return result.exit_code, result.stdout, result.stderr


def test_retry_of_a_missing_run_says_it_does_not_exist(url: str, tmp_path: Path) -> None:
    with _engine(url, tmp_path, store_fails=False) as engine:
        engine.run(NODES)
    code, _, err = _retry(url, "run-nosuchrun")
    assert code == 1
    assert err == "error: run 'run-nosuchrun' does not exist\n"


def test_retry_of_a_completed_run_points_at_rerun(url: str, tmp_path: Path) -> None:
    with _engine(url, tmp_path, store_fails=False) as engine:
        run_id = engine.run(NODES).run_id
    code, _, err = _retry(url, run_id)
    assert code == 1
    assert err.count("\n") == 1
    assert "cannot be retried: it completed" in err
    assert f"dagwerk rerun {run_id} --node SLUG" in err


def test_retry_from_a_node_that_did_not_fail_names_the_failed_nodes(
    url: str, tmp_path: Path
) -> None:
    with _engine(url, tmp_path, store_fails=True) as engine:
        run_id = engine.run(NODES).run_id
    code, _, err = _retry(url, run_id, "--from", "fetch")
    assert code == 1
    assert "from node 'fetch': it did not fail (failed nodes: store)" in err


def test_retry_of_a_running_run_says_it_is_still_running(url: str, tmp_path: Path) -> None:
    with _engine(url, tmp_path, store_fails=False) as engine:
        run_id = engine.submit(NODES)  # no worker: it stays running
    code, _, err = _retry(url, run_id)
    assert code == 1
    assert "cannot be retried: it is still running" in err
    assert f"dagwerk cancel {run_id}" in err


def test_retry_from_a_node_of_a_cancelled_run_says_to_retry_it_whole(
    url: str, tmp_path: Path
) -> None:
    with _engine(url, tmp_path, store_fails=False) as engine:
        run_id = engine.submit(NODES)
        assert engine.cancel(run_id)
    code, _, err = _retry(url, run_id, "--from", "store")
    assert code == 1
    assert "it was cancelled" in err and "without naming nodes" in err


def test_a_successful_retry_says_which_nodes_run_again_in_words(url: str, tmp_path: Path) -> None:
    with _engine(url, tmp_path, store_fails=True) as engine:
        run_id = engine.run(NODES).run_id
    code, out, _ = _retry(url, run_id, "--from", "store")
    assert code == 0
    assert out.splitlines() == [
        f"run {run_id}: reopened (retry 1); node store will run again; "
        "the other node keeps its outputs",
        f"next: start a worker to run them (dagwerk worker --pipeline FILE [--burst]); "
        f"then: dagwerk show {run_id}",
    ]
    again = CliRunner().invoke(cli, ["retry", run_id, "--db", url, "--json"])
    assert again.exit_code == 1
    assert "it is still running" in json.loads(again.stdout)["error"]["message"]
