"""How the command group turns exceptions into exit codes and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dagwerk.cli.app import DagwerkGroup
from dagwerk.engine import Engine


def _group_raising(error: BaseException) -> click.Group:
    @click.group(cls=DagwerkGroup)
    @click.option("--debug", is_flag=True)
    def group(debug: bool) -> None:
        pass

    @group.command()
    def boom() -> None:
        raise error

    return group


def test_a_closed_pipe_is_passed_through_for_main_to_silence() -> None:
    # ``dagwerk show RUN | head``: the group must not turn EPIPE into "error: Broken pipe".
    with pytest.raises(BrokenPipeError):
        _group_raising(BrokenPipeError()).main(["boom"], standalone_mode=False)


def test_an_ordinary_error_becomes_one_line_without_a_traceback() -> None:
    result = CliRunner().invoke(_group_raising(ValueError("bad input")), ["boom"])
    assert result.exit_code == 2
    assert "bad input" in result.output
    assert "Traceback" not in result.output


def test_with_json_an_error_is_a_json_object_on_stdout(tmp_path: Path) -> None:
    from dagwerk.cli import cli

    url = f"sqlite:///{tmp_path / 'errors.db'}"
    with Engine(url):
        pass
    missing = CliRunner().invoke(cli, ["show", "run-nosuchrun", "--db", url, "--json"])
    assert missing.exit_code == 1
    assert missing.stderr == ""
    assert json.loads(missing.stdout) == {
        "error": {
            "message": "run 'run-nosuchrun' does not exist",
            "code": "run_not_found",
            "exit_code": 1,
        }
    }
    # An invalid option value is reported as JSON too (exit 2), whatever the order.
    bad = CliRunner().invoke(cli, ["runs", "--limit", "0", "--json", "--db", url])
    assert bad.exit_code == 2
    document = json.loads(bad.stdout)["error"]
    assert document["code"] == "usage_error" and "--limit" in document["message"]
    assert document["exit_code"] == 2
