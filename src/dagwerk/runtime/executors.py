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
- :class:`ProcessExecutor` runs the plugin in a warm child process (spawn
  context) reused across attempts, and kills and joins that process when
  an attempt times out or is cancelled: the only hard stop. Its plugins,
  inputs and results must be picklable. Child runs requested with
  ``ctx.start_child`` travel back with the wait outcome and are committed
  by the worker process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from dagwerk.models import TaskInputs
from dagwerk.runtime._batch_exec import run_batch
from dagwerk.runtime._plugin_process import (
    STEP_REQUEST,
    PluginTransferError,
    answer_step_request,
    exit_text,
    job_bytes,
    read_reply,
    serve_plugin_process,
)
from dagwerk.runtime._process_pool import PluginProcess, ProcessPool
from dagwerk.runtime._threads import spawn
from dagwerk.runtime.clock import Clock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.errors import TaskCancelled
from dagwerk.runtime.outcomes import ExecutionOutcome, OutcomeKind, as_coroutine, outcome_of_call
from dagwerk.runtime.plugins import PluginFn
from dagwerk.runtime.task_logs import captured, forward_log_message, is_log_message

__all__ = [
    "AsyncExecutor",
    "AttemptJob",
    "AttemptSignal",
    "ClosableExecutor",
    "ExecutionOutcome",
    "Executor",
    "OutcomeKind",
    "PluginTransferError",
    "ProcessExecutor",
    "ThreadExecutor",
    "make_executor",
]


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


@runtime_checkable
class ClosableExecutor(Executor, Protocol):
    """An executor that holds resources (processes) until :meth:`close`."""

    def close(self) -> None: ...


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
                return asyncio.run(as_coroutine(result))
            return result

        def body() -> None:
            settlement.claim(outcome_of_call(captured(ctx.task_log, call), ctx.task_id))

        # A pooled daemon thread: same semantics as a new one, without the
        # start-up cost per attempt (see runtime/_threads.py).
        spawn(body, name=f"dagwerk-attempt-{ctx.task_id}")
        return _await_settlement(settlement, signal, timeout, clock)

    def execute_many(
        self,
        jobs: Sequence[AttemptJob],
        *,
        clock: Clock,
        parallelism: int | None = None,
        observe: Callable[[int, float], object] | None = None,
        flush: Callable[[list[tuple[int, ExecutionOutcome]]], object] | None = None,
    ) -> list[ExecutionOutcome]:
        """:meth:`execute` for several attempts at once, supervised by the
        calling thread; each attempt is settled by its result, its deadline
        (settled as a timeout before the abort fires, WK-10) or its abort
        signal, exactly as alone. The plugins run on pooled daemon threads,
        as few as keep every attempt moving and at most ``parallelism`` at
        once (see ``runtime/_batch_exec.py``); ``observe(index, seconds)``
        is told how long each returned call took; ``flush([(index, outcome)])``, on the
        calling thread, gets the results that returned while others still
        run once they waited a few milliseconds (``FLUSH_SECONDS``). Outcomes
        in job order, flushed ones included."""
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
            parallelism=parallelism,
            observe=observe,
            flush=flush,
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
            return asyncio.run(as_coroutine(result))
        return result

    return outcome_of_call(captured(job.ctx.task_log, call), job.ctx.task_id)


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
            settlement.claim(outcome_of_call(captured(ctx.task_log, call), ctx.task_id))

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


class ProcessExecutor:
    """Runs each attempt in a warm plugin process; timeout and abort kill it.

    The processes (spawn context) are kept between attempts by a pool of at
    most ``processes`` idle ones (see ``runtime/_process_pool.py``): started
    on demand, reused after an attempt that returned, raised or waited,
    killed when an attempt times out or is cancelled (the hard stop), and
    replaced by a fresh one when the next attempt needs it. A plugin that
    kills its process (``os._exit``, a segfault) fails only its attempt.
    Plugins, inputs and results must be picklable; a plugin's module is
    imported once per process, and module state persists across the
    attempts a process runs (as in Celery's prefork pool).

    An attempt's deadline runs from the moment its process is ready: a new
    process first starts an interpreter (a fraction of a second, more on a
    loaded machine), bounded by ``start_timeout``; the first attempt in a
    process also imports the plugin's module within its deadline.

    The parent keeps the lease alive while the plugin runs. ``join_timeout``
    bounds how long terminate and kill may take; a child that survives both
    keeps the winning outcome but marks it non-retryable (WK-16).
    :meth:`close` stops every process; a worker closes the executor it made
    from ``executor="process"``; an executor object passed to a worker is
    its caller's to close.
    """

    def __init__(
        self,
        *,
        join_timeout: float = 5.0,
        processes: int | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        self._join_timeout = join_timeout
        self._start_timeout = start_timeout
        self._pool = ProcessPool(
            multiprocessing.get_context("spawn"),
            serve_plugin_process,
            size=processes if processes is not None else os.cpu_count() or 1,
            join_timeout=join_timeout,
        )

    def close(self) -> None:
        """Stop and join every plugin process; later attempts raise. Idempotent."""
        self._pool.close()

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
        try:
            job = job_bytes(fn, inputs, ctx)
        except Exception as exc:
            error = PluginTransferError(
                f"the plugin {ctx.plugin!r}, its inputs or its context cannot be sent to a "
                f"plugin process (process executor): {type(exc).__name__}: {exc}"
            )
            return ExecutionOutcome(OutcomeKind.ERROR, error=error)
        settlement = Settlement(signal.wake)
        listener = _claim_cancelled(settlement)
        signal.bind(listener)
        try:
            return self._run(job, ctx, settlement, timeout=timeout, signal=signal, clock=clock)
        finally:
            signal.unbind(listener)

    def _send(self, job: bytes) -> PluginProcess | ExecutionOutcome:
        """A process that accepted ``job``. One that died while idle is
        replaced (its pipe refuses the write); a new process that died
        before it read the job is the attempt's crash."""
        while True:
            process = self._pool.acquire()
            try:
                process.conn.send_bytes(job)
            except OSError:
                process.stop(self._join_timeout)
                process.conn.close()
                self._pool.release(process, reusable=False)
                if process.ready:
                    continue
                error = RuntimeError(exit_text(process.process.exitcode))
                return ExecutionOutcome(OutcomeKind.ERROR, error=error)
            return process

    def _run(
        self,
        job: bytes,
        ctx: TaskContext,
        settlement: Settlement,
        *,
        timeout: float | None,
        signal: AttemptSignal,
        clock: Clock,
    ) -> ExecutionOutcome:
        sent = self._send(job)
        if isinstance(sent, ExecutionOutcome):
            return sent
        process = sent
        died: list[bool] = []

        def reader() -> None:
            try:
                if not process.ready:
                    process.conn.recv_bytes()  # its first message: it has started
                    process.ready = True
                    signal.wake.set()
                data = process.conn.recv_bytes()
                while True:  # step requests and logged lines, then the reply
                    if data.startswith(STEP_REQUEST):
                        process.conn.send_bytes(answer_step_request(ctx.journal, data))
                    elif is_log_message(data):
                        forward_log_message(ctx.task_log, data)
                    else:
                        break
                    data = process.conn.recv_bytes()
            except (EOFError, OSError):
                died.append(True)
                process.conn.close()
                process.process.join(self._join_timeout)
                error = RuntimeError(exit_text(process.process.exitcode))
                settlement.claim(ExecutionOutcome(OutcomeKind.ERROR, error=error))
                return
            try:
                outcome, children = read_reply(data)
            except Exception as exc:
                text = f"the plugin's result cannot be read: {type(exc).__name__}: {exc}"
                settlement.claim(ExecutionOutcome(OutcomeKind.ERROR, error=RuntimeError(text)))
                return
            # Merged before the outcome is claimed, so the settle sees them.
            ctx.children.pending.update(children)
            settlement.claim(outcome)

        reading = spawn(reader, name=f"dagwerk-plugin-reader-{ctx.task_id}")
        stopped: list[bool] = []

        def stop() -> None:
            stopped.append(process.stop(self._join_timeout))

        if not self._started(process, settlement, signal):
            stop()
        outcome = _await_settlement(settlement, signal, timeout, clock, on_stop=stop)
        if not stopped:
            # The reader claimed this outcome (a result, an error, a crash):
            # all it has left is to return.
            reading.join()
            self._pool.release(process, reusable=not died)
            return outcome
        if reading.join(self._join_timeout):
            process.conn.close()
        # Otherwise the child survived its stop and the reader still blocks on
        # the pipe: closing it under the reader would raise in that thread, so
        # the reader closes it once the child finally exits.
        self._pool.release(process, reusable=False)
        if not stopped[0]:
            return dataclasses.replace(
                outcome, retryable=False, detail=f"{outcome.detail}; child did not stop"
            )
        return outcome

    def _started(
        self, process: PluginProcess, settlement: Settlement, signal: AttemptSignal
    ) -> bool:
        """Wait (real time) until a new process has started, so the attempt's
        deadline covers its plugin and not the interpreter's start-up; an
        abort or a crash ends the wait early. False when it did not start
        within ``start_timeout``: the attempt is settled as an error."""
        limit = time.monotonic() + self._start_timeout
        while not process.ready and settlement.outcome is None and not signal.abort.is_set():
            remaining = limit - time.monotonic()
            if remaining <= 0:
                text = f"plugin process did not start within {self._start_timeout}s"
                settlement.claim(ExecutionOutcome(OutcomeKind.ERROR, error=RuntimeError(text)))
                return False
            signal.wake.wait(remaining)
            signal.wake.clear()
        return True


def make_executor(kind: str | Executor, *, processes: int | None = None) -> Executor:
    """``"thread"``, ``"process"``, ``"async"`` or an executor object.

    ``processes`` bounds the process executor's pool of idle processes (a
    worker passes its concurrency)."""
    if not isinstance(kind, str):
        return kind
    if kind == "thread":
        return ThreadExecutor()
    if kind == "process":
        return ProcessExecutor(processes=processes)
    if kind == "async":
        return AsyncExecutor()
    raise ValueError(f"unknown executor {kind!r}; expected 'thread', 'process' or 'async'")
