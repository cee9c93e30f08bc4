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
import contextvars
import dataclasses
import inspect
import io
import multiprocessing
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from enum import StrEnum
from multiprocessing.connection import Connection
from signal import SIGINT, Signals
from signal import signal as install_handler
from types import FrameType
from typing import Any, Protocol, runtime_checkable

from dagwerk.json import thaw_json
from dagwerk.models import EmittedOutput, ResolvedOutput, TaskInputs
from dagwerk.runtime._batch_exec import run_batch
from dagwerk.runtime._process_pool import PluginProcess, ProcessPool
from dagwerk.runtime._threads import spawn
from dagwerk.runtime.clock import Clock
from dagwerk.runtime.context import AbortSignal, TaskContext
from dagwerk.runtime.errors import NonRetryableError, TaskCancelled, WaitRequested
from dagwerk.runtime.plugins import PluginFn, normalize_outputs

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


class PluginTransferError(NonRetryableError):
    """The process executor cannot hand an attempt to its plugin process: the
    plugin, its inputs or its context do not pickle, or the plugin's module
    does not import there. No retry: the next attempt would fail the same way."""

    code = "plugin_transfer_failed"


class _InChild:
    """``ctx.cancelled`` while a context travels: the plugin process puts its
    own abort event in its place (an event cannot be pickled into a running
    process)."""

    def is_set(self) -> bool:
        return False

    def set(self) -> None:
        return None

    def wait(self, timeout: float | None = None) -> bool:
        return False


def _dumps(value: object) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _job_bytes(fn: PluginFn, inputs: TaskInputs, ctx: TaskContext) -> bytes:
    """What the plugin process reads: the worker's ``sys.path``, then the job.

    Two pickles in a row, so the plugin process sets ``sys.path`` before it
    unpickles the plugin (and imports its module): a plugin directory the
    worker added after the process started is found too.
    """
    travelling = dataclasses.replace(
        ctx, cancelled=_InChild(), heartbeat_fn=_no_heartbeat, secrets=dict(ctx.secrets)
    )
    return _dumps(list(sys.path)) + _dumps((fn, _inputs_to_wire(inputs), travelling))


def _reply_bytes(outcome: ExecutionOutcome, children: dict[str, Any]) -> bytes:
    """The message for the worker: ``(kind, outputs, error, wait_id, children)``.

    An error that does not survive pickling (or rebuilding: an exception
    whose ``__init__`` wants other arguments) travels as its text; child run
    requests that cannot travel fail the attempt (``child_run_invalid``).
    """
    outputs = [(o.id, thaw_json(o.fields), thaw_json(o.data)) for o in outcome.outputs]
    message = (outcome.kind.value, outputs, outcome.error, outcome.wait_id, children)
    try:
        data = _dumps(message)
        if outcome.error is not None:
            pickle.loads(data)
        return data
    except Exception as exc:
        if children:
            text = (
                "ChildRunError: child_run_invalid: the child run request cannot be sent "
                f"to the worker process: {type(exc).__name__}: {exc}"
            )
            failed: tuple[object, ...] = (OutcomeKind.ERROR.value, [], RuntimeError(text), None, {})
            return _dumps(failed)
        error = outcome.error
        text = f"{type(error).__name__}: {error}"
        as_text: tuple[object, ...] = (
            outcome.kind.value,
            outputs,
            RuntimeError(text),
            outcome.wait_id,
            {},
        )
        return _dumps(as_text)


def _run_job(data: bytes, abort: AbortSignal) -> bytes:
    """Run one job in the plugin process; the reply for the worker."""
    stream = io.BytesIO(data)
    try:
        path = pickle.load(stream)
        if sys.path != path:
            sys.path[:] = path
        fn, wire_inputs, travelling = pickle.load(stream)
    except BaseException as exc:
        error = PluginTransferError(
            f"the plugin process cannot load the attempt: {type(exc).__name__}: {exc}"
        )
        return _reply_bytes(ExecutionOutcome(OutcomeKind.ERROR, error=error), {})
    ctx: TaskContext = dataclasses.replace(travelling, cancelled=abort)
    inputs = _inputs_from_wire(wire_inputs)

    def call() -> Any:
        result = fn(inputs, ctx)
        if inspect.isawaitable(result):
            return asyncio.run(_as_coroutine(result))
        return result

    outcome = _outcome_of_call(call, ctx.task_id)
    # Child runs the plugin asked for travel back with a wait: the worker
    # process commits them (see dagwerk.runtime.children).
    children = dict(ctx.children.pending) if outcome.kind is OutcomeKind.WAIT else {}
    return _reply_bytes(outcome, children)


def _ignore_interrupt(signum: int, frame: FrameType | None) -> None:
    return None


def serve_plugin_process(conn: Connection, abort: AbortSignal) -> None:
    """Entry point of a plugin process: run jobs from ``conn`` until it closes.

    Each job runs in a fresh :class:`contextvars.Context`; afterwards the
    working directory and the environment are put back as the process
    started with them. What a plugin keeps in module state (globals, caches,
    imported modules) stays for the next attempt in this process.
    """
    # Ctrl-C reaches the whole process group: the worker stops its plugin
    # processes itself. A handler, not SIG_IGN, so programs a plugin runs
    # still get the default. (Only the main thread may set one.)
    if threading.current_thread() is threading.main_thread():
        install_handler(SIGINT, _ignore_interrupt)
    cwd, environ = os.getcwd(), dict(os.environ)
    try:
        conn.send_bytes(b"")  # started: the worker's deadlines begin now
    except OSError:
        return
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the pool closed the pipe, or the worker process died
        reply = contextvars.Context().run(_run_job, data, abort)
        if os.getcwd() != cwd:
            os.chdir(cwd)
        if os.environ != environ:
            os.environ.clear()
            os.environ.update(environ)
        try:
            conn.send_bytes(reply)
        except OSError:
            return


def _no_heartbeat() -> None:
    return None


def _exit_text(exitcode: int | None) -> str:
    if exitcode is None:
        return "plugin process exited without a result"
    if exitcode < 0:
        try:
            name = Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"plugin process exited without a result (killed by {name})"
    return f"plugin process exited without a result (exit code {exitcode})"


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
            job = _job_bytes(fn, inputs, ctx)
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
                error = RuntimeError(_exit_text(process.process.exitcode))
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
            except (EOFError, OSError):
                died.append(True)
                process.conn.close()
                process.process.join(self._join_timeout)
                error = RuntimeError(_exit_text(process.process.exitcode))
                settlement.claim(ExecutionOutcome(OutcomeKind.ERROR, error=error))
                return
            try:
                kind, outputs, error, wait_id, children = pickle.loads(data)
            except Exception as exc:
                text = f"the plugin's result cannot be read: {type(exc).__name__}: {exc}"
                settlement.claim(ExecutionOutcome(OutcomeKind.ERROR, error=RuntimeError(text)))
                return
            # Merged before the outcome is claimed, so the settle sees them.
            ctx.children.pending.update(children)
            outcome = ExecutionOutcome(
                OutcomeKind(kind),
                outputs=tuple(EmittedOutput(id=i, fields=f, data=d) for i, f, d in outputs),
                error=error,
                wait_id=wait_id,
            )
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
