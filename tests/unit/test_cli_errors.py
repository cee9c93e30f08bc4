"""How the command group turns exceptions into exit codes and one-line errors."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from dagwerk.cli.app import DagwerkGroup


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
