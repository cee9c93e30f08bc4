"""What ``dagwerk show`` adds for composite runs: the child tree and budgets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from dagwerk.cli.app import safe_line
from dagwerk.cli.commands_common import render_table

if TYPE_CHECKING:
    from dagwerk.engine import Engine, RunTree

__all__ = ["describe_composite", "render_composite"]


def _tree_json(trees: tuple[RunTree, ...]) -> list[dict[str, Any]]:
    return [
        {
            "run_id": tree.run_id,
            "status": tree.status.value if tree.status is not None else None,
            "children": _tree_json(tree.children),
        }
        for tree in trees
    ]


def describe_composite(engine: Engine, run_id: str) -> dict[str, Any]:
    """The run's parent link, its tree of child runs (``None`` on a store
    without child runs) and its budget usage."""
    from dagwerk.engine import UnsupportedOperationError

    described: dict[str, Any] = {"parent": None, "children": None, "budgets": []}
    try:
        lineage = engine.lineage(run_id)
    except UnsupportedOperationError:
        lineage = None
    if lineage is not None:
        link = lineage.link
        if link is not None:
            described["parent"] = {
                "run_id": link.parent_run_id,
                "task_id": link.parent_task_id,
                "root_run_id": link.root_run_id,
            }
        described["children"] = _tree_json(lineage.children)
    described["budgets"] = [usage.to_json() for usage in engine.budget_usage(run_id)]
    return described


def _lines(nodes: list[dict[str, Any]], depth: int) -> list[str]:
    lines: list[str] = []
    for node in nodes:
        lines.append(f"{'  ' * depth}- {node['run_id']}: {node['status']}")
        lines.extend(_lines(node["children"], depth + 1))
    return lines


def render_composite(described: dict[str, Any]) -> None:
    """Print the parent, the child tree and the budget table (when present)."""
    parent = described.get("parent")
    if parent:
        click.echo(
            safe_line(
                f"child of run {parent['run_id']} (task {parent['task_id']}), "
                f"root {parent['root_run_id']}"
            )
        )
    children = described.get("children")
    if children:
        click.echo("child runs:")
        for line in _lines(children, 1):
            click.echo(safe_line(line))
    budgets = described.get("budgets")
    if budgets:
        render_table(
            "budgets",
            ("account", "input bytes", "output bytes", "cost charged", "cost reserved"),
            [
                (
                    b["account"],
                    f"{b['used_input_bytes']}/{_limit(b['max_input_bytes'])}",
                    f"{b['used_output_bytes']}/{_limit(b['max_output_bytes'])}",
                    f"{b['charged_cost']:g}/{_limit(b['max_cost'])}",
                    f"{b['reserved_cost']:g}",
                )
                for b in budgets
            ],
        )


def _limit(value: object) -> str:
    return "unlimited" if value is None else str(value)
