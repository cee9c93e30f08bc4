"""``dagwerk.testing.postgres.fresh_schema_url``: a URL of a new schema that
keeps what the given URL asks of the server."""

from __future__ import annotations

import psycopg

from dagwerk.testing.postgres import fresh_schema_url


def test_the_schema_url_keeps_the_options_of_the_url_it_extends(postgres_url: str) -> None:
    separator = "&" if "?" in postgres_url else "?"
    base = f"{postgres_url}{separator}options=-c%20statement_timeout%3D4321"
    with fresh_schema_url(base) as url:
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT (current_schemas(false))[1], current_setting('statement_timeout')"
            ).fetchone()
        assert row is not None
        schema, timeout = row
        assert schema.startswith("t_")
        assert timeout == "4321ms"
    with psycopg.connect(postgres_url) as conn:
        gone = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
        ).fetchone()
    assert gone == (0,)
