"""Untrusted input at the edges: deep JSON and unsafe run IDs are refused
with a typed error naming the field and the limit, and store nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dagwerk import DagNode, Engine, RunStatus, TaskContext, TaskInputs
from dagwerk.cli import cli
from dagwerk.constants import MAX_JSON_DEPTH
from dagwerk.errors import JsonLimitError
from dagwerk.identifiers import MAX_IDENTIFIER_LENGTH, InvalidIdentifierError, check_identifier
from dagwerk.json import first_too_deep, parse_json_text

PIPELINE = """\
name: edges
nodes:
  - slug: only
    plugin: noop
"""

BAD_RUN_IDS = [
    "../../etc/passwd",
    "a/b",
    "with space",
    ".hidden",
    "",
    "x" * (MAX_IDENTIFIER_LENGTH + 1),
    "new\nline",
    "café",
]
GOOD_RUN_IDS = ["run-1", "a.b:c_d", "X" * MAX_IDENTIFIER_LENGTH, "2026-12-02T10:00:00"]


def deep_text(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


def test_the_nesting_scan_counts_brackets_outside_strings_only() -> None:
    assert first_too_deep('{"a": "[[[[[[[[["}', 1) is None
    assert first_too_deep('{"a": "\\"[[["}', 1) is None
    assert first_too_deep("[[1]]", 1) == 1
    assert first_too_deep(deep_text(3000), MAX_JSON_DEPTH) is not None
    assert first_too_deep(deep_text(MAX_JSON_DEPTH), MAX_JSON_DEPTH) is None


def test_parse_json_text_refuses_deep_text_before_parsing() -> None:
    with pytest.raises(JsonLimitError) as caught:
        parse_json_text(deep_text(3000), field="--input")
    assert caught.value.code == "json_too_deep"
    assert caught.value.field == "--input"
    assert caught.value.limit == MAX_JSON_DEPTH
    assert parse_json_text(deep_text(2), field="x") == {"a": {"a": 1}}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "edges.yaml").write_text(PIPELINE, encoding="utf-8")
    return tmp_path


def _invoke(workspace: Path, *args: str) -> tuple[int, dict[str, object]]:
    db = f"sqlite:///{workspace / 'edges.db'}"
    result = CliRunner().invoke(
        cli, [*args, "--db", db, "--no-plugin-check", "--json"], catch_exceptions=False
    )
    return result.exit_code, json.loads(result.stdout)["error"]


def _stored_runs(workspace: Path) -> int:
    db = workspace / "edges.db"
    if not db.exists():
        return 0
    return len(Engine(f"sqlite:///{db}").list_runs())


def test_a_deep_input_file_is_refused_with_the_depth_limit(workspace: Path) -> None:
    (workspace / "deep.json").write_text(deep_text(3000), encoding="utf-8")
    code, error = _invoke(
        workspace,
        "submit",
        str(workspace / "edges.yaml"),
        "--input-file",
        str(workspace / "deep.json"),
    )
    assert code == 2
    assert error["code"] == "json_too_deep"
    assert "--input-file" in str(error["message"])
    assert str(MAX_JSON_DEPTH) in str(error["message"])
    assert _stored_runs(workspace) == 0


def test_a_deep_input_argument_is_refused(workspace: Path) -> None:
    code, error = _invoke(
        workspace, "submit", str(workspace / "edges.yaml"), "--input", deep_text(3000)
    )
    assert code == 2
    assert error["code"] == "json_too_deep"
    assert "--input" in str(error["message"])


def test_engine_submit_refuses_a_deep_input_and_stores_nothing() -> None:
    engine = Engine("memory://")
    deep: object = 1
    for _ in range(3000):
        deep = {"a": deep}
    with pytest.raises(ValueError, match=f"maximum depth of {MAX_JSON_DEPTH}"):
        engine.submit([DagNode(slug="only", plugin="noop")], input={"deep": deep})
    assert engine.list_runs() == []


@pytest.mark.parametrize("run_id", BAD_RUN_IDS)
def test_engine_submit_refuses_an_unsafe_run_id(run_id: str) -> None:
    engine = Engine("memory://")
    with pytest.raises(InvalidIdentifierError) as caught:
        engine.submit([DagNode(slug="only", plugin="noop")], run_id=run_id)
    assert caught.value.field == "run_id"
    assert engine.list_runs() == []


def test_an_over_long_run_id_names_the_limit() -> None:
    with pytest.raises(InvalidIdentifierError) as caught:
        check_identifier("x" * (MAX_IDENTIFIER_LENGTH + 1), field="run_id")
    assert caught.value.limit == MAX_IDENTIFIER_LENGTH


@pytest.mark.parametrize("run_id", GOOD_RUN_IDS)
def test_engine_submit_takes_a_safe_run_id(run_id: str) -> None:
    engine = Engine("memory://")
    assert engine.submit([DagNode(slug="only", plugin="noop")], run_id=run_id) == run_id


def test_dagwerk_submit_refuses_an_unsafe_run_id(workspace: Path) -> None:
    code, error = _invoke(
        workspace, "submit", str(workspace / "edges.yaml"), "--run-id", "../../etc/passwd"
    )
    assert code == 2
    assert error["code"] == "identifier_invalid"
    assert "run_id" in str(error["message"])
    assert _stored_runs(workspace) == 0


def test_start_child_refuses_an_unsafe_run_id() -> None:
    engine = Engine("memory://")

    @engine.plugin("parent")
    def parent(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        ctx.start_child([DagNode(slug="leaf", plugin="noop")], run_id="../escape")
        return {}

    result = engine.run([DagNode(slug="root", plugin="parent")], timeout=60)
    assert result.status is RunStatus.FAILED
    assert "run_id '../escape' contains '/'" in (result.error or "")
    assert [run.run_id for run in engine.list_runs()] == [result.run_id]
