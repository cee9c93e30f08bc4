"""dagwerk's own ``schema=`` query parameter of a PostgreSQL URL is taken out
before libpq (which refuses parameters it does not know) sees the URL."""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg")

from dagwerk.backends.postgres.store import split_schema


@pytest.mark.parametrize(
    ("url", "rest", "schema"),
    [
        ("postgresql://u@h/db", "postgresql://u@h/db", None),
        ("postgresql://u@h/db?schema=team_b", "postgresql://u@h/db", "team_b"),
        (
            "postgresql://u@h/db?sslmode=require&schema=team_b&options=-c%20a%3Db+c",
            "postgresql://u@h/db?sslmode=require&options=-c%20a%3Db+c",
            "team_b",
        ),
        ("postgresql://u@h/db?sslmode=disable", "postgresql://u@h/db?sslmode=disable", None),
    ],
)
def test_the_schema_parameter_is_split_off_and_the_rest_kept_as_written(
    url: str, rest: str, schema: str | None
) -> None:
    assert split_schema(url) == (rest, schema)
