"""Plugins of the chaos runs (imported by ``chaos_worker.py`` in each worker process).

Every attempt first appends itself to the ledger, a folder outside the
database (``$DAGWERK_CHAOS_LEDGER``): it creates a file named after its
attempt ID exclusively, so an attempt that runs twice leaves a ``dup-`` file
beside the first. The driver compares the ledger with the attempts the store
recorded. The plugins take a little time (``_work``) so that kills land
mid-attempt.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dagwerk.models import TaskInputs
from dagwerk.runtime.context import TaskContext


class ChaosFailure(RuntimeError):
    """The failure a flaky or doomed plugin raises on purpose."""


def ledger_name(attempt_id: str) -> str:
    """The ledger file name of one attempt (attempt IDs may hold ``:``)."""
    return attempt_id.replace(":", "_").replace("/", "_")


def _ledger(ctx: TaskContext) -> None:
    folder = Path(os.environ["DAGWERK_CHAOS_LEDGER"])
    entry = json.dumps(
        {
            "task_id": ctx.task_id,
            "attempt_id": ctx.attempt_id,
            "attempt": ctx.attempt,
            "plugin": ctx.plugin,
            "pid": os.getpid(),
        }
    )
    name = ledger_name(ctx.attempt_id)
    try:
        with open(folder / name, "x") as handle:
            handle.write(entry)
    except FileExistsError:
        (folder / f"dup-{name}-{os.getpid()}-{time.time_ns()}").write_text(entry)


def _work(ctx: TaskContext) -> None:
    # 20-150 ms: long enough for a kill to land mid-attempt, short enough
    # for hundreds of tasks a minute on two cores.
    ctx.cancelled.wait(random.uniform(0.02, 0.15))
    ctx.check_cancelled()


def _n(inputs: TaskInputs) -> int:
    return int(str(inputs.parameters["n"]))


def c_gen(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, Any]]:
    _ledger(ctx)
    _work(ctx)
    return [{"n": n} for n in range(int(str(inputs.parameters["count"])))]


def c_work(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    _ledger(ctx)
    _work(ctx)
    return {"n": _n(inputs)}


def c_double(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    _ledger(ctx)
    _work(ctx)
    return {"n": 2 * _n(inputs)}


def c_flaky(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    """Fails attempts numbered below ``succeed_at`` (a retry policy covers them)."""
    _ledger(ctx)
    _work(ctx)
    if ctx.attempt < int(str(inputs.parameters["succeed_at"])):
        raise ChaosFailure(f"flaky attempt {ctx.attempt}")
    return {"n": 2 * _n(inputs)}


def c_doom(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    """Always fails: its run must end FAILED however often workers die."""
    _ledger(ctx)
    _work(ctx)
    raise ChaosFailure("doomed")


def c_join(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    _ledger(ctx)
    _work(ctx)
    (left,) = inputs.edges["left"]
    (right,) = inputs.edges["right"]
    return {"n": int(str(left.fields["n"])) + int(str(right.fields["n"]))}


def c_sum(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    _ledger(ctx)
    _work(ctx)
    return {"total": sum(int(str(o.fields["n"])) for o in inputs.edges["items"])}


def c_step(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    _ledger(ctx)
    _work(ctx)
    previous = inputs.edges.get("prev", ())
    start = int(str(previous[0].fields["n"])) if previous else 0
    return {"n": start + 1}


def c_approve(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    """Waits for the driver's approval, then returns the response it got."""
    _ledger(ctx)
    _work(ctx)
    n = _n(inputs)
    if ctx.resumed_from_wait_id is None:
        ctx.wait(f"approve-{n}")
    response = ctx.wait_response
    assert isinstance(response, Mapping)  # a read-only FrozenDict
    return {"n": int(str(response["n"]))}


PLUGINS: dict[str, Callable[[TaskInputs, TaskContext], object]] = {
    "c_gen": c_gen,
    "c_work": c_work,
    "c_double": c_double,
    "c_flaky": c_flaky,
    "c_doom": c_doom,
    "c_join": c_join,
    "c_sum": c_sum,
    "c_step": c_step,
    "c_approve": c_approve,
}
