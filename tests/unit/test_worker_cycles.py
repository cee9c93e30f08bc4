"""A worker frees what an attempt held when the attempt ends, not at the
next full pass of the cyclic garbage collector.

An attempt run inline (the lone attempt of a batch, on the actor's loop:
a fan-out's root, a join) stayed bound to its own abort signal through its
hand-over, a reference cycle: the root's emitted outputs, or the join's
resolved inputs, lived on until a full collection, which at 100,000 items
freed 400,161 objects in one 169 ms pass (docs/performance.md).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from test_runtime_batch_exec import _job

from dagwerk.backends.memory import MemoryStore
from dagwerk.completions import _DeferredCallbacks
from dagwerk.constants import InputMode, RunStatus
from dagwerk.models import DagNode, EmittedOutput, InputEdge, TaskInputs
from dagwerk.orchestrator import OrchestratorCallbacks, start_run
from dagwerk.runtime._inline import InlineRunner
from dagwerk.runtime.attempts import Attempt
from dagwerk.runtime.clock import SystemClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.executors import ExecutionOutcome, OutcomeKind
from dagwerk.runtime.worker import Worker


@contextmanager
def collector_off() -> Iterator[list[object]]:
    """The cyclic collector off inside the block; on leaving it, one pass
    saves what only cycles kept alive into the list the block got."""
    found: list[object] = []
    gc.collect()
    gc.disable()
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


class _HandOver:
    def __call__(self, outcome: ExecutionOutcome) -> None:
        raise AssertionError(f"handed over unexpectedly: {outcome}")


def test_a_finished_inline_run_keeps_nothing_alive_through_its_signal() -> None:
    runner = InlineRunner(SystemClock())
    job = _job(lambda inputs, ctx: {"ok": True}, 0)
    hand_over = _HandOver()
    ref = weakref.ref(hand_over)
    gc.disable()
    try:
        outcome = runner.run(job, hand_over)
        del hand_over
        # Freed by reference counting alone, while the job (and its signal) lives.
        assert ref() is None
    finally:
        gc.enable()
        runner.stop()
    assert outcome.kind is OutcomeKind.OK
    job.signal.fire("late abort")  # the attempt is over: nothing to settle
    assert job.signal.abort.is_set()


def test_deferred_run_callbacks_are_freed_without_the_collector() -> None:
    gc.disable()
    try:
        deferred = _DeferredCallbacks()
        deferred.callbacks.on_run_completed("run-1")
        ref = weakref.ref(deferred)
        del deferred
        assert ref() is None
    finally:
        gc.enable()


def _noop(run_id: str) -> None:
    return None


def test_a_serving_worker_leaves_no_attempt_in_cyclic_garbage(tmp_path: Path) -> None:
    def emit(inputs: TaskInputs, ctx: TaskContext) -> object:
        return [{"n": n} for n in range(200)]

    def join(inputs: TaskInputs, ctx: TaskContext) -> object:
        return {"count": len(inputs.edges["root"])}

    store = MemoryStore()
    nodes = [
        DagNode(slug="root", plugin="emit"),
        DagNode(
            slug="join",
            plugin="join",
            input_mode=InputMode.ALL,
            edges=(InputEdge(name="root", source="root"),),
        ),
    ]
    assert store.create_run("run-1", nodes)
    start_run(store, "run-1", callbacks=OrchestratorCallbacks(_noop, _noop, _noop, _noop))
    with collector_off() as garbage:
        worker = Worker(
            store, {"emit": emit, "join": join}, execution_root=tmp_path, backstop_interval=None
        )
        worker.start()
        try:
            assert worker.wait_for_run("run-1", 30.0) is RunStatus.COMPLETED
        finally:
            worker.stop()
        del worker
    # Both attempts ran inline, each its batch's only one, on the actor's loop.
    held = [o for o in garbage if isinstance(o, Attempt | EmittedOutput)]
    assert held == []
