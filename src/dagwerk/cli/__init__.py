"""The ``dagwerk`` command line (click).

:mod:`dagwerk.cli.app` holds the group and the error handling; each
``commands_*`` module holds a family of commands and is added here, so new
families (running, workers, inspection) are new modules, not edits to old ones.
"""

from __future__ import annotations

from dagwerk.cli.app import cli, main
from dagwerk.cli.commands_static import graph, schema, validate

for _command in (validate, graph, schema):
    cli.add_command(_command)

__all__ = ["cli", "main"]
