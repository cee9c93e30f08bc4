"""Plugins of examples/pipelines/etl.yaml (listed there under ``plugins:``).

``@dagwerk.plugin`` registers each function in the default registry, so
importing this module is all a worker needs:
``dagwerk worker --pipeline examples/pipelines/etl.yaml``.
"""

from __future__ import annotations

from typing import Any

import dagwerk
from dagwerk import TaskContext, TaskInputs

# A small, fixed "source system" so that the example needs no network.
ORDERS: list[dict[str, Any]] = [
    {
        "id": "o-1",
        "date": "2024-02-03",
        "title": "  standing desk ",
        "status": "paid",
        "amount": 640,
    },
    {
        "id": "o-2",
        "date": "2024-03-11",
        "title": "monitor arm",
        "status": "cancelled",
        "amount": 90,
    },
    {"id": "o-3", "date": "2024-04-20", "title": "office chair", "status": "paid", "amount": 1250},
    {"id": "o-4", "date": "2024-05-02", "title": "desk lamp", "status": "paid", "amount": 45},
    {
        "id": "o-5",
        "date": "2024-06-15",
        "title": "conference table",
        "status": "paid",
        "amount": 3100,
    },
    {"id": "o-6", "date": "2024-07-01", "title": "refund voucher", "status": "paid", "amount": 0},
    {"id": "o-7", "date": "2023-12-30", "title": "old order", "status": "paid", "amount": 999},
]


@dagwerk.plugin("extract_orders")
def extract_orders(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, Any]]:
    """Every order placed on or after ``since`` (ISO dates compare as text)."""
    since = str(inputs.parameters["since"])
    return [dict(order) for order in ORDERS if order["date"] >= since]


@dagwerk.plugin("load_settings")
def load_settings(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    return {"separator": "; ", "currency_symbol": "€"}


@dagwerk.plugin("clean_order")
def clean_order(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    """One task per order that passed the edge filter (not cancelled, amount > 0)."""
    params = inputs.parameters
    return {
        "order_id": params["order_id"],
        "title": params["title"],
        "currency": params["currency"],
    }


@dagwerk.plugin("score_order")
def score_order(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    return {"amount": inputs.parameters["amount"], "large": bool(inputs.parameters["large"])}


@dagwerk.plugin("join_order")
def join_order(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    """One task per order present in both branches (BY_CORRELATION)."""
    cleaned = inputs.edges["cleaned"][0].fields
    scored = inputs.edges["scored"][0].fields
    return {
        "order_id": cleaned["order_id"],
        "label": inputs.parameters["label"],
        "amount": scored["amount"],
        "currency": cleaned["currency"],
        # The `review` binding only exists when `when: "{scored.large}"` held.
        "review": bool(inputs.parameters.get("review", False)),
    }


@dagwerk.plugin("pick_top")
def pick_top(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, Any]]:
    """The edge's selection already kept the three largest orders."""
    return [dict(order.fields) for order in inputs.edges["orders"]]


def _number(value: object) -> float:
    """A numeric field (fields hold any JSON value: check before using one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


@dagwerk.plugin("write_report")
def write_report(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    settings = inputs.edges["settings"]
    separator = str(settings[0].fields["separator"]) if settings else ", "
    rows = sorted(inputs.edges["top"], key=lambda out: -_number(out.fields["amount"]))
    lines = [
        f"{row.fields['label']} ({row.fields['amount']} {row.fields['currency']})" for row in rows
    ]
    flagged = sum(1 for row in rows if row.fields["review"])
    return {
        "heading": inputs.parameters["heading"],
        "text": separator.join(lines),
        "needs_review": flagged,
    }
