"""``PostgresStore``: one PostgreSQL server shared by workers on many machines."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from urllib.parse import unquote, urlsplit

import psycopg

from dagwerk.backends.errors import StoreUnavailableError
from dagwerk.backends.sql.store import SqlStore
from dagwerk.limits import Limits
from dagwerk.store import InvalidStoreValueError

from .errors import translate_error
from .gateway import PostgresGateway
from .migrations import migrate

__all__ = ["DEFAULT_RECONNECT_TIMEOUT", "PostgresStore", "postgres_url", "split_schema"]

DEFAULT_RECONNECT_TIMEOUT = 30.0
"""Seconds a call waits for a server that refuses or does not answer."""

_SCHEMES = ("postgresql", "postgres")
# Schema names are spliced into DDL and connection options, so only plain
# lower-case identifiers are accepted.
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def postgres_url(url: object) -> str:
    """``url`` if it is a ``postgresql://`` (or ``postgres://``) URL."""
    if not isinstance(url, str):
        raise InvalidStoreValueError("store URL must be a string", field="url")
    if urlsplit(url).scheme not in _SCHEMES:
        raise InvalidStoreValueError(f"{url!r} is not a postgresql:// URL", field="url")
    if "\x00" in url:
        raise InvalidStoreValueError("store URL contains a NUL character", field="url")
    return url


def split_schema(url: str) -> tuple[str, str | None]:
    """``url`` without its ``schema=NAME`` query parameter, and ``NAME``
    (None if there is none). libpq refuses query parameters it does not
    know, so dagwerk's own ones are taken out before the driver sees the
    URL; the other parameters are kept byte for byte."""
    return _take_param(url, "schema")


def _take_param(url: str, name: str) -> tuple[str, str | None]:
    """``url`` without its query parameter ``name``, and that parameter's value."""
    base, mark, query = url.partition("?")
    if not mark:
        return url, None
    kept: list[str] = []
    value: str | None = None
    for part in query.split("&"):
        key, _, given = part.partition("=")
        if unquote(key) == name:
            value = unquote(given)
        else:
            kept.append(part)
    if value is None:
        return url, None
    return (f"{base}?{'&'.join(kept)}" if kept else base), value


def _seconds(value: object, field: str) -> float:
    """``value`` as a number of seconds > 0 and at most a day, else
    :class:`InvalidStoreValueError` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86400:
        raise InvalidStoreValueError(
            f"{field} must be a number of seconds > 0 and at most 86400 (a day)",
            field=field,
            limit=86400,
        )
    return float(value)


def _reconnect_timeout(given: float | None, in_url: str | None) -> float:
    """The reconnect timeout of the keyword or of ``?reconnect_timeout=``."""
    if in_url is not None:
        try:
            parsed = float(in_url)
        except ValueError:
            parsed = -1.0
        if given is not None and given != parsed:
            raise InvalidStoreValueError(
                f"reconnect_timeout {given} and the URL's ?reconnect_timeout={in_url} differ; "
                "give one",
                field="reconnect_timeout",
            )
        given = parsed
    return _seconds(DEFAULT_RECONNECT_TIMEOUT if given is None else given, "reconnect_timeout")


class PostgresStore(SqlStore):
    """Every store protocol and the durable queue on one PostgreSQL server.

    Opened from ``postgresql://user:pass@host:port/db``. Opening migrates the
    schema forward (serialised across processes by an advisory lock) and
    refuses a schema newer than this dagwerk (``SchemaTooNewError``, code
    ``"schema_too_new"``). Every transition is one READ COMMITTED transaction
    that first locks its run's row, so transitions of one run are serialised
    while different runs proceed in parallel; batch claims share the row
    with each other and with completions (the lock modes are described in
    ``queries.sql``); ``dequeue`` leases rows with
    ``FOR UPDATE SKIP LOCKED``, so workers never wait for each other there.
    Reads are REPEATABLE READ snapshots. Driver errors surface as
    :mod:`dagwerk.backends.errors`; text with a NUL character or an integer
    outside 64 bits raises :class:`~dagwerk.store.InvalidStoreValueError`
    (:class:`~dagwerk.store.OutputPublicationError` inside outputs) before
    anything is written.

    ``schema`` (or ``?schema=NAME`` in the URL) puts every table in that
    PostgreSQL schema (created if missing; default: the connection's current
    schema, usually ``public``).
    ``pool_size`` bounds this process's connections; ``reconnect_timeout``
    (or ``?reconnect_timeout=SECONDS`` in the URL; default 30 s, at most a
    day) is how long a call (and opening) waits for a server that refuses
    or times out (a restart, say) before ``StoreUnavailableError`` naming
    the server and the cause; a server that rejects the connection (unknown
    database or role, wrong password) and an unknown host fail at once
    with ``StoreCannotOpenError``. ``open_timeout`` (default: the reconnect
    timeout) bounds that wait for the first connection, which opening makes:
    ``dagwerk worker`` opens with 1 s and waits out a longer outage in its
    fault gate, which says so at once.
    ``application_name`` labels the connections in ``pg_stat_activity``.
    ``clock``, ``max_deliveries``, ``default_queue`` and ``default_priority``
    are as for
    :class:`~dagwerk.backends.sqlite.SqliteStore`.
    """

    def __init__(
        self,
        url: str,
        *,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.time,
        max_deliveries: int = 3,
        default_queue: str = "default",
        default_priority: int = 0,
        pool_size: int = 4,
        schema: str | None = None,
        reconnect_timeout: float | None = None,
        open_timeout: float | None = None,
        application_name: str = "dagwerk",
    ) -> None:
        url, timeout_in_url = _take_param(postgres_url(url), "reconnect_timeout")
        reconnect_timeout = _reconnect_timeout(reconnect_timeout, timeout_in_url)
        url, in_url = split_schema(url)
        if in_url is not None:
            if schema is not None and schema != in_url:
                raise InvalidStoreValueError(
                    f"schema {schema!r} and the URL's ?schema={in_url} differ; give one",
                    field="schema",
                )
            schema = in_url
        if schema is not None and (not isinstance(schema, str) or not _SCHEMA.match(schema)):
            raise InvalidStoreValueError(
                "schema must be a lower-case identifier of at most 63 characters", field="schema"
            )
        if type(pool_size) is not int or pool_size < 1:
            raise InvalidStoreValueError("pool_size must be an int >= 1", field="pool_size")
        gateway = PostgresGateway(
            url,
            schema=schema,
            pool_size=pool_size,
            reconnect_timeout=reconnect_timeout,
            open_timeout=None if open_timeout is None else _seconds(open_timeout, "open_timeout"),
            application_name=application_name,
        )
        try:
            self.schema = schema if schema is not None else _current_schema(gateway)
            gateway.notify_payload = self.schema
            migrate(gateway, self.schema)
            super().__init__(
                gateway,
                limits=limits,
                clock=clock,
                max_deliveries=max_deliveries,
                default_queue=default_queue,
                default_priority=default_priority,
            )
        except BaseException:
            gateway.close()
            raise
        self._pg = gateway

    # -- one run's calls in one transaction ---------------------------------------------

    @contextmanager
    def run_unit(self) -> Iterator[None]:
        """The calling thread's store calls inside the block share one write
        transaction, which holds the run of its first locking call
        exclusively (:class:`~dagwerk.store_run_units.RunUnitStore`). The
        tasks its launches claimed for the thread's next claim are
        forgotten if it rolls back."""
        try:
            with self._pg.unit():
                yield
        except BaseException:
            self.forget_claimed_ahead()
            raise

    # -- waking idle workers ------------------------------------------------------------

    def wait_for_work(self, timeout: float) -> bool:
        """Block until queue work may have become available, at most ``timeout``
        seconds; True if woken by a notification (``dequeue(wait_seconds=...)``
        does this between attempts). See :meth:`PostgresGateway.wait_for_work`."""
        return self._pg.wait_for_work(timeout)

    def wait_for_change(self, timeout: float) -> None:
        """Until a run of this schema may have ended, at most ``timeout``
        seconds (:class:`~dagwerk.store_changes.ChangeWaitStore`; ``LISTEN``
        on its own connection, which the first call opens)."""
        end = time.monotonic() + max(0.0, timeout)
        while (remaining := end - time.monotonic()) > 0:
            if self._pg.wait_for_run_end(remaining):
                return

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Close this process's connections; the store is unusable afterwards."""
        self._pg.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _current_schema(gateway: PostgresGateway) -> str:
    conn = gateway.connect()
    try:
        row = conn.execute("SELECT current_schema() AS schema").fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, "cannot read the current schema") from exc
    finally:
        conn.close()
    if row is None or row["schema"] is None:
        raise StoreUnavailableError(
            "the connection's search_path names no existing schema; add ?schema=NAME "
            "to the URL (created if missing)"
        )
    schema: str = row["schema"]
    return schema
