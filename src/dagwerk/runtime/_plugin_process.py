"""Inside a plugin process of the process executor, and the messages
between it and the worker.

The worker writes a job (its ``sys.path``, then the plugin, the inputs and
the context, as two pickles) to the process's pipe; the process runs it and
writes back one reply ``(kind, outputs, error, wait_id, children)``,
preceded by the attempt's log lines, if it logged any (see
``runtime/task_logs.py``). A process's first message, empty, says it has
started. While the plugin runs, each ``ctx.step`` it records is a step
request (:data:`STEP_REQUEST` and a pickle of ``(name, result)``) that the
worker answers with ``("ok", recorded result)`` or ``("error", exception)``
(:func:`answer_step_request`). See ``runtime/_process_pool.py`` for the
processes' lifecycle.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import io
import logging
import multiprocessing
import os
import pickle
import sys
import threading
from functools import partial
from multiprocessing.connection import Connection
from signal import SIGINT, Signals
from signal import signal as install_handler
from types import FrameType
from typing import Any

from dagwerk.json import JsonValue, thaw_json
from dagwerk.models import EmittedOutput, ResolvedOutput, TaskInputs
from dagwerk.runtime.context import AbortSignal, TaskContext
from dagwerk.runtime.durable import AttemptJournal, StepError, StepRecorder
from dagwerk.runtime.errors import NonRetryableError
from dagwerk.runtime.outcomes import ExecutionOutcome, OutcomeKind, as_coroutine, outcome_of_call
from dagwerk.runtime.plugins import PluginFn
from dagwerk.runtime.task_logs import run_in_plugin_process
from dagwerk.runtime.tracebacks import format_traceback

__all__ = [
    "STEP_REQUEST",
    "PluginTransferError",
    "answer_step_request",
    "exit_text",
    "job_bytes",
    "read_reply",
    "serve_plugin_process",
]


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


TASK_LOGGER = "dagwerk.task"
"""The parent of every plugin's ``ctx.logger``."""
_TASK_LOG_FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")


def job_bytes(fn: PluginFn, inputs: TaskInputs, ctx: TaskContext) -> bytes:
    """What the plugin process reads: the worker's ``sys.path`` and the level
    its task loggers show, then the job.

    Two pickles in a row, so the plugin process sets ``sys.path`` before it
    unpickles the plugin (and imports its module): a plugin directory the
    worker added after the process started is found too.
    """
    travelling = dataclasses.replace(
        ctx, cancelled=_InChild(), heartbeat_fn=_no_heartbeat, secrets=dict(ctx.secrets)
    )
    level = logging.getLogger(TASK_LOGGER).getEffectiveLevel()
    return _dumps((list(sys.path), level)) + _dumps((fn, _inputs_to_wire(inputs), travelling))


class _TaskLogging:
    """The plugin process's task loggers write to its stderr (the worker's)
    from the level the worker's task loggers show. Only in a process of its
    own: a plugin process run in the worker's process (tests do) leaves the
    worker's logging as it is."""

    def __init__(self) -> None:
        self.level: int | None = None
        self.handler = logging.StreamHandler(sys.stderr)
        self.handler.setFormatter(_TASK_LOG_FORMAT)

    def follow(self, level: int) -> None:
        if level == self.level or multiprocessing.parent_process() is None:
            return
        logger = logging.getLogger(TASK_LOGGER)
        if self.level is None:
            logger.addHandler(self.handler)
        logger.setLevel(level)
        self.level = level


_TASK_LOGGING = _TaskLogging()


def _reply_bytes(outcome: ExecutionOutcome, children: dict[str, Any]) -> bytes:
    """The message for the worker: ``(kind, outputs, error, wait_id,
    children, traceback)``, ``traceback`` the error's formatted traceback
    (its frames do not survive pickling).

    An error that does not survive pickling (or rebuilding: an exception
    whose ``__init__`` wants other arguments) travels as its text; child run
    requests that cannot travel fail the attempt (``child_run_invalid``).
    """
    outputs = [(o.id, thaw_json(o.fields), thaw_json(o.data)) for o in outcome.outputs]
    trace = None if outcome.error is None else format_traceback(outcome.error)
    message = (outcome.kind.value, outputs, outcome.error, outcome.wait_id, children, trace)
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
            failed: tuple[object, ...] = (
                OutcomeKind.ERROR.value,
                [],
                RuntimeError(text),
                None,
                {},
                None,
            )
            return _dumps(failed)
        error = outcome.error
        text = f"{type(error).__name__}: {error}"
        as_text: tuple[object, ...] = (
            outcome.kind.value,
            outputs,
            RuntimeError(text),
            outcome.wait_id,
            {},
            trace,
        )
        return _dumps(as_text)


STEP_REQUEST = b"S"
"""The first byte of a step request (a reply pickle starts with ``0x80``)."""


def answer_step_request(journal: AttemptJournal, data: bytes) -> bytes:
    """The worker's answer to a step request of its plugin process: it records
    the step through the attempt's own journal."""
    try:
        name, result = pickle.loads(data[len(STEP_REQUEST) :])
        recorder = journal.recorder
        if recorder is None:
            raise StepError("step_unsupported: this store records no steps", field="store")
        answer: tuple[str, object] = ("ok", thaw_json(recorder(name, result)))
    except BaseException as exc:
        answer = ("error", exc)
    try:
        reply = _dumps(answer)
        pickle.loads(reply)
        return reply
    except Exception:
        error = answer[1]
        text = f"{type(error).__name__}: {error}"
        return _dumps(("error", RuntimeError(text)))


def _pipe_recorder(conn: Connection) -> StepRecorder:
    """Records a step by asking the worker (one request at a time)."""
    lock = threading.Lock()

    def record(name: str, result: JsonValue) -> JsonValue:
        with lock:
            conn.send_bytes(STEP_REQUEST + _dumps((name, thaw_json(result))))
            kind, value = pickle.loads(conn.recv_bytes())
        if kind == "error":
            raise value
        recorded: JsonValue = value
        return recorded

    return record


def _run_job(data: bytes, abort: AbortSignal, conn: Connection) -> bytes:
    """Run one job in the plugin process; the reply for the worker."""
    stream = io.BytesIO(data)
    try:
        path, level = pickle.load(stream)
        if sys.path != path:
            sys.path[:] = path
        _TASK_LOGGING.follow(level)
        fn, wire_inputs, travelling = pickle.load(stream)
    except BaseException as exc:
        error = PluginTransferError(
            f"the plugin process cannot load the attempt: {type(exc).__name__}: {exc}"
        )
        return _reply_bytes(ExecutionOutcome(OutcomeKind.ERROR, error=error), {})
    ctx: TaskContext = dataclasses.replace(travelling, cancelled=abort)
    if ctx.journal.remote:
        ctx.journal.recorder = _pipe_recorder(conn)
    inputs = _inputs_from_wire(wire_inputs)

    def call() -> Any:
        result = fn(inputs, ctx)
        if inspect.isawaitable(result):
            return asyncio.run(as_coroutine(result))
        return result

    own_process = multiprocessing.parent_process() is not None
    captured = partial(run_in_plugin_process, ctx.task_log, conn.send_bytes, call)
    outcome = outcome_of_call(partial(captured, own_process=own_process), ctx.task_id)
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
        reply = contextvars.Context().run(_run_job, data, abort, conn)
        _restore_cwd(cwd)
        if os.environ != environ:
            os.environ.clear()
            os.environ.update(environ)
        try:
            conn.send_bytes(reply)
        except OSError:
            return


def _restore_cwd(cwd: str) -> None:
    try:
        moved = os.getcwd() != cwd
    except OSError:  # the plugin removed the directory it moved into
        moved = True
    if moved:
        os.chdir(cwd)


def _no_heartbeat() -> None:
    return None


def exit_text(exitcode: int | None) -> str:
    """The error of an attempt whose process died: its exit code or signal."""
    if exitcode is None:
        return "plugin process exited without a result"
    if exitcode < 0:
        try:
            name = Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"plugin process exited without a result (killed by {name})"
    return f"plugin process exited without a result (exit code {exitcode})"


def read_reply(data: bytes) -> tuple[ExecutionOutcome, dict[str, Any]]:
    """The worker's side of :func:`_reply_bytes`: the outcome and the child
    run requests of the attempt. Raises what unpickling raises."""
    kind, outputs, error, wait_id, children, trace = pickle.loads(data)
    outcome = ExecutionOutcome(
        OutcomeKind(kind),
        outputs=tuple(EmittedOutput(id=i, fields=f, data=d) for i, f, d in outputs),
        error=error,
        wait_id=wait_id,
        traceback=trace,
    )
    return outcome, children
