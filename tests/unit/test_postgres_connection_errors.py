"""Which driver errors mean the PostgreSQL connection is gone (the gateway
then replays a read or resends an unacknowledged flight on another one)."""

from __future__ import annotations

import psycopg
import pytest

from dagwerk.backends.postgres.errors import is_connection_error, server_may_come_back


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
