"""The ``dagwerk`` command group and its error handling.

Errors reach the user as one line on stderr (``error: ...``; an invalid
pipeline file gets one such line per problem), never as a traceback unless
``--debug`` (or ``DAGWERK_DEBUG=1``) is given. A command given ``--json``
prints its error as a JSON object on stdout instead
(``{"error": {"message": ..., "code": ..., "exit_code": ...}}``). Exit codes:
0 success, 1 a failure that is not the input's fault, 2 invalid input
(usage errors, invalid pipeline files, anything raised as ``ValueError``)
and fatal store faults (a database that cannot be opened, is damaged or has
a schema newer than this dagwerk). A store fault is one line saying what
failed, where, and what to do (:func:`dagwerk.runtime.faults.describe_fault`).
``--debug`` is accepted after the command name too (``dagwerk worker --debug``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import click

__all__ = [
    "DEBUG",
    "EXIT_FAILURE",
    "EXIT_INVALID",
    "JSON_OUTPUT",
    "CliError",
    "InvalidInputError",
    "cli",
    "cli_error",
    "describe_error",
    "error_code",
    "main",
    "problem_lines",
    "safe_line",
]

EXIT_FAILURE: Final = 1
EXIT_INVALID: Final = 2

DEBUG: Final = "dagwerk.debug"
"""The ``click.Context.meta`` key a command's own ``--debug`` sets."""

JSON_OUTPUT: Final = "dagwerk.json_output"
"""The ``click.Context.meta`` key a command's ``--json`` sets: errors are JSON then."""

_UNSAFE_TEXT: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def safe_line(text: str) -> str:
    """``text`` as one line with control and bidi characters shown as escapes."""
    return _UNSAFE_TEXT.sub(lambda match: match.group().encode("unicode_escape").decode(), text)


class CliError(click.ClickException):
    """An error shown as one ``error: ...`` line on stderr; exits 1.

    With ``as_json`` it is a JSON object on stdout instead; ``code`` is the
    stable error code it carries there.
    """

    exit_code = EXIT_FAILURE

    def __init__(
        self,
        message: str,
        *,
        code: str = "command_failed",
        as_json: bool = False,
        more: Sequence[str] = (),
    ) -> None:
        super().__init__(safe_line(message))
        self.code = code
        self.as_json = as_json
        self.more = tuple(safe_line(line) for line in more)
        """Further problems, each shown as its own ``error: ...`` line."""

    def show(self, file: Any = None) -> None:
        if self.as_json:
            error: dict[str, Any] = {"message": self.format_message(), "code": self.code}
            if self.more:
                error["problems"] = [self.format_message(), *self.more]
            click.echo(json.dumps({"error": {**error, "exit_code": self.exit_code}}))
            return
        for line in (self.format_message(), *self.more):
            click.echo(f"error: {line}", err=True)


class InvalidInputError(CliError):
    """Like :class:`CliError` for input the user must fix; exits 2."""

    exit_code = EXIT_INVALID

    def __init__(
        self,
        message: str,
        *,
        code: str = "invalid_input",
        as_json: bool = False,
        more: Sequence[str] = (),
    ) -> None:
        super().__init__(message, code=code, as_json=as_json, more=more)


def cli_error(
    message: str,
    exit_code: int,
    *,
    code: str = "command_failed",
    as_json: bool = False,
    more: Sequence[str] = (),
) -> CliError:
    """A :class:`CliError` (or :class:`InvalidInputError`) for ``exit_code``."""
    if exit_code == EXIT_INVALID:
        return InvalidInputError(message, code=code, as_json=as_json, more=more)
    return CliError(message, code=code, as_json=as_json, more=more)


def problem_lines(error: BaseException) -> list[str]:
    """Each problem of an invalid pipeline file as one line (others: ``[]``).

    Bounded by :data:`~dagwerk.pipeline_file.MAX_REPORTED_PROBLEMS`; a last
    line counts the problems left out."""
    from dagwerk.pipeline_file import PipelineFileError

    if not isinstance(error, PipelineFileError) or len(error.problems) < 2:
        return []
    lines = [safe_line(str(problem)) for problem in error.problems]
    left_out = error.problem_count - len(error.problems)
    if left_out > 0:
        lines.append(f"{error.path}: and {left_out} more problems (the first {len(lines)} shown)")
    return lines


def error_code(error: BaseException) -> str:
    """The stable code of an exception a command raised (``--json`` errors)."""
    from dagwerk.errors import DagwerkError

    if isinstance(error, CliError):
        return error.code
    if isinstance(error, DagwerkError):
        return str(error.code)
    if isinstance(error, click.UsageError):
        return "usage_error"
    if isinstance(error, ValueError):
        return "invalid_input"
    if isinstance(error, OSError):
        return "os_error"
    return "internal_error"


def describe_error(error: BaseException) -> tuple[str, int]:
    """The one-line message and exit code for an exception a command raised."""
    from dagwerk.backends.errors import StoreUnavailableError
    from dagwerk.errors import DagwerkError
    from dagwerk.runtime.faults import FaultKind, classify, describe_fault

    if isinstance(error, StoreUnavailableError):
        fatal = classify(error) is FaultKind.FATAL
        return safe_line(describe_fault(error)), EXIT_INVALID if fatal else EXIT_FAILURE
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
        except (click.exceptions.Exit, click.Abort, BrokenPipeError):
            # A closed pipe is not a command error: ``main`` silences it.
            raise
        except CliError as error:
            if ctx.meta.get(JSON_OUTPUT) and not error.as_json:
                raise cli_error(
                    error.format_message(), error.exit_code, code=error.code, as_json=True
                ) from error
            raise
        except click.ClickException as error:
            if ctx.meta.get(JSON_OUTPUT):
                raise cli_error(
                    error.format_message(), error.exit_code, code=error_code(error), as_json=True
                ) from error
            raise
        except Exception as error:
            if ctx.params.get("debug") or ctx.meta.get(DEBUG):
                raise
            message, exit_code = describe_error(error)
            problems = problem_lines(error)
            raise cli_error(
                problems[0] if problems else message,
                exit_code,
                code=error_code(error),
                as_json=bool(ctx.meta.get(JSON_OUTPUT)),
                more=problems[1:],
            ) from error


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
