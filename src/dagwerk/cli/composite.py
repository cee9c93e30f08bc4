"""What ``dagwerk show`` adds for composite runs: the child tree and budgets."""

from __future__ import annotations

from typing import Any

import click

from dagwerk.cli.app import safe_line
from dagwerk.cli.commands_common import render_table
from dagwerk.store import DagBudgetStore, DagChildStore

__all__ = ["MAX_TREE_RUNS", "describe_composite", "render_composite"]

MAX_TREE_RUNS = 1_000
"""``show`` lists at most this many runs of a tree."""


def _tree(store: Any, run_id: str, seen: set[str]) -> dict[str, Any]:
    record = store.get_run(run_id)
    node: dict[str, Any] = {
        "run_id": run_id,
        "status": record.status.value if record is not None else None,
        "children": [],
    }
    seen.add(run_id)
    for child_id in store.list_child_runs(run_id):
        if child_id in seen or len(seen) >= MAX_TREE_RUNS:
            continue
        node["children"].append(_tree(store, child_id, seen))
    return node


def describe_composite(store: object, run_id: str) -> dict[str, Any]:
    """The run's parent link, its tree of child runs and its budget usage."""
    described: dict[str, Any] = {"parent": None, "children": None, "budgets": []}
    if isinstance(store, DagChildStore):
        link = store.get_run_link(run_id)
        if link is not None:
            described["parent"] = {
                "run_id": link.parent_run_id,
                "task_id": link.parent_task_id,
                "root_run_id": link.root_run_id,
            }
        described["children"] = _tree(store, run_id, set())["children"]
    if isinstance(store, DagBudgetStore):
        described["budgets"] = [usage.to_json() for usage in store.get_run_budget(run_id)]
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
