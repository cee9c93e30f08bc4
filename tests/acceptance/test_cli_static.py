"""The `dagwerk` command as a user runs it: validate, graph and schema in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pipelines"
ETL = str(EXAMPLES / "etl.yaml")
BROKEN = "nodes:\n  - slug: a\n    plugin: p\n  - slug: b\n    plugin: p\n    input_mode: all\n"
BROKEN += "    edges: [{name: r, source: nowhere}]\n"


def dagwerk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dagwerk", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def broken(tmp_path: Path) -> str:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN, encoding="utf-8")
    return str(path)


def test_validate_prints_a_one_line_summary_and_exits_0() -> None:
    result = dagwerk("validate", ETL)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"valid {ETL}: pipeline 'etl' has 7 nodes, 8 edges")


def test_validate_reports_an_invalid_file_in_one_line_and_exits_2(broken: str) -> None:
    result = dagwerk("validate", broken)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: {broken}:7: node 'b', field 'edges[0].source': "
        "edge 'r' references unknown source 'nowhere'"
    ]


def test_debug_shows_the_traceback(broken: str) -> None:
    result = dagwerk("--debug", "validate", broken)
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert "PipelineFileError" in result.stderr


def test_validate_json_output(broken: str) -> None:
    good = dagwerk("validate", "--json", ETL)
    assert good.returncode == 0
    summary = json.loads(good.stdout)
    assert summary["valid"] is True
    assert summary["roots"] == ["extract", "settings"]
    assert summary["node_count"] == len(summary["nodes"]) == 7
    assert summary["defaults"] == {"since": "2024-01-01", "currency": "eur"}
    bad = dagwerk("validate", "--json", broken)
    assert bad.returncode == 2
    report = json.loads(bad.stdout)
    assert report["valid"] is False
    assert report["error"]["line"] == 7
    assert report["error"]["node"] == "b"
    assert report["error"]["field"] == "edges[0].source"
    assert report["error"]["rule"] == "unknown_source"


def test_a_missing_file_is_invalid_input(tmp_path: Path) -> None:
    result = dagwerk("validate", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("fmt", ["mermaid", "dot"])
def test_graph_draws_the_example(fmt: str) -> None:
    result = dagwerk("graph", ETL, "--format", fmt)
    assert result.returncode == 0, result.stderr
    header = "flowchart LR" if fmt == "mermaid" else 'digraph "etl" {'
    assert result.stdout.splitlines()[0] == header
    for label in ("cleaned", "scored", "orders (top 3 by amount desc)", "mode: by_correlation"):
        assert label in result.stdout


def test_graph_writes_to_a_file_and_rejects_unknown_formats(tmp_path: Path) -> None:
    target = tmp_path / "etl.dot"
    result = dagwerk("graph", ETL, "--format", "dot", "--output", str(target))
    assert result.returncode == 0
    assert result.stdout == ""
    assert target.read_text(encoding="utf-8").startswith("digraph")
    assert dagwerk("graph", ETL, "--format", "svg").returncode == 2


def test_graph_of_an_invalid_file_exits_2(broken: str) -> None:
    result = dagwerk("graph", broken)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1


def test_schema_prints_the_json_schema() -> None:
    result = dagwerk("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["required"] == ["nodes"]
    assert "DagNode" in schema["$defs"]


@pytest.mark.parametrize("command", [[], ["validate"], ["graph"], ["schema"]])
def test_every_command_help_has_an_example(command: list[str]) -> None:
    result = dagwerk(*command, "--help")
    assert result.returncode == 0
    assert "Example" in result.stdout
    assert "dagwerk " in result.stdout.split("Example", 1)[1]


def test_unknown_commands_are_usage_errors() -> None:
    result = dagwerk("frobnicate")
    assert result.returncode == 2
    assert "No such command" in result.stderr
