"""Plugins for the PostgreSQL worker-process tests (loaded with ``--plugins``).

Every attempt of ``spread`` and ``fanin`` appends itself to a ledger: it
creates ``<task>.<attempt>`` in ``$DAGWERK_LEDGER`` exclusively, so an
attempt that ran twice leaves a ``dup-`` file beside it. ``spread`` takes
``$DAGWERK_WORK_SECONDS`` (default 0.02) so that work overlaps between
workers; ``hold`` blocks until ``$DAGWERK_LEDGER/release`` exists.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import dagwerk
from dagwerk import TaskContext, TaskInputs


def _ledger(ctx: TaskContext, kind: str) -> Path:
    folder = Path(os.environ["DAGWERK_LEDGER"])
    name = f"{ctx.task_id.replace(':', '_')}.{ctx.attempt}"
    try:
        with open(folder / name, "x") as entry:
            entry.write(f"{kind} {os.getpid()} {time.time()}\n")
    except FileExistsError:
        (folder / f"dup-{name}-{os.getpid()}-{time.time_ns()}").write_text(kind)
    return folder


@dagwerk.plugin("mw_gen")
def mw_gen(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, Any]]:
    _ledger(ctx, "gen")
    return [{"n": n} for n in range(int(str(inputs.parameters["count"])))]


@dagwerk.plugin("mw_spread")
def mw_spread(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    _ledger(ctx, "spread")
    ctx.cancelled.wait(float(os.environ.get("DAGWERK_WORK_SECONDS", "0.02")))
    return {"n": inputs.parameters["n"]}


@dagwerk.plugin("mw_fanin")
def mw_fanin(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    _ledger(ctx, "fanin")
    return {"total": sum(int(str(o.fields["n"])) for o in inputs.edges["items"])}


@dagwerk.plugin("mw_hold")
def mw_hold(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    folder = _ledger(ctx, "hold")
    while not (folder / "release").exists():
        ctx.cancelled.wait(0.02)
    return {"n": inputs.parameters["n"]}
