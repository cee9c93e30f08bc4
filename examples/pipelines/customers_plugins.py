"""Plugins of examples/pipelines/customers.yaml: per-customer grouping with
correlation IDs (docs/correlation.md)."""

from __future__ import annotations

import csv
import io
from typing import Any

import dagwerk
from dagwerk import EmittedOutput, TaskContext, TaskInputs

# A small CSV "export" so that the example needs no files.
ORDERS_CSV = """order_id,customer,amount
o-1,acme,120
o-2,globex,80
o-3,acme,45
o-4,initech,1300
o-5,globex,20
o-6,acme,1010
"""
TIERS = {"acme": "gold", "globex": "silver", "initech": "bronze"}


@dagwerk.plugin("group_by_customer")
def group_by_customer(inputs: TaskInputs, ctx: TaskContext) -> list[EmittedOutput]:
    """One output per customer. A root's outputs each start a correlation
    group, and the group's ID is the output's ID: ``customer:acme``."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for row in csv.DictReader(io.StringIO(ORDERS_CSV)):
        rows.setdefault(row["customer"], []).append(
            {"order_id": row["order_id"], "amount": int(row["amount"])}
        )
    return [
        EmittedOutput(id=f"customer:{name}", fields={"customer": name}, data={"orders": orders})
        for name, orders in sorted(rows.items())
    ]


@dagwerk.plugin("split_orders")
def split_orders(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, Any]]:
    """One output per order; each keeps this task's group (its customer)."""
    (customer,) = inputs.edges["customer"]
    orders = customer.data["orders"]
    assert isinstance(orders, list)
    return [{**order, "customer": customer.fields["customer"]} for order in orders]


@dagwerk.plugin("score_order")
def score_order(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    amount = inputs.parameters["amount"]
    assert isinstance(amount, int)
    (order,) = inputs.edges["order"]
    return {"order_id": order.fields["order_id"], "amount": amount, "large": amount >= 1000}


@dagwerk.plugin("load_profile")
def load_profile(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    customer = str(inputs.parameters["customer"])
    return {"customer": customer, "tier": TIERS.get(customer, "none")}


@dagwerk.plugin("summarise_customer")
def summarise_customer(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    """One task per customer: every scored order of that customer, and its profile."""
    (profile,) = inputs.edges["profile"]
    scored = inputs.edges["scored"]
    amounts = [order.fields["amount"] for order in scored]
    return {
        "customer": profile.fields["customer"],
        "tier": profile.fields["tier"],
        "orders": len(scored),
        "total": sum(a for a in amounts if isinstance(a, int)),
        "large_orders": sum(1 for order in scored if order.fields["large"] is True),
    }


@dagwerk.plugin("write_report")
def write_report(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    summaries = sorted(inputs.edges["summaries"], key=lambda s: str(s.fields["customer"]))
    lines = [
        f"{s.fields['customer']} ({s.fields['tier']}): {s.fields['orders']} orders, "
        f"{s.fields['total']} in all, {s.fields['large_orders']} large"
        for s in summaries
    ]
    return {"text": "\n".join(lines)}
