"""Shared pieces of the runtime commands: options, JSON input, tables, exit codes.

Holds no commands itself. Heavy imports (the engine, rich) happen inside
functions so that ``dagwerk --help`` stays quick.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from dagwerk.cli.app import DEBUG, EXIT_FAILURE, JSON_OUTPUT, InvalidInputError, safe_line

if TYPE_CHECKING:
    from dagwerk.constants import RunStatus
    from dagwerk.engine import Engine, EngineRegistry
    from dagwerk.models import DagNode
    from dagwerk.pipeline_file import Pipeline, PipelineFileError

__all__ = [
    "DEFAULT_DB",
    "OPEN_TIMEOUT",
    "db_option",
    "debug_option",
    "debugging",
    "echo_json",
    "exit_code_for",
    "format_time",
    "is_terminal",
    "json_option",
    "json_text",
    "last_nodes",
    "load_pipeline_plugins",
    "log_level_option",
    "no_plugin_check_option",
    "open_engine",
    "parse_json_argument",
    "pipeline_plugin_errors",
    "plugins_option",
    "read_run_input",
    "render_table",
    "task_logging",
]

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_DB = "sqlite:///dagwerk.db"
"""The ``--db`` of every command unless ``--db`` or ``DAGWERK_DB`` says otherwise."""

DB_HELP = "Database URL: sqlite:///path.db (default ./dagwerk.db), memory:// or postgresql://..."


_SCHEMA_KEY = "dagwerk.schema"


def _remember_schema(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    ctx.meta[_SCHEMA_KEY] = value


def db_option(fn: F) -> F:
    """``--db URL`` (also ``DAGWERK_DB``), default ``sqlite:///dagwerk.db``,
    and ``--schema NAME`` (also ``DAGWERK_SCHEMA``), which
    :func:`open_engine` reads."""
    option = click.option(
        "--db",
        "db",
        envvar="DAGWERK_DB",
        default=DEFAULT_DB,
        show_default=True,
        metavar="URL",
        help=DB_HELP + " Also DAGWERK_DB.",
    )
    schema = click.option(
        "--schema",
        envvar="DAGWERK_SCHEMA",
        metavar="NAME",
        expose_value=False,
        callback=_remember_schema,
        help="PostgreSQL schema of dagwerk's tables, created if missing (same as "
        "?schema=NAME in the URL). Also DAGWERK_SCHEMA.",
    )
    return option(schema(fn))


def plugins_option(fn: F) -> F:
    """``--plugins MODULE`` (repeatable), as the ``plugin_modules`` parameter."""
    return click.option(
        "--plugins",
        "plugin_modules",
        multiple=True,
        metavar="MODULE",
        help="Import this plugin module (dotted name or .py file) first; repeatable.",
    )(fn)


def no_plugin_check_option(fn: F) -> F:
    """``--no-plugin-check``, as the ``plugin_check`` parameter (default True)."""
    return click.option(
        "--no-plugin-check",
        "plugin_check",
        is_flag=True,
        flag_value=False,
        default=True,
        help="Do not import the plugin modules or check the nodes' plugin names "
        "(for a machine without the plugins' code).",
    )(fn)


def pipeline_plugin_errors(pipeline: Pipeline, registry: EngineRegistry) -> list[PipelineFileError]:
    """One error, located in the pipeline file, per node whose plugin
    ``registry`` cannot resolve (plugin modules already imported)."""
    from dagwerk.engine import plugin_problems

    return [
        pipeline.error_at(("nodes", problem.index, "plugin"), problem.reason, rule="unknown_plugin")
        for problem in plugin_problems(pipeline.nodes, registry)
    ]


def load_pipeline_plugins(
    pipeline: Pipeline, registry: EngineRegistry, extra_modules: Sequence[str] = ()
) -> None:
    """Import the modules the pipeline's ``plugins:`` lists (searched in its
    folder) and ``extra_modules`` (``--plugins``), then check every node's
    plugin. The first module that cannot be imported, or node whose plugin
    does not resolve, raises its
    :class:`~dagwerk.pipeline_file.PipelineFileError` (exit 2)."""
    from dagwerk.engine import PluginImportError, import_plugin_modules, search_for_plugins_in

    base_dir = Path(pipeline.source).parent
    search_for_plugins_in(base_dir)
    for index, module in enumerate(pipeline.plugins):
        try:
            import_plugin_modules([module], base_dir=base_dir)
        except PluginImportError as error:
            raise pipeline.error_at(
                ("plugins", index), str(error), rule="plugin_import_failed"
            ) from error
    import_plugin_modules(extra_modules)
    errors = pipeline_plugin_errors(pipeline, registry)
    if errors:
        raise errors[0]


def _note_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[JSON_OUTPUT] = True
    return value


def _note_debug(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[DEBUG] = True
    return value


def debug_option(fn: F) -> F:
    """``--debug`` after the command name: as ``dagwerk --debug COMMAND``."""
    return click.option(
        "--debug",
        "debug",
        is_flag=True,
        is_eager=True,
        expose_value=False,
        callback=_note_debug,
        help="Show full tracebacks (errors and store faults) instead of one line.",
    )(fn)


def debugging() -> bool:
    """Whether ``--debug`` was given, before or after the command name."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    return bool(ctx.meta.get(DEBUG) or ctx.find_root().params.get("debug"))


def json_option(fn: F) -> F:
    """``--json``: machine-readable output on stdout, errors included.

    The flag is processed before the other parameters, so an invalid value of
    another option is reported as JSON too."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        is_eager=True,
        callback=_note_json,
        help="Print JSON for scripts (errors too).",
    )(fn)


OPEN_TIMEOUT = 1.0
"""Seconds one attempt of a waiting :func:`open_engine` tries to reach a
PostgreSQL server."""


def open_engine(
    db: str,
    *,
    create: bool = True,
    wait_out_faults: bool = False,
    fail_on_fault: float | None = None,
    stop: threading.Event | None = None,
) -> Engine:
    """An engine on ``db`` (in the ``--schema`` of the current command, if
    given); a bad URL is invalid input (exit 2).

    ``create=False`` is for commands about runs already stored: a SQLite file
    that does not exist is invalid input naming the path, not a new empty
    database (a typo in ``--db`` must not answer "no runs").

    ``wait_out_faults``: a transient store fault of the opening (a server
    that does not answer, a read-only directory) is waited out as a worker
    waits out a fault, for at most ``fail_on_fault`` seconds when given, and
    until ``stop`` is set (then the fault is raised). A PostgreSQL server that
    does not answer is then tried for :data:`OPEN_TIMEOUT` per attempt, so the
    gate says so at once rather than after the store's reconnect timeout."""
    from dagwerk.engine import Engine, is_postgres_url

    ctx = click.get_current_context(silent=True)
    schema = ctx.meta.get(_SCHEMA_KEY) if ctx is not None else None
    if schema is not None and not is_postgres_url(db):
        raise InvalidInputError("--schema applies to postgresql:// databases only")
    if not create and db.startswith("sqlite:"):
        from dagwerk.backends.sqlite import sqlite_path

        path, _ = sqlite_path(db)
        in_memory = path == ":memory:" or path.startswith("file::memory:")
        if not in_memory and not Path(path).exists():
            raise InvalidInputError(
                f"no database at {path} (--db {db}): nothing is stored there; "
                "check --db or DAGWERK_DB"
            )

    options: dict[str, Any] = {} if schema is None else {"schema": schema}
    if not wait_out_faults:
        return Engine(db, **options)
    from dagwerk.runtime.faults import FaultGate

    if is_postgres_url(db):
        options["open_timeout"] = OPEN_TIMEOUT
    return FaultGate().wait_out(
        lambda: Engine(db, **options), "opening the database", limit=fail_on_fault, stop=stop
    )


def parse_json_argument(text: str, what: str) -> object:
    """``text`` parsed as JSON; invalid or too deeply nested JSON is invalid
    input (exit 2)."""
    from dagwerk.errors import JsonLimitError
    from dagwerk.json import parse_json_text

    try:
        return parse_json_text(text, field=what)
    except JsonLimitError as error:
        raise InvalidInputError(str(error), code=error.code) from None
    except json.JSONDecodeError as error:
        raise InvalidInputError(f"{what} is not valid JSON: {error}") from None


def read_run_input(input_text: str | None, input_file: str | None) -> dict[str, object] | None:
    """The run input from ``--input JSON`` or ``--input-file F`` (a JSON object)."""
    if input_text is not None and input_file is not None:
        raise InvalidInputError("give --input or --input-file, not both")
    if input_file is not None:
        try:
            input_text = Path(input_file).read_text(encoding="utf-8")
        except OSError as error:
            raise InvalidInputError(f"cannot read {input_file}: {error.strerror}") from None
    if input_text is None:
        return None
    value = parse_json_argument(input_text, "--input-file" if input_file else "--input")
    if not isinstance(value, dict):
        raise InvalidInputError("run input must be a JSON object")
    return value


def exit_code_for(status: RunStatus) -> int:
    """0 for COMPLETED, 1 for any other status."""
    from dagwerk.constants import RunStatus

    return 0 if status is RunStatus.COMPLETED else EXIT_FAILURE


def json_text(value: object) -> str:
    """``value`` as one line of JSON: mappings are objects, tuples are arrays.

    Only JSON values are accepted: anything else is an error, never its
    ``repr`` in the output."""
    from dagwerk.json import thaw_json

    return json.dumps(thaw_json(value), ensure_ascii=False, allow_nan=False)


def echo_json(value: object) -> None:
    """Print ``value`` as one line of JSON on stdout (see :func:`json_text`)."""
    click.echo(json_text(value))


def last_nodes(nodes: Sequence[DagNode]) -> list[str]:
    """Slugs of the nodes no other node reads (a run's results), in order."""
    sources = {edge.source for node in nodes for edge in node.edges}
    return [node.slug for node in nodes if node.slug not in sources]


def is_terminal() -> bool:
    """Whether stdout is an interactive terminal (rich output) or a pipe/file (plain)."""
    return sys.stdout.isatty()


def format_time(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def render_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A rich table on a terminal; aligned plain columns (one row per line) otherwise."""
    cells = [[safe_line("-" if value is None else str(value)) for value in row] for row in rows]
    if is_terminal():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, title_justify="left")
        for header in headers:
            table.add_column(header, overflow="fold")
        for row in cells:
            table.add_row(*row)
        Console(highlight=False).print(table)
        return
    click.echo(f"{title}:")
    if not cells:
        click.echo("  (none)")
        return
    widths = [max(len(header), *(len(row[i]) for row in cells)) for i, header in enumerate(headers)]
    click.echo("  " + "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


LOG_LEVELS = ("debug", "info", "warning", "error", "off")


def log_level_option(fn: F) -> F:
    """``--log-level LEVEL`` (also ``DAGWERK_LOG_LEVEL``), default ``info``."""
    return click.option(
        "--log-level",
        "log_level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default="info",
        show_default=True,
        envvar="DAGWERK_LOG_LEVEL",
        help=(
            "Print plugins' ctx.logger messages from this level on stderr "
            "(dagwerk's own from warning, or debug with debug)."
        ),
    )(fn)


class _EchoHandler(logging.Handler):
    """Writes records to the stderr of the moment (a live display may wrap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(safe_line(self.format(record)), err=True)
        except Exception:
            self.handleError(record)


@contextmanager
def task_logging(level_name: str) -> Iterator[None]:
    """Show task loggers (``dagwerk.task.*``, a plugin's ``ctx.logger``) from
    ``level_name`` and dagwerk's own loggers from WARNING (DEBUG with
    ``debug``) on stderr while the block runs; ``off`` shows none. With
    ``--debug`` a store fault's line carries its traceback."""
    dagwerk_logger = logging.getLogger("dagwerk")
    task_logger = logging.getLogger("dagwerk.task")
    faults_logger = logging.getLogger("dagwerk.runtime.faults")
    saved = (dagwerk_logger.level, task_logger.level, dagwerk_logger.propagate)
    saved_faults = faults_logger.level
    if debugging():
        faults_logger.setLevel(logging.DEBUG)
    handler: logging.Handler = _EchoHandler()
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    )
    if level_name.lower() == "off":
        handler = logging.NullHandler()
        task_level = own_level = logging.CRITICAL + 1
    else:
        task_level = logging.getLevelNamesMapping()[level_name.upper()]
        own_level = logging.DEBUG if task_level == logging.DEBUG else logging.WARNING
    dagwerk_logger.setLevel(own_level)
    task_logger.setLevel(task_level)
    dagwerk_logger.addHandler(handler)
    # The handler prints dagwerk's records once; an application's root
    # handler does not print them again.
    dagwerk_logger.propagate = False
    try:
        yield
    finally:
        dagwerk_logger.removeHandler(handler)
        faults_logger.setLevel(saved_faults)
        dagwerk_logger.setLevel(saved[0])
        task_logger.setLevel(saved[1])
        dagwerk_logger.propagate = saved[2]
