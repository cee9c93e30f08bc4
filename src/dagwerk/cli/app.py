"""The ``dagwerk`` command group and its error handling.

Errors reach the user as one line on stderr (``error: ...``), never as a
traceback unless ``--debug`` (or ``DAGWERK_DEBUG=1``) is given. Exit codes:
0 success, 1 a failure that is not the input's fault, 2 invalid input
(usage errors, invalid pipeline files, anything raised as ``ValueError``).
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import click

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INVALID",
    "CliError",
    "InvalidInputError",
    "cli",
    "cli_error",
    "describe_error",
    "main",
    "safe_line",
]

EXIT_FAILURE: Final = 1
EXIT_INVALID: Final = 2

_UNSAFE_TEXT: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def safe_line(text: str) -> str:
    """``text`` as one line with control and bidi characters shown as escapes."""
    return _UNSAFE_TEXT.sub(lambda match: match.group().encode("unicode_escape").decode(), text)


class CliError(click.ClickException):
    """An error shown as one ``error: ...`` line on stderr; exits 1."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(safe_line(message))

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class InvalidInputError(CliError):
    """Like :class:`CliError` for input the user must fix; exits 2."""

    exit_code = EXIT_INVALID


def cli_error(message: str, exit_code: int) -> CliError:
    """A :class:`CliError` (or :class:`InvalidInputError`) for ``exit_code``."""
    return InvalidInputError(message) if exit_code == EXIT_INVALID else CliError(message)


def describe_error(error: BaseException) -> tuple[str, int]:
    """The one-line message and exit code for an exception a command raised."""
    from dagwerk.errors import DagwerkError

    if isinstance(error, ValueError):
        return safe_line(str(error) or type(error).__name__), EXIT_INVALID
    if isinstance(error, DagwerkError):
        return safe_line(str(error)), EXIT_FAILURE
    if isinstance(error, OSError):
        return safe_line(f"{error.strerror or error}"), EXIT_FAILURE
    detail = safe_line(f"{type(error).__name__}: {error}")
    return f"internal error: {detail} (run with --debug for the traceback)", EXIT_FAILURE


class DagwerkGroup(click.Group):
    """A group that turns exceptions from its commands into :class:`CliError`."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError):
            # A closed pipe is not a command error: ``main`` silences it.
            raise
        except Exception as error:
            if ctx.params.get("debug"):
                raise
            message, code = describe_error(error)
            raise cli_error(message, code) from error


@click.group(cls=DagwerkGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--debug",
    is_flag=True,
    envvar="DAGWERK_DEBUG",
    help="Show full tracebacks instead of one-line errors (also DAGWERK_DEBUG=1).",
)
@click.version_option(package_name="dagwerk", prog_name="dagwerk")
def cli(debug: bool) -> None:
    """dagwerk: durable DAG workflows.

    Describe a pipeline in a YAML or JSON file, check it, draw it, run it.
    Plugin modules are found in the pipeline file's folder, the current
    directory and the installed packages.

    \b
    Examples:
      dagwerk validate examples/pipelines/etl.yaml
      dagwerk graph examples/pipelines/etl.yaml --format mermaid
      dagwerk schema > pipeline.schema.json
    """
    from dagwerk.engine import search_for_plugins_in

    # After the installed packages, as for a pipeline file's folder; the
    # same for `dagwerk` and `python -m dagwerk` (see __main__).
    search_for_plugins_in(Path.cwd())


def _show_warning(  # noqa: PLR0917 - the signature of warnings.showwarning
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    # A user of the command gets one line, not the source line in dagwerk.
    click.echo(f"warning: {safe_line(str(message))}", err=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``dagwerk`` command (``argv`` defaults to ``sys.argv[1:]``).

    Warnings are shown as one ``warning: ...`` line on stderr."""
    warnings.showwarning = _show_warning
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="dagwerk")
    except BrokenPipeError:
        # The reader went away (``dagwerk schema | head``); say nothing more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_FAILURE)
