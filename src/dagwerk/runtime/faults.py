"""The worker's fault gate: store faults classified, waited out, said once.

A store error (:class:`~dagwerk.backends.errors.StoreUnavailableError`
and its subclasses, by ``code``) is either

- **transient**: the disk is full, the database is busy or read-only (a
  file or directory that may become writable again), the server does not
  answer. The worker pauses with a capped exponential backoff
  (:data:`BACKOFF_MIN` doubling up to :data:`BACKOFF_MAX`), claims no new
  work while writes fail, keeps the settlements it could not commit
  (:meth:`FaultGate.park`) and commits them first when the store answers
  again; the first step without a store error clears the fault.
- **fatal**: the database cannot be opened (permission denied, no such
  directory), its schema is newer than this dagwerk, it is damaged, or
  its file was removed (or replaced) while the worker had it open.
  The worker's loop ends; :attr:`FaultGate.fatal` holds the error.

Each fault is logged as one line (what failed, the path or server, the
likely cause and what to do); repeats of the same fault at most once per
``log_interval`` with a count; the clearing once. The traceback is added
only when the gate's logger (``dagwerk.runtime.faults``) is enabled for
DEBUG, as ``dagwerk --debug`` sets it. :meth:`FaultGate.wait_out` waits
out a transient fault of a single call the same way (opening the store).
Nothing here knows a driver: it reads codes only.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from dagwerk.backends.errors import StoreUnavailableError
from dagwerk.errors import DagwerkError
from dagwerk.runtime.clock import Clock, SystemClock

__all__ = [
    "BACKOFF_MAX",
    "BACKOFF_MIN",
    "FATAL_CODES",
    "Fault",
    "FaultGate",
    "FaultKind",
    "FaultLastedError",
    "classify",
    "describe_fault",
    "log_failure",
]

_LOG = logging.getLogger("dagwerk.runtime.faults")

T = TypeVar("T")

BACKOFF_MIN = 0.1
"""Seconds the worker pauses after the first failure of a fault."""
BACKOFF_MAX = 5.0
"""The cap of the doubling pause while a fault lasts."""
LOG_INTERVAL = 30.0
"""Seconds between two log lines of the same lasting fault."""

FATAL_CODES = frozenset({"store_cannot_open", "schema_too_new", "store_corrupt", "store_gone"})
"""Store error codes that waiting does not cure: the worker stops."""

_ADVICE = {
    "store_full": "free space and the run continues",
    "store_readonly": (
        "make the database file, its -wal and -shm files and its directory "
        "writable again and the run continues"
    ),
    "store_busy": "another process holds the database's write lock; the run continues after it",
    "store_unavailable": "the run continues once the database answers again",
    "store_cannot_open": "fix the path or its permissions and start again",
    "schema_too_new": "upgrade dagwerk, or point --db at a database of this version",
    "store_corrupt": "restore the database from a backup, or point --db at a dagwerk database",
    "store_gone": (
        "nothing this process writes reaches the database any more; put the database "
        "back at its path (or point --db at where it is now) and start again"
    ),
}


class FaultKind(StrEnum):
    TRANSIENT = "transient"
    FATAL = "fatal"


def classify(error: BaseException) -> FaultKind | None:
    """Whether ``error`` is a store fault, and which kind; ``None``: it is not."""
    if not isinstance(error, StoreUnavailableError):
        return None
    return FaultKind.FATAL if error.code in FATAL_CODES else FaultKind.TRANSIENT


def _free_space(path: str) -> str:
    """`` (N bytes free on MOUNT)`` for a local file's filesystem, else ``""``."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return ""
    mount = directory
    while not os.path.ismount(mount) and mount != os.path.dirname(mount):
        mount = os.path.dirname(mount)
    return f" ({free} bytes free on {mount})"


def describe_fault(error: StoreUnavailableError) -> str:
    """The one line for a store fault: what failed, where, and what to do."""
    text = str(error)
    target = error.target
    if target:
        if target not in text:
            text = f"{text}: {target}"
        if error.code == "store_full" and os.path.isabs(target):
            text += _free_space(target)
    if error.advice:
        return text  # the backend's own advice ends the message
    advice = _ADVICE.get(error.code)
    return f"{text}; {advice}" if advice else text


def log_failure(
    faults: FaultGate | None, logger: logging.Logger, error: BaseException, what: str
) -> None:
    """``what`` failed with ``error``: a store fault is the gate's to say (one
    line, repeats throttled); any other error is logged with its traceback."""
    if faults is None or not faults.note(error, what):
        logger.error("%s failed", what, exc_info=error)


@dataclass(frozen=True, slots=True)
class Fault:
    """A store fault as it stands: its ``code`` and ``kind``, the one
    ``line`` that describes it, when it began (``since``, the clock's
    wall time) and how many times it failed an operation."""

    code: str
    kind: FaultKind
    line: str
    since: float
    failures: int

    def lasted(self, now: float) -> float:
        return max(0.0, now - self.since)


class FaultLastedError(DagwerkError):
    """A store fault lasted longer than the caller would wait (``limit`` seconds)."""

    code = "store_fault_lasted"


@dataclass(slots=True)
class _Parked:
    what: str
    retry: Callable[[], None]
    on_error: Callable[[Exception], None]


class FaultGate:
    """The fault state of one worker: backoff, log throttle, parked settlements.

    :meth:`note` is told of every error a store call raised; after each
    step the worker's loop asks :meth:`pause` how long to wait before the
    next (0 without a fault; a step that noted no fault clears it).
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        logger: logging.Logger = _LOG,
        backoff_min: float = BACKOFF_MIN,
        backoff_max: float = BACKOFF_MAX,
        log_interval: float = LOG_INTERVAL,
    ) -> None:
        self._clock = clock or SystemClock()
        self._log = logger
        self.report_fatal = True
        """Log a fatal fault (its owner may say it instead, as the CLI does)."""
        self._backoff_min, self._backoff_max = backoff_min, backoff_max
        self._log_interval = log_interval
        self._lock = threading.Lock()
        self._current: Fault | None = None
        self._fatal: StoreUnavailableError | None = None
        self._noted = False  # a fault was noted since the last pause()
        self._backoff = backoff_min
        self._logged_at = float("-inf")
        self._unlogged = 0  # failures since the last line
        self._parked: list[_Parked] = []

    def now(self) -> float:
        """The gate's clock time (what :attr:`Fault.since` is measured on)."""
        return self._clock.time()

    # --- state -----------------------------------------------------------------------

    @property
    def current(self) -> Fault | None:
        """The fault that lasts now (transient or fatal), or ``None``."""
        return self._current

    @property
    def fatal(self) -> StoreUnavailableError | None:
        """The fatal store error that ended the worker's loop, or ``None``."""
        return self._fatal

    @property
    def parked(self) -> int:
        """How many settlements wait for the store to answer again."""
        with self._lock:
            return len(self._parked)

    # --- being told ------------------------------------------------------------------

    def note(self, error: BaseException, what: str) -> bool:
        """Record that ``what`` failed with ``error``; whether it is a store
        fault (if not, the caller handles the error as it would otherwise)."""
        kind = classify(error)
        if kind is None:
            return False
        assert isinstance(error, StoreUnavailableError)
        line = describe_fault(error)
        now = self._clock.time()
        with self._lock:
            self._noted = True
            previous = self._current
            same = previous is not None and previous.code == error.code
            self._current = Fault(
                error.code,
                kind,
                line,
                previous.since if same and previous is not None else now,
                (previous.failures if same and previous is not None else 0) + 1,
            )
            if kind is FaultKind.FATAL:
                self._fatal = error
                say = self.report_fatal
                repeats = 0
            elif not same or now - self._logged_at >= self._log_interval:
                say, repeats = True, self._unlogged
                self._logged_at, self._unlogged = now, 0
            else:
                say, repeats = False, 0
                self._unlogged += 1
        if say:
            exc_info = error if self._log.isEnabledFor(logging.DEBUG) else None
            if kind is FaultKind.FATAL:
                self._log.error("%s failed: %s; the worker stops", what, line, exc_info=exc_info)
            elif repeats:
                self._log.warning(
                    "%s failed: %s (%d more failures since the last report)",
                    what,
                    line,
                    repeats,
                    exc_info=exc_info,
                )
            else:
                self._log.warning(
                    "%s failed: %s; the worker pauses and retries", what, line, exc_info=exc_info
                )
        return True

    def pause(self) -> float:
        """Seconds to wait before the next step: the backoff (doubling, capped)
        when the step just ended noted a transient fault; else 0, and a fault
        that lasted is cleared (logged once)."""
        with self._lock:
            if self._fatal is not None:
                return 0.0
            if self._noted:
                self._noted = False
                pause, self._backoff = self._backoff, min(self._backoff * 2, self._backoff_max)
                return pause
            cleared, self._current = self._current, None
            self._backoff = self._backoff_min
            self._logged_at, self._unlogged = float("-inf"), 0
        if cleared is not None:
            lasted = cleared.lasted(self._clock.time())
            self._log.warning(
                "the store answers again after %.0fs (%d failures); the worker resumes",
                lasted,
                cleared.failures,
            )
        return 0.0

    def check_lasted(self, limit: float | None) -> None:
        """Raise :class:`FaultLastedError` when the current fault lasted
        ``limit`` seconds (``None``: no limit)."""
        fault = self._current
        if fault is None or limit is None:
            return
        lasted = fault.lasted(self.now())
        if lasted >= limit:
            raise FaultLastedError(
                f"{fault.line} (the fault lasted {lasted:.0f}s, at most {limit:g}s allowed)",
                field="fail_on_fault",
                limit=math.ceil(limit),
            )

    def wait_out(
        self,
        call: Callable[[], T],
        what: str,
        *,
        limit: float | None = None,
        stop: threading.Event | None = None,
    ) -> T:
        """``call()``, called again after each transient store fault it
        raises (noted here: one line, the capped backoff) until it answers.
        A fatal fault or any other error is raised as it is; a fault that
        lasted ``limit`` seconds raises :class:`FaultLastedError`; ``stop``
        set ends the wait early by raising the fault itself."""
        stop = stop or threading.Event()
        while True:
            try:
                answer = call()
            except Exception as exc:
                if classify(exc) is not FaultKind.TRANSIENT:
                    raise
                self.note(exc, what)
                self.check_lasted(limit)
                pause = self.pause()
                fault = self._current
                if limit is not None and fault is not None:
                    # The last attempt comes when the limit is reached.
                    pause = min(pause, max(0.0, limit - fault.lasted(self.now())))
                if self._clock.wait(stop, pause):
                    raise
                continue
            self.pause()  # the clearing, said once
            return answer

    # --- settlements that could not commit -------------------------------------------

    def park(
        self, what: str, retry: Callable[[], None], on_error: Callable[[Exception], None]
    ) -> None:
        """Keep ``retry`` (a settlement whose commit failed with a transient
        fault) for :meth:`retry_parked`; ``on_error`` handles any other error
        it raises then."""
        with self._lock:
            self._parked.append(_Parked(what, retry, on_error))

    def hold(
        self,
        error: BaseException,
        what: str,
        retry: Callable[[], None],
        on_error: Callable[[Exception], None],
    ) -> bool:
        """:meth:`note` ``error``; when it is a transient fault, :meth:`park`
        ``retry`` and answer True (the caller gives nothing back: its
        delivery stays leased). False otherwise."""
        if classify(error) is not FaultKind.TRANSIENT:
            return False
        self.note(error, what)
        self.park(what, retry, on_error)
        return True

    def retry_parked(self) -> bool:
        """Commit the parked settlements, oldest first; whether none is left.
        The first that fails with a store fault stays parked (with those
        after it) and ends the round: the store is still at fault."""
        while True:
            with self._lock:
                if not self._parked:
                    return True
                parked = self._parked.pop(0)
            try:
                parked.retry()
            except Exception as exc:
                if classify(exc) is FaultKind.TRANSIENT:
                    self.note(exc, parked.what)
                    with self._lock:
                        self._parked.insert(0, parked)
                    return False
                if not self.note(exc, parked.what):
                    parked.on_error(exc)
