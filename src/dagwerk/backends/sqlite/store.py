"""``SqliteStore``: the embedded default store, opened from a URL or a path."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType

from dagwerk.backends.sql.store import SqlStore
from dagwerk.limits import Limits
from dagwerk.store import InvalidStoreValueError

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


def _parse_url(url: str | Path) -> tuple[str, dict[str, str]]:
    """Path and options of a store URL; options ``mode=ro|rw`` and
    ``synchronous=normal|full|extra``, joined with ``&``."""
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
            if value not in _URL_OPTIONS.get(name, ()) or name in options:
                raise InvalidStoreValueError(
                    f"store URL {url!r}: unknown option {item!r}", field="url"
                )
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
    stamped on every run's queue rows. ``busy_timeout`` (seconds) is how long
    a write waits for other writers before ``StoreBusyError``. ``read_only``
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
        busy_timeout: float = 30.0,
        read_only: bool = False,
        max_page_count: int | None = None,
        synchronous: str | None = None,
    ) -> None:
        path, options = _parse_url(url)
        if synchronous is None:
            synchronous = options.get("synchronous", "normal")
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
