"""Commands about stored runs refuse a SQLite file that does not exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dagwerk.cli import cli

COMMANDS = [
    ["runs"],
    ["runs", "--stalled"],
    ["show", "run-1"],
    ["show", "run-1", "--why"],
    ["outputs", "run-1"],
    ["dlq", "list"],
    ["dlq", "reinject", "dead-1"],
    ["cancel", "run-1"],
    ["retry", "run-1"],
    ["rerun", "run-1", "--node", "a"],
    ["resume", "task-1", "approval"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_missing_sqlite_file_is_refused_and_not_created(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, [*command, "--db", "sqlite:///mnie.db"])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr == (
        "error: no database at mnie.db (--db sqlite:///mnie.db): nothing is stored there; "
        "check --db or DAGWERK_DB\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_refusal_is_json_with_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["runs", "--json"], env={"DAGWERK_DB": "sqlite:///typo.db"})
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "invalid_input" and "no database at typo.db" in error["message"]
    assert list(tmp_path.iterdir()) == []


def test_an_existing_database_with_no_runs_lists_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dagwerk.engine import Engine

    monkeypatch.chdir(tmp_path)
    with Engine("sqlite:///dagwerk.db"):
        pass
    result = CliRunner().invoke(cli, ["runs"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "runs:\n  (none)\n"
