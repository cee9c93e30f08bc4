"""Commands that need no database: ``validate``, ``graph`` and ``schema``.

They read pipeline files and print text (``validate`` also imports the
plugin modules a pipeline lists); nothing here starts a run. Heavy
imports happen inside the commands so that ``dagwerk --help`` stays quick.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dagwerk.cli.app import EXIT_INVALID, safe_line
from dagwerk.cli.commands_common import (
    load_pipeline_plugins,
    no_plugin_check_option,
    plugins_option,
)

if TYPE_CHECKING:
    from dagwerk.pipeline_file import Pipeline, PipelineFileError

__all__ = ["graph", "schema", "validate"]

_PIPELINE = click.Path(dir_okay=False, path_type=str)


def _write(text: str, output: str | None) -> None:
    if output is None or output == "-":
        click.echo(text, nl=False)
        return
    Path(output).write_text(text, encoding="utf-8")


def _summary(pipeline: Pipeline) -> dict[str, Any]:
    from dagwerk.json import thaw_json

    return {
        "valid": True,
        "file": pipeline.source,
        "name": pipeline.name,
        "description": pipeline.description,
        "nodes": [node.slug for node in pipeline.nodes],
        "node_count": len(pipeline.nodes),
        "edge_count": pipeline.edge_count,
        "roots": list(pipeline.root_slugs),
        "plugins": list(pipeline.plugins),
        "failure_policy": pipeline.failure_policy.value,
        "defaults": thaw_json(pipeline.defaults),
    }


def _problem(error: PipelineFileError) -> dict[str, Any]:
    return {
        "code": error.code,
        "rule": error.rule,
        "message": str(error),
        "reason": error.reason,
        "line": error.line,
        "node": error.node,
        "field": error.field,
    }


def _error_document(error: PipelineFileError) -> dict[str, Any]:
    # "error" is the first problem; "problems" lists each (bounded), with
    # "problem_count" counting them all.
    return {
        "valid": False,
        "file": error.path,
        "error": _problem(error),
        "problems": [_problem(problem) for problem in error.problems],
        "problem_count": error.problem_count,
    }


@click.command()
@click.argument("pipeline_file", metavar="PIPELINE", type=_PIPELINE)
@plugins_option
@no_plugin_check_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as a JSON object.")
@click.pass_context
def validate(
    ctx: click.Context,
    pipeline_file: str,
    plugin_modules: tuple[str, ...],
    plugin_check: bool,
    as_json: bool,
) -> None:
    """Check a pipeline file and print a one-line summary.

    Exits 0 when PIPELINE is valid and 2 when it is not; the error names
    the file, the line, the node and the field at fault. The modules under
    'plugins:' (and --plugins) are imported and every node's plugin name
    checked, as `run` and `submit` do. With --json the result (valid or not)
    is a JSON object on stdout.

    \b
    Examples:
      dagwerk validate examples/pipelines/etl.yaml
      dagwerk validate pipeline.json --json
    """
    from dagwerk.engine import EngineRegistry
    from dagwerk.pipeline_file import PipelineFileError, load_pipeline

    try:
        pipeline = load_pipeline(pipeline_file)
        if plugin_check:
            load_pipeline_plugins(pipeline, EngineRegistry(), plugin_modules)
    except PipelineFileError as error:
        if not as_json:
            raise
        click.echo(json.dumps(_error_document(error), ensure_ascii=False))
        ctx.exit(EXIT_INVALID)
    if as_json:
        click.echo(json.dumps(_summary(pipeline), ensure_ascii=False))
        return
    from rich.console import Console
    from rich.text import Text

    roots = ", ".join(pipeline.root_slugs)
    line = Text.assemble(
        ("valid", "bold green"),
        safe_line(
            f" {pipeline.source}: pipeline '{pipeline.name}' has {len(pipeline.nodes)} nodes, "
            f"{pipeline.edge_count} edges, roots: {roots}"
        ),
    )
    # soft_wrap keeps the summary on one line however narrow the terminal.
    Console(highlight=False, soft_wrap=True).print(line)


@click.command()
@click.argument("pipeline_file", metavar="PIPELINE", type=_PIPELINE)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["mermaid", "dot"]),
    default="mermaid",
    show_default=True,
    help="Mermaid flowchart or Graphviz DOT.",
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Write to this file, not stdout."
)
def graph(pipeline_file: str, output_format: str, output: str | None) -> None:
    """Draw the DAG of a pipeline file.

    Each node shows its slug, plugin and input mode; each arrow is an input
    edge labelled with its name. Side edges are dashed; optional, filtered
    and selecting edges say so in their label.

    \b
    Examples:
      dagwerk graph examples/pipelines/etl.yaml --format mermaid
      dagwerk graph examples/pipelines/etl.yaml --format dot | dot -Tsvg > etl.svg
    """
    from dagwerk.graph_export import to_dot, to_mermaid
    from dagwerk.pipeline_file import load_pipeline

    pipeline = load_pipeline(pipeline_file)
    if output_format == "dot":
        text = to_dot(pipeline.nodes, title=pipeline.name)
    else:
        text = to_mermaid(pipeline.nodes)
    _write(text, output)


@click.command()
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Write to this file, not stdout."
)
def schema(output: str | None) -> None:
    """Print the JSON Schema of pipeline files.

    Editors use it to check and complete pipeline files as you type.

    \b
    Examples:
      dagwerk schema > pipeline.schema.json
      dagwerk schema --output pipeline.schema.json
    """
    from dagwerk.pipeline_file import pipeline_json_schema

    _write(json.dumps(pipeline_json_schema(), indent=2, ensure_ascii=False) + "\n", output)
