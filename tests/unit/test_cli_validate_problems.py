"""``dagwerk validate`` (and every command loading a pipeline) reports every problem of a file."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dagwerk.cli import cli
from dagwerk.pipeline_file import MAX_REPORTED_PROBLEMS

BAD = """name: bad
nodes:
  - slug: a
    plugn: x
  - slug: b
    plugin: y
    input_mode: sometimes
"""


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_validate_prints_every_problem_on_its_own_line(tmp_path: Path) -> None:
    path = _write(tmp_path, BAD)
    result = CliRunner().invoke(cli, ["validate", path])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {path}:3: node 'a', field 'plugin': missing required field",
        f"error: {path}:4: node 'a', field 'plugn': unknown field",
        f"error: {path}:7: node 'b', field 'input_mode': "
        "Input should be 'each', 'all' or 'by_correlation'",
    ]


def test_validate_json_lists_the_problems(tmp_path: Path) -> None:
    path = _write(tmp_path, BAD)
    result = CliRunner().invoke(cli, ["validate", path, "--json"])
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["problem_count"] == 3
    assert [(p["line"], p["node"], p["field"]) for p in document["problems"]] == [
        (3, "a", "plugin"),
        (4, "a", "plugn"),
        (7, "b", "input_mode"),
    ]
    assert document["problems"][1]["reason"] == "unknown field"
    # The first problem keeps its place under "error".
    assert document["error"]["field"] == "plugin"


def test_run_json_lists_the_problems_in_its_json_error(tmp_path: Path) -> None:
    path = _write(tmp_path, BAD)
    db = f"sqlite:///{tmp_path / 'x.db'}"
    result = CliRunner().invoke(cli, ["run", path, "--db", db, "--json"])
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "pipeline_invalid"
    assert len(error["problems"]) == 3 and "plugn" in error["problems"][1]


def test_the_list_is_bounded_and_counts_the_rest(tmp_path: Path) -> None:
    extra = "".join(f"    extra_{n}: 1\n" for n in range(MAX_REPORTED_PROBLEMS + 10))
    path = _write(tmp_path, f"name: many\nnodes:\n  - slug: a\n    plugin: p\n{extra}")
    result = CliRunner().invoke(cli, ["validate", path])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == MAX_REPORTED_PROBLEMS + 1
    assert lines[-1] == (
        f"error: {path}: and 10 more problems (the first {MAX_REPORTED_PROBLEMS} shown)"
    )
