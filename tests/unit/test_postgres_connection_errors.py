"""Which driver errors mean the PostgreSQL connection is gone (the gateway
then replays a read or resends an unacknowledged flight on another one)."""

from __future__ import annotations

import psycopg
import pytest

from dagwerk.backends.postgres.errors import is_connection_error


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
