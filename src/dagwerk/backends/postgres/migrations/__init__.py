"""The PostgreSQL schema's numbered migrations (``NNNN_name.sql`` in this
folder) and its forward migrator (:mod:`dagwerk.backends.sql.migrations`).

Every worker migrates when it opens the store, so several may try at once:
the migrating transaction first takes a transaction-level advisory lock
keyed by the schema name (``pg_advisory_xact_lock``), then reads the version
again; whoever comes second finds the schema current and does nothing.
PostgreSQL DDL is transactional, so a migration applies whole or not at all.
"""

from __future__ import annotations

from pathlib import Path

from dagwerk.backends.errors import SchemaTooNewError, StoreCorruptError
from dagwerk.backends.postgres.gateway import PostgresGateway, PostgresTx
from dagwerk.backends.sql import migrations

__all__ = ["LATEST_VERSION", "MIGRATIONS", "SCHEMA_PATH", "migrate"]

SCHEMA_PATH = Path(__file__).parent.with_name("schema.sql")
MIGRATIONS: tuple[tuple[int, Path], ...] = migrations.discover(Path(__file__).parent)
LATEST_VERSION: int = MIGRATIONS[-1][0]


def migrate(gateway: PostgresGateway, schema: str, *, target: int = LATEST_VERSION) -> int:
    """Bring ``schema`` to ``target`` (creating the schema if needed) in one
    write transaction; returns the version found before migrating.

    A schema newer than this dagwerk raises :class:`SchemaTooNewError`; dagwerk
    tables without a version table raise :class:`StoreCorruptError`.
    """
    # The common case, a current schema, takes no lock at all (a read skips
    # the lock prelude of schema_version_table).
    return migrations.migrate(gateway, _PostgresSchema(gateway, schema), MIGRATIONS, target=target)


class _PostgresSchema:
    """One PostgreSQL schema as the migrator sees it."""

    def __init__(self, gateway: PostgresGateway, schema: str) -> None:
        self._gateway = gateway
        self._schema = schema

    def version(self, tx: PostgresTx) -> int | None:
        row = tx.one("schema_version_table", {"schema": self._schema})
        if row is None or not row["n"]:
            return None
        found = tx.one("schema_version_get")
        return int(found["version"]) if found is not None and found["version"] is not None else 0

    def claim(self, tx: PostgresTx) -> None:
        # The advisory lock comes first, so the schema is created and checked
        # by one process at a time.
        tx.one("schema_version_table", {"schema": self._schema})
        # An identifier cannot be a parameter; doubling its quotes keeps a
        # current_schema() such as 'a"b' one identifier.
        quoted = '"' + self._schema.replace('"', '""') + '"'
        self._gateway.script(tx, f"CREATE SCHEMA IF NOT EXISTS {quoted}")

    def refuse_foreign(self, tx: PostgresTx) -> None:
        half = tx.one("schema_foreign_tables")
        if half is not None and half["n"]:
            raise StoreCorruptError(
                f"schema {self._schema!r} has dagwerk tables but no dagwerk_schema_version "
                "table; it was not made by dagwerk migrations"
            )

    def apply(self, tx: PostgresTx, path: Path) -> None:
        self._gateway.script(tx, path.read_text(encoding="utf-8"))

    def too_new(self, version: int, latest: int) -> SchemaTooNewError:
        return SchemaTooNewError(
            f"PostgreSQL schema {self._schema!r} has dagwerk schema version {version}; "
            f"this dagwerk supports up to version {latest}; upgrade dagwerk to open it"
        )
