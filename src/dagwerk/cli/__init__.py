"""The ``dagwerk`` command line (click).

:mod:`dagwerk.cli.app` holds the group and the error handling; each
``commands_*`` module holds a family of commands and is added here, so new
families (running, workers, inspection) are new modules, not edits to old ones.
"""

from __future__ import annotations

from dagwerk.cli.app import cli, main
from dagwerk.cli.commands_control import cancel, dlq, rerun, resume, retry
from dagwerk.cli.commands_gated import serve
from dagwerk.cli.commands_inspect import outputs, runs, show
from dagwerk.cli.commands_logs import logs
from dagwerk.cli.commands_retention import gc
from dagwerk.cli.commands_run import run, submit, worker
from dagwerk.cli.commands_schedule import backfill, schedule
from dagwerk.cli.commands_static import graph, schema, validate

for _command in (
    validate,
    graph,
    schema,
    run,
    submit,
    worker,
    runs,
    show,
    outputs,
    logs,
    cancel,
    retry,
    rerun,
    resume,
    dlq,
    serve,
    gc,
    schedule,
    backfill,
):
    cli.add_command(_command)

__all__ = ["cli", "main"]
