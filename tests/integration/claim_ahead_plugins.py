"""Plugins of the claim-ahead process tests (``dagwerk worker --plugins``).

Every attempt of ``ca_nap`` and ``ca_step`` that enters its plugin creates
``started-<task>-<attempt>-<pid>`` in ``$DAGWERK_EVENTS``. ``ca_gen`` emits
``count`` items, each with the other fields of the run input. ``ca_nap``
waits its item's ``seconds``; ``ca_step`` returns at once for items below
their ``fast`` and otherwise waits until ``$DAGWERK_EVENTS/release`` exists.
Both end early when the attempt is cancelled (the worker stops).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dagwerk
from dagwerk import TaskContext, TaskInputs


def _started(ctx: TaskContext) -> Path:
    events = Path(os.environ["DAGWERK_EVENTS"])
    name = f"started-{ctx.task_id.replace(':', '_')}-{ctx.attempt}-{os.getpid()}"
    partial = events / f".{name}.tmp"
    partial.write_text("")
    partial.replace(events / name)
    return events


@dagwerk.plugin("ca_gen")
def ca_gen(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, Any]]:
    extra = {k: v for k, v in inputs.parameters.items() if k != "count"}
    return [{"n": n, **extra} for n in range(int(str(inputs.parameters["count"])))]


@dagwerk.plugin("ca_nap")
def ca_nap(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    _started(ctx)
    ctx.cancelled.wait(float(str(inputs.parameters["seconds"])))
    return {"n": inputs.parameters["n"]}


@dagwerk.plugin("ca_step")
def ca_step(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    events = _started(ctx)
    n = int(str(inputs.parameters["n"]))
    if n >= int(str(inputs.parameters["fast"])):
        while not (events / "release").exists() and not ctx.cancelled.is_set():
            ctx.cancelled.wait(0.02)
    return {"n": n}
