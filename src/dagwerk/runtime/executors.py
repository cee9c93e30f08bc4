"""Executors: run one plugin attempt with a deadline and an abort signal.

Every executor returns one :class:`ExecutionOutcome`, decided by whichever
of {plugin result, deadline, abort} is claimed first. A deadline is settled
as a timeout *before* the abort signal fires, so a result that arrives late
can never replace it. A pre-aborted attempt never enters the plugin.

- :class:`ThreadExecutor` runs the plugin in a daemon thread. Its stop is
  cooperative: a plugin that ignores ``ctx.cancelled`` keeps running after
  the outcome is settled, and whatever it returns later is discarded.
- :class:`AsyncExecutor` runs ``async def`` plugins on their own event loop
  and cancels the coroutine on abort (plain plugins run as in a thread).
- :class:`ProcessExecutor` runs the plugin in a child process (spawn
  context) and terminates and joins it once the outcome is settled: the
  only hard stop. Its plugins, inputs and results must be picklable. Child
  runs requested with ``ctx.start_child`` travel back with the wait outcome
  and are committed by the worker process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import multiprocessing
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from enum import StrEnum
from multiprocessing.connection import Connection
from typing import Any, Protocol

from dagwerk.json import thaw_json
from dagwerk.models import EmittedOutput, ResolvedOutput, TaskInputs
from dagwerk.runtime._batch_exec import run_batch
from dagwerk.runtime._threads import spawn
from dagwerk.runtime.clock import Clock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.errors import TaskCancelled, WaitRequested
from dagwerk.runtime.plugins import PluginFn, normalize_outputs

__all__ = [
    "AsyncExecutor",
    "AttemptJob",
    "AttemptSignal",
    "ExecutionOutcome",
    "Executor",
    "OutcomeKind",
    "ProcessExecutor",
    "ThreadExecutor",
    "make_executor",
]


class OutcomeKind(StrEnum):
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class ExecutionOutcome:
    """The settled result of one attempt.

    ``outputs`` for OK; ``error`` for ERROR; ``wait_id`` for WAIT.
    ``retryable`` is False when an isolation stop failed (WK-16): the winning
    outcome is kept but must not be retried.
    """

    kind: OutcomeKind
    outputs: tuple[EmittedOutput, ...] = ()
    error: BaseException | None = None
    wait_id: str | None = None
    retryable: bool = True
    detail: str = ""


class AttemptSignal:
    """The abort signal of one attempt plus the wake-up its executor waits on.

    :meth:`fire` records the first reason, sets ``abort`` (what plugins see
    as ``ctx.cancelled``) and wakes the executor.
    """

    def __init__(self) -> None:
        self.abort = threading.Event()
        self._wake: threading.Event | None = None
        self._lock = threading.Lock()
        self.reason: str | None = None
        self._listeners: list[Callable[[str], object]] = []

    @property
    def wake(self) -> threading.Event:
        """What a one-attempt executor waits on: set when the signal fires
        (made on first use, as batched attempts never wait on it)."""
        with self._lock:
            if self._wake is None:
                self._wake = threading.Event()
                if self.abort.is_set():
                    self._wake.set()
            return self._wake

    def bind(self, listener: Callable[[str], object]) -> None:
        """Run ``listener(reason)`` when the signal fires, before ``abort`` is set."""
        with self._lock:
            self._listeners.append(listener)
            fired = self.reason
        if fired is not None:
            listener(fired)

    def unbind(self, listener: Callable[[str], object]) -> None:
        """Forget ``listener`` (nothing happens if it is not bound): an
        attempt whose plugin is over keeps nothing alive through its signal."""
        with self._lock, contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def fire(self, reason: str) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
            listeners = list(self._listeners)
        # The settlement winner is claimed before any plugin can observe the
        # abort, so a result returned in reaction to it cannot win (WK-16).
        for listener in listeners:
            listener(self.reason)
        self.abort.set()
        with self._lock:
            wake = self._wake
        if wake is not None:
            wake.set()


class Executor(Protocol):
    """Runs one attempt and returns its settled outcome."""

    def execute(
        self,
        fn: PluginFn,
        inputs: TaskInputs,
        ctx: TaskContext,
        *,
        timeout: float | None,
        signal: AttemptSignal,
        clock: Clock,
    ) -> ExecutionOutcome: ...


class _Waker(Protocol):
    def set(self) -> None: ...


class Settlement:
    """First claim wins; later claims are discarded."""

    def __init__(self, wake: _Waker) -> None:
        self._lock = threading.Lock()
        self._wake = wake
        self.outcome: ExecutionOutcome | None = None

    def claim(self, outcome: ExecutionOutcome) -> bool:
        with self._lock:
            if self.outcome is not None:
                return False
            self.outcome = outcome
        self._wake.set()
        return True


def _outcome_of_call(fn: Callable[[], Any], task_id: str) -> ExecutionOutcome:
    try:
        result = fn()
        return ExecutionOutcome(OutcomeKind.OK, outputs=normalize_outputs(result, task_id))
    except WaitRequested as wait:
        return ExecutionOutcome(OutcomeKind.WAIT, wait_id=wait.wait_id)
    except TaskCancelled as exc:
        return ExecutionOutcome(OutcomeKind.CANCELLED, error=exc)
    except BaseException as exc:
        # A plugin error is a task failure, never a worker error; SystemExit
        # too: it would end the plugin's thread with the attempt unsettled.
        return ExecutionOutcome(OutcomeKind.ERROR, error=exc)


def _await_settlement(
    settlement: Settlement,
    signal: AttemptSignal,
    timeout: float | None,
    clock: Clock,
    on_stop: Callable[[], None] | None = None,
) -> ExecutionOutcome:
    deadline = None if timeout is None else clock.monotonic() + timeout
    while settlement.outcome is None:
        remaining = None if deadline is None else deadline - clock.monotonic()
        if remaining is not None and remaining <= 0:
            # Settle as a timeout first, then abort: a late result loses (WK-10).
            settlement.claim(ExecutionOutcome(OutcomeKind.TIMEOUT, detail=f"timeout {timeout}s"))
            break
        if signal.abort.is_set():
            settlement.claim(
                ExecutionOutcome(OutcomeKind.CANCELLED, detail=signal.reason or "aborted")
            )
            break
        clock.wait(signal.wake, remaining)
        signal.wake.clear()
    outcome = settlement.outcome
    assert outcome is not None
    if outcome.kind in (OutcomeKind.TIMEOUT, OutcomeKind.CANCELLED):
        signal.fire(outcome.detail or outcome.kind.value)
        if on_stop is not None:
            on_stop()
    return settlement.outcome or outcome


def cancelled_outcome(reason: str) -> ExecutionOutcome:
    return ExecutionOutcome(OutcomeKind.CANCELLED, detail=reason)


def pre_aborted(signal: AttemptSignal) -> ExecutionOutcome | None:
    if signal.abort.is_set():
        return ExecutionOutcome(OutcomeKind.CANCELLED, detail=signal.reason or "aborted")
    return None


class ThreadExecutor:
    """Runs each attempt in a daemon thread; stopping is cooperative."""

    def execute(
        self,
        fn: PluginFn,
        inputs: TaskInputs,
        ctx: TaskContext,
        *,
        timeout: float | None,
        signal: AttemptSignal,
        clock: Clock,
    ) -> ExecutionOutcome:
        early = pre_aborted(signal)
        if early is not None:
            return early
        settlement = Settlement(signal.wake)
        signal.bind(lambda reason: settlement.claim(cancelled_outcome(reason)))

        def call() -> Any:
            result = fn(inputs, ctx)
            if inspect.isawaitable(result):
                return asyncio.run(_as_coroutine(result))
            return result

        def body() -> None:
            settlement.claim(_outcome_of_call(call, ctx.task_id))

        # A pooled daemon thread: same semantics as a new one, without the
        # start-up cost per attempt (see runtime/_threads.py).
        spawn(body, name=f"dagwerk-attempt-{ctx.task_id}")
        return _await_settlement(settlement, signal, timeout, clock)

    def execute_many(self, jobs: Sequence[AttemptJob], *, clock: Clock) -> list[ExecutionOutcome]:
        """:meth:`execute` for several attempts at once, supervised by the
        calling thread; each attempt is settled by its result, its deadline
        (settled as a timeout before the abort fires, WK-10) or its abort
        signal, exactly as alone. The plugins run on pooled daemon threads,
        as few as keep every attempt moving (see ``runtime/_batch_exec.py``).
        Outcomes in job order."""
        wake = threading.Event()
        countdown = _Countdown(len(jobs), wake)
        settlements: list[Settlement] = []
        for job in jobs:
            settlement = Settlement(countdown)
            settlements.append(settlement)
            early = pre_aborted(job.signal)
            if early is not None:
                settlement.claim(early)
                continue
            job.signal.bind(_claim_cancelled(settlement))
        run_batch(
            jobs,
            settlements,
            wake,
            clock=clock,
            call=call_job,
            timeout_outcome=timeout_outcome,
        )
        outcomes: list[ExecutionOutcome] = []
        for job, settlement in zip(jobs, settlements, strict=True):
            outcome = settlement.outcome
            assert outcome is not None
            if outcome.kind is OutcomeKind.CANCELLED:
                job.signal.fire(outcome.detail or outcome.kind.value)
            outcomes.append(outcome)
        return outcomes


class _Countdown:
    """Wakes the batch's supervisor once every attempt is settled (not once
    per attempt: a wake per trivial attempt costs a thread switch each)."""

    def __init__(self, count: int, event: threading.Event) -> None:
        self._lock = threading.Lock()
        self._left = count
        self._event = event

    def set(self) -> None:
        with self._lock:
            self._left -= 1
            done = self._left <= 0
        if done:
            self._event.set()


def timeout_outcome(timeout: float | None) -> ExecutionOutcome:
    return ExecutionOutcome(OutcomeKind.TIMEOUT, detail=f"timeout {timeout}s")


def call_job(job: AttemptJob) -> ExecutionOutcome:
    def call() -> Any:
        result = job.fn(job.inputs, job.ctx)
        if inspect.isawaitable(result):
            return asyncio.run(_as_coroutine(result))
        return result

    return _outcome_of_call(call, job.ctx.task_id)


@dataclass(frozen=True, slots=True)
class AttemptJob:
    """One attempt for :meth:`ThreadExecutor.execute_many`."""

    fn: PluginFn
    inputs: TaskInputs
    ctx: TaskContext
    timeout: float | None
    signal: AttemptSignal


def _claim_cancelled(settlement: Settlement) -> Callable[[str], object]:
    return lambda reason: settlement.claim(cancelled_outcome(reason))


async def _as_coroutine(awaitable: Any) -> Any:
    return await awaitable


class AsyncExecutor:
    """Runs ``async def`` plugins on a private event loop and cancels them on abort."""

    def execute(
        self,
        fn: PluginFn,
        inputs: TaskInputs,
        ctx: TaskContext,
        *,
        timeout: float | None,
        signal: AttemptSignal,
        clock: Clock,
    ) -> ExecutionOutcome:
        early = pre_aborted(signal)
        if early is not None:
            return early
        settlement = Settlement(signal.wake)
        signal.bind(lambda reason: settlement.claim(cancelled_outcome(reason)))
        loop_ready = threading.Event()
        handles: dict[str, Any] = {}

        async def main() -> Any:
            handles["loop"] = asyncio.get_running_loop()
            handles["task"] = asyncio.current_task()
            loop_ready.set()
            result = fn(inputs, ctx)
            if inspect.isawaitable(result):
                return await result
            return result

        def call() -> Any:
            try:
                return asyncio.run(_checked(main()))
            except asyncio.CancelledError:
                raise TaskCancelled(f"task {ctx.task_id!r} was cancelled") from None
            finally:
                loop_ready.set()

        def body() -> None:
            settlement.claim(_outcome_of_call(call, ctx.task_id))

        def stop() -> None:
            loop_ready.wait(timeout=5)
            loop, task = handles.get("loop"), handles.get("task")
            if loop is not None and task is not None and not loop.is_closed():
                # The loop may close in between: then there is nothing to cancel.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(task.cancel)

        threading.Thread(target=body, name=f"dagwerk-async-{ctx.task_id}", daemon=True).start()
        return _await_settlement(settlement, signal, timeout, clock, on_stop=stop)


async def _checked(coro: Coroutine[Any, Any, Any]) -> Any:
    return await coro


# --- the process executor ------------------------------------------------------------


def _inputs_to_wire(inputs: TaskInputs) -> tuple[dict[str, list[tuple[str, Any, Any]]], Any]:
    edges = {
        name: [(o.id, thaw_json(o.fields), thaw_json(o.data)) for o in outs]
        for name, outs in inputs.edges.items()
    }
    return edges, thaw_json(inputs.parameters)


def _inputs_from_wire(wire: tuple[dict[str, list[tuple[str, Any, Any]]], Any]) -> TaskInputs:
    edges, parameters = wire
    return TaskInputs(
        edges={
            name: tuple(ResolvedOutput(id=i, fields=f, data=d) for i, f, d in outs)
            for name, outs in edges.items()
        },
        parameters=parameters,
    )


def _child_main(
    fn: PluginFn,
    wire_inputs: tuple[dict[str, list[tuple[str, Any, Any]]], Any],
    ctx: TaskContext,
    conn: Connection,
) -> None:
    """Entry point of the child process: run the plugin, send one message back."""
    inputs = _inputs_from_wire(wire_inputs)

    def call() -> Any:
        result = fn(inputs, ctx)
        if inspect.isawaitable(result):
            return asyncio.run(_as_coroutine(result))
        return result

    outcome = _outcome_of_call(call, ctx.task_id)
    outputs = [(o.id, thaw_json(o.fields), thaw_json(o.data)) for o in outcome.outputs]
    error: BaseException | None = outcome.error
    # Child runs the plugin asked for travel back with a wait: the worker
    # process commits them (see dagwerk.runtime.children).
    children = dict(ctx.children.pending) if outcome.kind is OutcomeKind.WAIT else {}
    try:
        conn.send((outcome.kind.value, outputs, error, outcome.wait_id, children))
    except Exception as exc:
        if children:
            text = (
                "ChildRunError: child_run_invalid: the child run request cannot be sent "
                f"to the worker process: {type(exc).__name__}: {exc}"
            )
            conn.send((OutcomeKind.ERROR.value, [], RuntimeError(text), None, {}))
        else:  # an unpicklable exception travels as its text
            text = f"{type(error).__name__}: {error}"
            conn.send((outcome.kind.value, outputs, RuntimeError(text), outcome.wait_id, {}))
    finally:
        conn.close()


def _no_heartbeat() -> None:
    return None


class ProcessExecutor:
    """Runs each attempt in a spawned child process; timeout and abort terminate it.

    The parent keeps the lease alive while the child runs. ``join_timeout``
    bounds how long terminate and kill may take; a child that survives both
    keeps the winning outcome but marks it non-retryable (WK-16).
    """

    def __init__(self, *, join_timeout: float = 5.0) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._join_timeout = join_timeout

    def execute(
        self,
        fn: PluginFn,
        inputs: TaskInputs,
        ctx: TaskContext,
        *,
        timeout: float | None,
        signal: AttemptSignal,
        clock: Clock,
    ) -> ExecutionOutcome:
        early = pre_aborted(signal)
        if early is not None:
            return early
        settlement = Settlement(signal.wake)
        signal.bind(lambda reason: settlement.claim(cancelled_outcome(reason)))
        parent_conn, child_conn = self._ctx.Pipe(duplex=False)
        child_abort = self._ctx.Event()
        child_ctx = dataclasses.replace(
            ctx, cancelled=child_abort, heartbeat_fn=_no_heartbeat, secrets=dict(ctx.secrets)
        )
        process = self._ctx.Process(
            target=_child_main,
            args=(fn, _inputs_to_wire(inputs), child_ctx, child_conn),
            name=f"dagwerk-attempt-{ctx.task_id}",
            daemon=True,
        )
        process.start()
        # The parent's copy of the child end must close, or recv never sees EOF.
        child_conn.close()

        def reader() -> None:
            try:
                kind, outputs, error, wait_id, children = parent_conn.recv()
            except (EOFError, OSError):
                parent_conn.close()
                settlement.claim(
                    ExecutionOutcome(
                        OutcomeKind.ERROR,
                        error=RuntimeError("plugin process exited without a result"),
                    )
                )
                return
            parent_conn.close()
            # Merged before the outcome is claimed, so the settle sees them.
            ctx.children.pending.update(children)
            outcome = ExecutionOutcome(
                OutcomeKind(kind),
                outputs=tuple(EmittedOutput(id=i, fields=f, data=d) for i, f, d in outputs),
                error=error,
                wait_id=wait_id,
            )
            settlement.claim(outcome)

        reader_thread = threading.Thread(target=reader, daemon=True)
        reader_thread.start()
        stopped_cleanly = True

        def stop() -> None:
            nonlocal stopped_cleanly
            child_abort.set()
            process.terminate()
            process.join(self._join_timeout)
            if process.is_alive():
                process.kill()
                process.join(self._join_timeout)
            stopped_cleanly = not process.is_alive()

        outcome = _await_settlement(settlement, signal, timeout, clock, on_stop=stop)
        if outcome.kind not in (OutcomeKind.TIMEOUT, OutcomeKind.CANCELLED):
            process.join(self._join_timeout)
            if process.is_alive():
                stop()
        reader_thread.join(self._join_timeout)
        if not reader_thread.is_alive():
            parent_conn.close()
        # Otherwise the child survived its stop and the reader still blocks on
        # the pipe: closing it under the reader would raise in that thread, so
        # the reader closes it once the child finally exits.
        if not stopped_cleanly:
            return dataclasses.replace(
                outcome, retryable=False, detail=f"{outcome.detail}; child did not stop"
            )
        return outcome


def make_executor(kind: str | Executor) -> Executor:
    """``"thread"``, ``"process"``, ``"async"`` or an executor object."""
    if not isinstance(kind, str):
        return kind
    if kind == "thread":
        return ThreadExecutor()
    if kind == "process":
        return ProcessExecutor()
    if kind == "async":
        return AsyncExecutor()
    raise ValueError(f"unknown executor {kind!r}; expected 'thread', 'process' or 'async'")
