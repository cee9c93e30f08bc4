"""Capturing what a plugin logs during an attempt, and writing it to the store.

Each attempt gets an :class:`AttemptLog` (``ctx.task_log``). While the
plugin runs, its thread (and every asyncio task it starts) carries that log
in a context variable; a log record factory, installed once per process,
hands each record created in that context to it: records of ``ctx.logger``
and of any stdlib logger, at the levels the logging configuration lets
through. ``ctx.logger`` is a :class:`TaskLogger`: its records from INFO up
are kept whatever the configuration lets through (one the configuration
drops is kept in the attempt's log only; no handler sees it). A process
that logs nothing pays nothing; a record logged outside an attempt costs
one context-variable look-up.

The :class:`AttemptLog` bounds the attempt's lines (:class:`TaskLogLimits`:
past the bound the rest is dropped and one final line says how much),
replaces the values of the attempt's resolved secrets with ``***`` and
passes each line to its sink. In the worker the sink is the worker's
:class:`TaskLogWriter`, which stores pending lines in batches: from a
background thread every :data:`FLUSH_SECONDS` (so ``dagwerk logs --follow``
sees lines of a running task), and once more before an attempt is settled
(so a terminal run's logs are complete). Never a commit per line.

In a plugin process (process executor) the attempt's log travels with the
context; :func:`run_in_plugin_process` captures the records and what the
plugin writes to ``sys.stdout``/``sys.stderr`` there and ships the lines to
the worker over the process's pipe as :func:`is_log_message` messages, every
:data:`FLUSH_SECONDS` and before the reply.
"""

from __future__ import annotations

import contextlib
import io
import logging
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TextIO, TypeVar

from dagwerk.errors import DagwerkError
from dagwerk.runtime.faults import FaultGate, log_failure
from dagwerk.store_logs import (
    DEFAULT_TASK_LOG_MAX_BYTES,
    DEFAULT_TASK_LOG_MAX_LINES,
    MAX_TASK_LOG_BATCH,
    TaskLogLine,
    TaskLogStore,
)

__all__ = [
    "DEFAULT_TASK_LOG_MAX_BYTES",
    "DEFAULT_TASK_LOG_MAX_LINES",
    "FLUSH_SECONDS",
    "KEPT_LEVEL",
    "AttemptLog",
    "LogEntry",
    "TaskLogLimits",
    "TaskLogWriter",
    "TaskLogger",
    "captured",
    "forward_log_message",
    "install_record_capture",
    "is_log_message",
    "mask_secrets",
    "run_in_plugin_process",
    "task_logger",
]

_LOG = logging.getLogger("dagwerk.runtime.task_logs")

FLUSH_SECONDS = 0.5
"""How long a captured line waits at most before it is written (or shipped)."""

MASK = "***"
"""What replaces a secret's value in a stored line."""

KEPT_LEVEL = logging.INFO
"""The level from which an attempt keeps ``ctx.logger``'s records, whatever
the logging configuration lets through."""

LogEntry = tuple[float, str, str, str, str | None]
"""One captured line: ``(at, level, logger, message, traceback)``."""

_LOG_MESSAGE = b"L"
"""The first byte of a log message on a plugin process's pipe (a reply is a
pickle, whose first byte is never this one)."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TaskLogLimits:
    """How much of one attempt's log is kept: ``max_bytes`` of messages and
    tracebacks (UTF-8) and ``max_lines`` lines. ``0`` for either keeps
    nothing: the worker then captures nothing at all."""

    max_bytes: int = DEFAULT_TASK_LOG_MAX_BYTES
    max_lines: int = DEFAULT_TASK_LOG_MAX_LINES

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_lines"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise DagwerkError(f"task_log_{name} must be an int >= 0", field=f"task_log_{name}")

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0 and self.max_lines > 0


def mask_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced by :data:`MASK` (give the
    longest first, so a secret that contains another is masked whole)."""
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, MASK)
    return text


class EntrySink(Protocol):
    """Where an :class:`AttemptLog` hands its kept lines."""

    def put(self, log: AttemptLog, entries: Sequence[LogEntry]) -> None: ...


class AttemptLog:
    """One attempt's captured lines: bounded, with secrets masked.

    Thread-safe. ``run_id``, ``task_id``, ``node_index`` and ``attempt``
    say whose lines they are. Pickled (into a plugin process), it keeps
    its limits and secrets and loses its identity, counts and sink: the
    process gives it a sink of its own.
    """

    __slots__ = (
        "_bytes",
        "_closed",
        "_dropped_bytes",
        "_dropped_lines",
        "_lines",
        "_lock",
        "_secrets",
        "attempt",
        "limits",
        "node_index",
        "run_id",
        "sink",
        "task_id",
    )

    def __init__(
        self,
        limits: TaskLogLimits,
        secrets: Iterable[str] = (),
        sink: EntrySink | None = None,
        *,
        run_id: str = "",
        task_id: str = "",
        node_index: int = 0,
        attempt: int = 1,
    ) -> None:
        self.limits = limits
        # Longest first, so a secret that contains another is masked whole.
        self._secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))
        self.sink = sink
        self.run_id = run_id
        self.task_id = task_id
        self.node_index = node_index
        self.attempt = attempt
        self._lock = threading.Lock()
        self._lines = 0
        self._bytes = 0
        self._dropped_lines = 0
        self._dropped_bytes = 0
        self._closed = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (AttemptLog, (self.limits, self._secrets))

    def _mask(self, text: str) -> str:
        return mask_secrets(text, self._secrets)

    def record(self, record: logging.LogRecord) -> None:
        """Keep a log record: its time, level, logger, message and traceback."""
        try:
            message = record.getMessage()
        except Exception:  # bad format arguments: logging reports them itself later
            message = str(record.msg)
        details: list[str] = []
        if record.exc_info and record.exc_info[0] is not None:
            details.append("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
        elif record.exc_text:
            details.append(record.exc_text)
        if record.stack_info:
            details.append(record.stack_info)
        self.add(
            record.created,
            record.levelname,
            record.name,
            message,
            "\n".join(details) if details else None,
        )

    def add(
        self, at: float, level: str, logger: str, message: str, trace: str | None = None
    ) -> None:
        """Keep one line, unless the attempt's bound is reached (it is then
        counted as dropped, as is every later line)."""
        if self._secrets:
            message = self._mask(message)
            trace = None if trace is None else self._mask(trace)
        size = len(message.encode("utf-8", "replace"))
        if trace is not None:
            size += len(trace.encode("utf-8", "replace"))
        limits = self.limits
        with self._lock:
            if self._closed:
                return
            if (
                self._dropped_lines
                or self._lines >= limits.max_lines
                or self._bytes + size > limits.max_bytes
            ):
                self._dropped_lines += 1
                self._dropped_bytes += size
                return
            self._lines += 1
            self._bytes += size
        sink = self.sink
        if sink is not None:
            sink.put(self, ((at, level, logger, message, trace),))

    def forward(self, entries: Sequence[LogEntry]) -> None:
        """Hand on lines another process kept (bounded and masked there)."""
        sink = self.sink
        if sink is not None and entries:
            sink.put(self, entries)

    def close(self) -> None:
        """The attempt's plugin is over: later lines are ignored; if lines
        were dropped, one final line says how many."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            dropped, dropped_bytes = self._dropped_lines, self._dropped_bytes
        if dropped and self.sink is not None:
            limits = self.limits
            notice = (
                f"{dropped} more lines ({dropped_bytes} bytes) were dropped: an attempt keeps "
                f"at most {limits.max_lines} lines and {limits.max_bytes} bytes"
            )
            self.sink.put(self, ((time.time(), "WARNING", "dagwerk.task_logs", notice, None),))


# --- capture ---------------------------------------------------------------------------

_CURRENT: ContextVar[AttemptLog | None] = ContextVar("dagwerk_task_log", default=None)
_INSTALL_LOCK = threading.Lock()
_installed = False


def install_record_capture() -> None:
    """Install the log record factory that feeds the current attempt's log
    (once per process; the factory found installed keeps making records)."""
    global _installed
    with _INSTALL_LOCK:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            log = _CURRENT.get()
            if log is not None:
                # Capturing never breaks the plugin's logging.
                with contextlib.suppress(Exception):
                    log.record(record)
            return record

        logging.setLogRecordFactory(factory)
        _installed = True


def captured(log: AttemptLog | None, call: Callable[[], T]) -> Callable[[], T]:
    """``call``, run with ``log`` as the current attempt's log (then closed);
    ``call`` itself when there is no log."""
    if log is None:
        return call

    def run() -> T:
        token = _CURRENT.set(log)
        try:
            return call()
        finally:
            _CURRENT.reset(token)
            log.close()

    return run


class TaskLogger(logging.LoggerAdapter[logging.Logger]):
    """A plugin's ``ctx.logger``: its logger as the application configured
    it, and during an attempt every record from :data:`KEPT_LEVEL` up is
    kept in the attempt's log. A record the configuration lets through is
    made and handled as the logger's own (the record factory keeps it); one
    it drops is made for the attempt's log only, and no handler sees it."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return msg, kwargs

    def isEnabledFor(self, level: int) -> bool:
        if self.logger.isEnabledFor(level):
            return True
        return level >= KEPT_LEVEL and _CURRENT.get() is not None

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if self.logger.isEnabledFor(level):
            # One frame more than the stdlib's adapter: the caller's file and
            # line are the plugin's, not this method's.
            kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
            self.logger.log(level, msg, *args, **kwargs)
            return
        log = _CURRENT.get()
        if log is None or not isinstance(level, int) or level < KEPT_LEVEL:
            return
        # Capturing never breaks the plugin's logging.
        with contextlib.suppress(Exception):
            log.record(self._record(level, msg, args, **kwargs))

    def _record(
        self,
        level: int,
        msg: object,
        args: tuple[object, ...],
        *,
        exc_info: Any = None,
        stack_info: bool = False,
        stacklevel: int = 1,
        extra: Mapping[str, object] | None = None,
    ) -> logging.LogRecord:
        """A record no handler sees: what the attempt's log keeps of it."""
        if exc_info:
            if isinstance(exc_info, BaseException):
                exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
            elif not isinstance(exc_info, tuple):
                exc_info = sys.exc_info()
        sinfo = None
        if stack_info:
            # Without this method's and _record's frames.
            stack = traceback.format_stack(sys._getframe(2))
            sinfo = "Stack (most recent call last):\n" + "".join(stack).rstrip("\n")
        return logging.LogRecord(self.logger.name, level, "", 0, msg, args, exc_info, None, sinfo)


_TASK_LOGGERS: dict[str, TaskLogger] = {}


def task_logger(plugin: str) -> TaskLogger:
    """The :class:`TaskLogger` over ``dagwerk.task.<plugin>``."""
    found = _TASK_LOGGERS.get(plugin)
    if found is None:
        logger = TaskLogger(logging.getLogger(f"dagwerk.task.{plugin}"))
        found = _TASK_LOGGERS.setdefault(plugin, logger)
    return found


# --- the worker's writer ------------------------------------------------------------


class TaskLogWriter:
    """The worker's sink: pending lines, stored in batches (see the module).

    Without a store (one that is no ``TaskLogStore``) or with limits that
    keep nothing, :meth:`open` returns ``None`` and nothing is captured.
    """

    def __init__(
        self,
        store: TaskLogStore | None,
        limits: TaskLogLimits | None = None,
        *,
        interval: float = FLUSH_SECONDS,
        faults: FaultGate | None = None,
    ) -> None:
        self._faults = faults
        self.limits = limits or TaskLogLimits()
        self._store = store if self.limits.enabled else None
        self._interval = interval
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending: list[TaskLogLine] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        if self._store is not None:
            install_record_capture()

    def open(
        self,
        *,
        run_id: str,
        task_id: str,
        node_index: int,
        attempt: int,
        secrets: Mapping[str, str],
    ) -> AttemptLog | None:
        """The log of a starting attempt, or ``None`` when nothing is captured."""
        if self._store is None:
            return None
        return AttemptLog(
            self.limits,
            secrets.values(),
            self,
            run_id=run_id,
            task_id=task_id,
            node_index=node_index,
            attempt=attempt,
        )

    def put(self, log: AttemptLog, entries: Sequence[LogEntry]) -> None:
        lines = [
            TaskLogLine(
                run_id=log.run_id,
                task_id=log.task_id,
                node_index=log.node_index,
                attempt=log.attempt,
                at=at,
                level=level,
                logger=logger,
                message=message,
                traceback=trace,
            )
            for at, level, logger, message, trace in entries
        ]
        with self._lock:
            if self._closed:
                return  # a plugin still running after its worker stopped
            self._pending.extend(lines)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="dagwerk-task-logs", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def flush(self) -> None:
        """Store every pending line now (one transaction per
        :data:`~dagwerk.store.MAX_TASK_LOG_BATCH` lines). A store error is
        logged and the lines are dropped: logs never fail an attempt."""
        if not self._pending:
            return
        with self._flush_lock:
            with self._lock:
                pending, self._pending = self._pending, []
            store = self._store
            if store is None or not pending:
                return
            for start in range(0, len(pending), MAX_TASK_LOG_BATCH):
                try:
                    store.append_task_logs(pending[start : start + MAX_TASK_LOG_BATCH])
                except Exception as exc:
                    log_failure(self._faults, _LOG, exc, f"storing {len(pending)} task log lines")

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            # Lines that arrive within the interval share one transaction.
            self._stop.wait(self._interval)
            self._wake.clear()
            self.flush()

    def close(self) -> None:
        """Store what is pending and stop the background thread; later
        lines are ignored. Idempotent."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._stop.set()
        self._wake.set()
        if thread is not None:
            thread.join()
        self.flush()


# --- in a plugin process -------------------------------------------------------------


def is_log_message(data: bytes) -> bool:
    """Whether a message from a plugin process carries log lines (not the reply)."""
    return data[:1] == _LOG_MESSAGE


def forward_log_message(log: AttemptLog | None, data: bytes) -> None:
    """Hand the lines of a log message to the attempt's log in the worker."""
    if log is None:
        return
    try:
        entries = pickle.loads(data[1:])
    except Exception:
        _LOG.exception("a plugin process sent an unreadable log message")
        return
    log.forward(entries)


class _Shipper:
    """A plugin process's sink: ships pending lines to the worker in one
    message every :data:`FLUSH_SECONDS` (a thread started on the first line)
    and when the attempt ends."""

    def __init__(self, send: Callable[[bytes], None], interval: float) -> None:
        self._send = send
        self._interval = interval
        self._lock = threading.Lock()
        self._pending: list[LogEntry] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def put(self, log: AttemptLog, entries: Sequence[LogEntry]) -> None:
        with self._lock:
            self._pending.extend(entries)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._loop, name="dagwerk-task-log-shipper", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _ship(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            # An OSError: the worker is gone, and the reply cannot be sent either.
            with contextlib.suppress(OSError):
                self._send(_LOG_MESSAGE + pickle.dumps(pending, protocol=pickle.HIGHEST_PROTOCOL))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            if self._stop.wait(self._interval):
                return
            self._wake.clear()
            self._ship()

    def close(self) -> None:
        """Stop the thread, then ship what is left (before the reply)."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()
        self._ship()


class _LineStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of a plugin process during an attempt:
    each complete line is kept in the attempt's log; everything is written
    through to the stream it replaces too."""

    def __init__(self, log: AttemptLog, through: TextIO, name: str, level: str) -> None:
        super().__init__()
        self._log = log
        self._through = through
        self._name = name
        self._level = level
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with contextlib.suppress(Exception):
            self._through.write(text)
        data = self._partial + text
        *lines, self._partial = data.split("\n")
        for line in lines:
            self._log.add(time.time(), self._level, self._name, line.rstrip("\r"))
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            self._through.flush()

    def finish(self) -> None:
        if self._partial:
            self._log.add(time.time(), self._level, self._name, self._partial)
            self._partial = ""


def run_in_plugin_process(
    log: AttemptLog | None,
    send: Callable[[bytes], None],
    call: Callable[[], T],
    *,
    own_process: bool,
) -> T:
    """Run ``call`` in a plugin process with the attempt's log capturing its
    records, and (in a process of its own, ``own_process``) what it writes to
    ``sys.stdout`` and ``sys.stderr``; the lines go to the worker through
    ``send``, the last of them before this returns."""
    if log is None:
        return call()
    install_record_capture()
    shipper = _Shipper(send, FLUSH_SECONDS)
    log.sink = shipper
    streams: list[_LineStream] = []
    saved = sys.stdout, sys.stderr, logging.lastResort
    if own_process:
        out = _LineStream(log, sys.stdout, "stdout", "INFO")
        err = _LineStream(log, sys.stderr, "stderr", "WARNING")
        streams = [out, err]
        # logging's last resort writes to whatever sys.stderr is: a record
        # it prints is kept once, as a record, not again as stderr text.
        last_resort = logging.StreamHandler(sys.stderr)
        last_resort.setLevel(logging.WARNING)
        logging.lastResort = last_resort
        sys.stdout, sys.stderr = out, err
    try:
        return captured(log, _finishing(call, streams))()
    finally:
        if own_process:
            sys.stdout, sys.stderr, logging.lastResort = saved
        shipper.close()


def _finishing(call: Callable[[], T], streams: list[_LineStream]) -> Callable[[], T]:
    def run() -> T:
        try:
            return call()
        finally:
            for stream in streams:
                stream.finish()

    return run
