"""Which driver errors mean the PostgreSQL connection is gone (the gateway
then replays a read or resends an unacknowledged flight on another one)."""

from __future__ import annotations

import psycopg
import pytest

from dagwerk.backends.errors import StoreCannotOpenError
from dagwerk.backends.postgres.errors import (
    connect_error,
    is_connection_error,
    lost_connection_error,
    server_address,
    server_may_come_back,
)
from dagwerk.runtime.faults import FaultKind, classify


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        # Raised by the driver while waiting on a socket the server closed,
        # before the connection object is marked broken.
        (psycopg.OperationalError("connection socket closed"), True),
        (psycopg.errors.AdminShutdown("terminating connection"), True),
        (psycopg.errors.lookup("08006")("connection failure"), True),
        # A statement's own failure, and the pipeline it aborted.
        (psycopg.errors.UniqueViolation("duplicate key"), False),
        (psycopg.errors.PipelineAborted("pipeline aborted"), False),
        (psycopg.errors.QueryCanceled("canceling statement"), False),
        (ValueError("not a driver error"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_a_lost_connection_is_told_from_a_failed_statement(error: Exception, lost: bool) -> None:
    assert is_connection_error(error, None) is lost


@pytest.mark.parametrize(
    ("text", "waits"),
    [
        ('connection to server at "db", port 5432 failed: Connection refused', True),
        ("connection timeout expired", True),
        ('connection to server at "db" failed: FATAL:  the database system is starting up', True),
        ('connection to server at "db" failed: FATAL:  sorry, too many clients already', True),
        ("failed to resolve host 'db': [Errno -3] Temporary failure in name resolution", True),
        ('connection to server at "db" failed: FATAL:  database "x" does not exist', False),
        ('connection to server at "db" failed: FATAL:  password authentication failed', False),
        (
            "failed to resolve host 'nonexistent.invalid': [Errno -2] Name or service not known",
            False,
        ),
    ],
)
def test_only_a_server_that_may_come_back_is_waited_for(text: str, waits: bool) -> None:
    assert server_may_come_back(psycopg.OperationalError(text)) is waits
    assert (
        server_may_come_back(psycopg.ProgrammingError('invalid URI query parameter: "x"')) is False
    )


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("postgresql://u@127.0.0.1:5433/db", "127.0.0.1:5433"),
        ("postgresql://db.example/db", "db.example:5432"),
        ("postgresql:///db", "localhost:5432"),
        ("postgresql://[::1]:6000/db", "[::1]:6000"),
        ("postgresql://u@/db?host=/run/postgresql", "/run/postgresql/.s.PGSQL.5432"),
    ],
)
def test_the_server_is_named_as_host_and_port(url: str, where: str) -> None:
    assert server_address(url) == where


PREFIX = 'connection to server at "127.0.0.1", port 5433 failed: '


@pytest.mark.parametrize(
    ("text", "kind", "says"),
    [
        (
            PREFIX + "Connection refused\n\tIs the server running on that host?",
            FaultKind.TRANSIENT,
            "the server refused the connection (tried for 3.0s); start the server and the "
            "run continues",
        ),
        (
            PREFIX + "FATAL:  the database system is shutting down",
            FaultKind.TRANSIENT,
            "the server is starting up or shutting down (tried for 3.0s); the run continues "
            "once it accepts connections",
        ),
        (
            PREFIX + 'FATAL:  too many connections for role "dagwerk"',
            FaultKind.TRANSIENT,
            "every connection slot is taken (tried for 3.0s); close other clients or raise "
            "the server's max_connections",
        ),
        (
            PREFIX + "timeout expired",
            FaultKind.TRANSIENT,
            "no answer (timeout expired) (tried for 3.0s); check the server and the network",
        ),
        (
            PREFIX + 'FATAL:  password authentication failed for user "u"',
            FaultKind.FATAL,
            'the server refused the login (password authentication failed for user "u"); '
            "fix the user or password in the store URL",
        ),
        (
            PREFIX + 'FATAL:  database "x" does not exist',
            FaultKind.FATAL,
            'database "x" does not exist; create the database or fix the store URL',
        ),
    ],
)
def test_a_failed_connection_is_one_line_naming_the_server_the_cause_and_what_to_do(
    text: str, kind: FaultKind, says: str
) -> None:
    error = connect_error(psycopg.OperationalError(text), "127.0.0.1:5433", 3.0)
    assert str(error) == f"cannot connect to PostgreSQL at 127.0.0.1:5433: {says}"
    assert classify(error) is kind
    assert isinstance(error, StoreCannotOpenError) is (kind is FaultKind.FATAL)
    assert error.target == "127.0.0.1:5433"


def test_a_lost_connection_names_the_server_and_the_fate_of_the_transaction() -> None:
    error = lost_connection_error(
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        "db:5432",
        "the transaction was rolled back: nothing of it was applied",
    )
    assert str(error) == (
        "lost the connection to PostgreSQL at db:5432 (the server shut down or restarted: "
        "terminating connection due to administrator command); the transaction was rolled "
        "back: nothing of it was applied"
    )
    assert classify(error) is FaultKind.TRANSIENT
