"""Driver errors of psycopg translated to :mod:`dagwerk.backends.errors`, and
the checks that keep values PostgreSQL cannot store away from the driver."""

from __future__ import annotations

import re
from collections.abc import Mapping

import psycopg
from psycopg.conninfo import conninfo_to_dict

from dagwerk.backends.errors import (
    StoreBusyError,
    StoreCannotOpenError,
    StoreCorruptError,
    StoreFullError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from dagwerk.errors import DagwerkError
from dagwerk.store import InvalidStoreValueError, OutputPublicationError, StoreContractError

__all__ = [
    "check_params",
    "connect_error",
    "connect_failure",
    "is_connection_error",
    "lost_connection_error",
    "server_address",
    "server_may_come_back",
    "translate_error",
]

_INT64 = range(-(2**63), 2**63)
# The JSON escape of U+0000: "\u0000" after an even number of backslashes.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# Statements whose text comes from a plugin's outputs: a value PostgreSQL
# cannot hold is a publication error there, so a completion fails the task
# instead of the worker.
_PUBLICATION = frozenset({"output_insert", "outputs_reserved"})
# Server states that mean "this connection is gone" (admin shutdown, crash
# shutdown, cannot connect now) besides the whole 08 class.
_CONNECTION_STATES = frozenset({"57P01", "57P02", "57P03"})
# What libpq says when a connection could not be made *yet*: nothing listens
# on the port (a server restarting), the attempt timed out, the network
# dropped it, or the server is starting, stopping or full. Any other failure
# to connect (an unknown host, database or role, a wrong password, a bad
# option in the URL) stays the same however long one waits. libpq sets no
# SQLSTATE on a failed connection, so its text is all there is.
_STARTING_TEXT = (
    r"the database system is (?:starting up|shutting down|in recovery mode|not yet accepting)"
)
_FULL_TEXT = (
    r"too many clients already|remaining connection slots are reserved"
    r"|too many connections for (?:role|database)"
)
_COMES_BACK = re.compile(
    r"Connection refused|timeout expired|timed out|Connection reset|No route to host"
    r"|Network is unreachable|server closed the connection unexpectedly"
    r"|Temporary failure in name resolution|could not receive data from server"
    rf"|{_STARTING_TEXT}|{_FULL_TEXT}",
    re.IGNORECASE,
)
_REFUSED = re.compile(r"Connection refused", re.IGNORECASE)
_STARTING = re.compile(_STARTING_TEXT, re.IGNORECASE)
_FULL = re.compile(_FULL_TEXT, re.IGNORECASE)
_LOGIN = re.compile(
    r"password authentication failed|no pg_hba\.conf entry|role \S+ does not exist"
    r"|no password supplied|authentication failed|peer authentication",
    re.IGNORECASE,
)
# libpq's "connection to server at "HOST" (ADDRESS), port N failed: FATAL: ".
_SERVER_PREFIX = re.compile(
    r'^connection to server (?:at|on socket) "[^"]*"(?: \([^)]*\))?(?:, port \d+)? failed: '
    r"(?:FATAL: +)?"
)
_NO_DATABASE = re.compile(r"database \S+ does not exist", re.IGNORECASE)


def check_params(
    name: str, params: Mapping[str, object], json_params: frozenset[str] = frozenset()
) -> None:
    """Raise a typed error for a value PostgreSQL cannot store: text with a
    NUL character (``text`` cannot hold U+0000; nor can ``jsonb``, so the
    escape ``\\u0000`` is refused in the JSON lists of ``json_params``) or
    an integer outside the 64-bit range of the schema's ``bigint`` columns
    (which also covers integers too long to print)."""
    for key, value in params.items():
        if isinstance(value, str):
            if "\x00" in value or (
                # The substring test first: the pattern tries every position.
                key in json_params and "\\u0000" in value and _JSON_NUL.search(value)
            ):
                _reject(name, key, "contains a NUL character, which PostgreSQL text cannot hold")
        elif isinstance(value, int) and value not in _INT64:
            _reject(name, key, "is outside the 64-bit integer range of the store")


def _reject(name: str, key: str, what: str) -> None:
    if name in _PUBLICATION:
        raise OutputPublicationError(f"output {key} {what}", field="outputs")
    raise InvalidStoreValueError(f"{key} {what}", field=key)


def is_connection_error(exc: BaseException, conn: psycopg.Connection[object] | None) -> bool:
    """Whether ``exc`` means the connection is gone (not that the statement failed)."""
    if conn is not None and (conn.closed or conn.broken):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate or ""
    if not state and isinstance(exc, psycopg.OperationalError):
        # Raised by the driver, not the server: the socket or the protocol
        # failed (e.g. "connection socket closed" while waiting for a reply,
        # before the connection is marked broken). A pipeline aborted by an
        # earlier failed statement is that statement's error, not this.
        return not isinstance(exc, psycopg.errors.PipelineAborted)
    return state.startswith("08") or state in _CONNECTION_STATES


def server_may_come_back(exc: psycopg.Error) -> bool:
    """Whether a failed connection attempt is worth repeating: the server
    refused, timed out or is not accepting connections right now. A rejected
    URL, host, database, role or password is not."""
    if isinstance(exc, psycopg.ProgrammingError):
        return False  # the URL itself (an unknown query parameter, say)
    return bool(_COMES_BACK.search(str(exc)))


def connect_failure(exc: psycopg.Error) -> str:
    """libpq's reason for a failed connection attempt on one line (its
    ``connection failed:`` prefix and the layout whitespace removed)."""
    text = " ".join(str(exc).split())
    return text.removeprefix("connection failed: ") or type(exc).__name__


def _connect_reason(exc: psycopg.Error) -> str:
    """:func:`connect_failure` without the server's address (the message
    names it) and libpq's severity word."""
    return _SERVER_PREFIX.sub("", connect_failure(exc)) or type(exc).__name__


def server_address(url: str) -> str:
    """The server a URL names, as ``host:port`` (a socket directory as its
    socket path), for messages; libpq's defaults where the URL names none."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.Error:
        return "the PostgreSQL server"
    host = str(info.get("host") or info.get("hostaddr") or "localhost")
    port = str(info.get("port") or "5432")
    if host.startswith("/"):
        return f"{host.rstrip('/')}/.s.PGSQL.{port}"
    if ":" in host and "," not in host:
        return f"[{host}]:{port}"  # an IPv6 address
    return f"{host}:{port}"


def connect_error(exc: psycopg.Error, where: str, waited: float) -> StoreUnavailableError:
    """The typed error of a failed connection attempt to the server at
    ``where`` after ``waited`` seconds of trying: its likely cause and what to
    do, on one line. A server that rejects the client for good (login,
    database, URL) is :class:`StoreCannotOpenError`."""
    reason = _connect_reason(exc)
    prefix = f"cannot connect to PostgreSQL at {where}"
    tried = f"tried for {waited:.1f}s"
    if not server_may_come_back(exc):
        if _LOGIN.search(reason):
            return StoreCannotOpenError(
                f"{prefix}: the server refused the login ({reason})",
                target=where,
                advice="fix the user or password in the store URL",
            )
        if _NO_DATABASE.search(reason):
            return StoreCannotOpenError(
                f"{prefix}: {reason}",
                target=where,
                advice="create the database or fix the store URL",
            )
        return StoreCannotOpenError(
            f"{prefix}: {reason}", target=where, advice="fix the store URL and start again"
        )
    if _REFUSED.search(reason):
        cause, advice = (
            "the server refused the connection",
            "start the server and the run continues",
        )
    elif _STARTING.search(reason):
        cause = "the server is starting up or shutting down"
        advice = "the run continues once it accepts connections"
    elif _FULL.search(reason):
        cause = "every connection slot is taken"
        advice = "close other clients or raise the server's max_connections"
    else:
        cause, advice = f"no answer ({reason})", "check the server and the network"
    return StoreUnavailableError(f"{prefix}: {cause} ({tried})", target=where, advice=advice)


def lost_connection_error(exc: psycopg.Error, where: str, what: str) -> StoreUnavailableError:
    """The typed error of a connection to ``where`` lost during a call; ``what``
    says what became of the call's transaction."""
    if (exc.sqlstate or "") in _CONNECTION_STATES:
        why = "the server shut down or restarted"
    else:
        why = "the server or the network closed it"
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return StoreUnavailableError(
        f"lost the connection to PostgreSQL at {where} ({why}: {reason}); {what}", target=where
    )


def translate_error(exc: psycopg.Error, context: str) -> DagwerkError:
    """The dagwerk error for a driver error (the driver error becomes its cause)."""
    state = exc.sqlstate or ""
    text = f"{context}: {str(exc).strip()}"
    if state.startswith("23"):
        return StoreContractError(f"{context}: constraint violated: {exc}")
    if state in ("40001", "40P01", "55P03", "57014"):
        # Serialisation failure, deadlock, lock not available, lock timeout.
        return StoreBusyError(text)
    if state in ("25006", "42501"):
        return StoreReadOnlyError(text)
    if state.startswith("53"):
        return StoreFullError(text)
    if state in ("42P01", "42703", "3F000"):
        # A table, column or schema of the store is missing: not our schema.
        return StoreCorruptError(text)
    if state in ("22003", "22021", "22P05", "54000"):
        return InvalidStoreValueError(text)
    if isinstance(exc, psycopg.DataError):
        return InvalidStoreValueError(text)
    return StoreUnavailableError(text)
