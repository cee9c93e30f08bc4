"""``SqliteStore``: the embedded default store, opened from a URL or a path."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from pathlib import Path
from types import TracebackType

from dagwerk.backends.sql.store import SqlStore
from dagwerk.limits import Limits
from dagwerk.store import InvalidStoreValueError, validate_seconds

from .gateway import SYNCHRONOUS_MODES, SqliteGateway
from .migrations import migrate

__all__ = ["SqliteStore", "sqlite_path"]

_PREFIX = "sqlite:///"


def sqlite_path(url: str | Path) -> tuple[str, bool]:
    """The database path of ``sqlite:///relative.db``, ``sqlite:////abs.db``,
    ``sqlite:///:memory:`` or a plain path, and whether the URL asks for a
    read-only store (``?mode=ro``)."""
    path, options = _parse_url(url)
    return path, options.get("mode") == "ro"


_URL_OPTIONS = {"mode": ("ro", "rw"), "synchronous": SYNCHRONOUS_MODES}
_URL_NUMBERS = ("busy_timeout",)

DEFAULT_BUSY_TIMEOUT = 30.0
"""Seconds a write waits for other writers by default."""

MAX_BUSY_TIMEOUT = 86_400.0
"""The longest busy timeout a store accepts (one day, in seconds)."""


def _busy_timeout(value: object, *, field: str, url: str | None = None) -> float:
    """``value`` (the text of a URL option when ``url`` is given) as a busy
    timeout: finite seconds from 0 to :data:`MAX_BUSY_TIMEOUT`; anything
    else is a typed error naming ``field`` and the limit."""
    if url is not None and isinstance(value, str):
        with suppress(ValueError):
            value = float(value)
    try:
        seconds = validate_seconds(value, "busy_timeout", positive=False)
    except InvalidStoreValueError:
        seconds = math.inf  # refused below, with the limit in the message
    if seconds > MAX_BUSY_TIMEOUT:
        where = f"store URL {url!r}: " if url is not None else ""
        raise InvalidStoreValueError(
            f"{where}busy_timeout must be a number of seconds from 0 to "
            f"{MAX_BUSY_TIMEOUT:g}, not {value!r}",
            field=field,
        )
    return seconds


def _parse_url(url: str | Path) -> tuple[str, dict[str, str]]:
    """Path and options of a store URL; options ``mode=ro|rw``,
    ``synchronous=normal|full|extra`` and ``busy_timeout=<seconds>``,
    joined with ``&``."""
    if isinstance(url, Path):
        return str(url), {}
    if not isinstance(url, str):
        raise InvalidStoreValueError("store URL must be a string or a Path", field="url")
    if url.startswith(_PREFIX):
        path, _, query = url[len(_PREFIX) :].partition("?")
        if not path:
            raise InvalidStoreValueError(f"store URL {url!r} names no database file", field="url")
        options: dict[str, str] = {}
        for item in query.split("&") if query else []:
            name, _, value = item.partition("=")
            known = value in _URL_OPTIONS.get(name, ()) or (name in _URL_NUMBERS and value)
            if not known or name in options:
                raise InvalidStoreValueError(
                    f"store URL {url!r}: unknown option {item!r}", field="url"
                )
            if name == "busy_timeout":
                _busy_timeout(value, field="url", url=url)
            options[name] = value
        return path, options
    if "://" in url:
        raise InvalidStoreValueError(f"{url!r} is not a sqlite:/// URL", field="url")
    return url, {}


class SqliteStore(SqlStore):
    """Every store protocol on one SQLite file (or ``:memory:``).

    Opening migrates the schema forward and refuses a schema newer than this
    dagwerk (``SchemaTooNewError``, code ``"schema_too_new"``) or a file that
    is not a dagwerk database (``StoreCorruptError``). WAL mode, ``BEGIN
    IMMEDIATE`` for every write, a busy timeout and foreign keys; several
    processes may share one file, each with its own ``SqliteStore``. Driver
    errors surface as :mod:`dagwerk.backends.errors` (``store_busy``,
    ``store_readonly``, ``store_full``, ``store_corrupt``).

    ``clock`` supplies the queue's time (leases, delays); ``max_deliveries``
    bounds leases per queue row; ``default_queue``/``default_priority`` are
    stamped on every run's queue rows. ``busy_timeout`` (seconds, or
    ``?busy_timeout=`` in the URL; default 30, at most one day) is how long a
    write waits for other writers before ``StoreBusyError``. ``read_only``
    (or ``?mode=ro`` in the URL) opens the file for reading only; every write
    then raises ``StoreReadOnlyError``. ``max_page_count`` caps the file's
    size in pages (a quota; writes beyond it raise ``StoreFullError``).

    ``synchronous`` (or ``?synchronous=`` in the URL) is SQLite's durability
    setting in WAL mode: ``"normal"`` (the default) survives any crash of a
    process or of the operating system's processes, but a power loss or
    kernel crash can lose the last commits (never corrupt the file);
    ``"full"`` (and ``"extra"``) also survive a power loss, at the cost of
    an fsync per commit (about 50x fewer commits per second on the
    benchmark machine). See docs/performance.md.
    """

    def __init__(
        self,
        url: str | Path,
        *,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
        max_deliveries: int = 3,
        default_queue: str = "default",
        default_priority: int = 0,
        busy_timeout: float | None = None,
        read_only: bool = False,
        max_page_count: int | None = None,
        synchronous: str | None = None,
    ) -> None:
        path, options = _parse_url(url)
        if synchronous is None:
            synchronous = options.get("synchronous", "normal")
        if busy_timeout is not None:
            busy_timeout = _busy_timeout(busy_timeout, field="busy_timeout")
        elif "busy_timeout" in options:
            busy_timeout = float(options["busy_timeout"])  # checked by _parse_url
        else:
            busy_timeout = DEFAULT_BUSY_TIMEOUT
        gateway = SqliteGateway(
            path,
            busy_timeout=busy_timeout,
            read_only=read_only or options.get("mode") == "ro",
            max_page_count=max_page_count,
            synchronous=synchronous,
        )
        try:
            migrate(gateway)
        except BaseException:
            gateway.close()
            raise
        super().__init__(
            gateway,
            limits=limits,
            clock=clock,
            max_deliveries=max_deliveries,
            default_queue=default_queue,
            default_priority=default_priority,
        )
        self._sqlite = gateway

    @property
    def path(self) -> str:
        return self._sqlite.path

    def unit_of_work(self, *, all_or_nothing: bool = False) -> AbstractContextManager[None]:
        """The calling thread's store calls inside the block share one write
        transaction (:class:`~dagwerk.store.UnitOfWorkStore`)."""
        return self._sqlite.unit(all_or_nothing=all_or_nothing)

    def wait_for_change(self, timeout: float) -> None:
        """Until another process may have committed to the file (or a commit
        of this process woke its waiting workers), at most ``timeout``
        seconds (:class:`~dagwerk.store_changes.ChangeWaitStore`)."""
        end = time.monotonic() + max(0.0, timeout)
        while (remaining := end - time.monotonic()) > 0:
            if self._sqlite.wait_for_work(remaining):
                return

    def close(self) -> None:
        """Close this process's connection; the store is unusable afterwards."""
        self._sqlite.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
