"""Numbered schema migrations (``NNNN_name.sql``) and the forward migrator.

Every worker migrates when it opens the store, so several may try at once:
the migrating transaction first takes a transaction-level advisory lock
keyed by the schema name (``pg_advisory_xact_lock``), then reads the version
again; whoever comes second finds the schema current and does nothing.
PostgreSQL DDL is transactional, so a migration applies whole or not at all.
"""

from __future__ import annotations

import re
from pathlib import Path

from dagwerk.backends.errors import SchemaTooNewError, StoreCorruptError
from dagwerk.backends.postgres.gateway import PostgresGateway
from dagwerk.backends.sql.gateway import Tx

__all__ = ["LATEST_VERSION", "MIGRATIONS", "SCHEMA_PATH", "migrate"]

_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
SCHEMA_PATH = Path(__file__).parent.with_name("schema.sql")


def _discover() -> tuple[tuple[int, Path], ...]:
    found: list[tuple[int, Path]] = []
    for path in sorted(Path(__file__).parent.glob("*.sql")):
        match = _FILE.match(path.name)
        if match is None:
            raise RuntimeError(f"migration file {path.name!r} is not named NNNN_name.sql")
        found.append((int(match.group(1)), path))
    versions = [version for version, _ in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, got {versions}")
    return tuple(found)


MIGRATIONS: tuple[tuple[int, Path], ...] = _discover()
LATEST_VERSION: int = MIGRATIONS[-1][0]


def migrate(gateway: PostgresGateway, schema: str, *, target: int = LATEST_VERSION) -> int:
    """Bring ``schema`` to ``target`` (creating the schema if needed) in one
    write transaction; returns the version found before migrating.

    A schema newer than this dagwerk raises :class:`SchemaTooNewError`; dagwerk
    tables without a version table raise :class:`StoreCorruptError`.
    """
    # The common case, a current schema, takes no lock at all (a read skips
    # the lock prelude of schema_version_table).
    with gateway.read() as tx:
        version = _version(tx, schema)
        if version is not None and version > LATEST_VERSION:
            raise _too_new(schema, version)
        if version == target:
            return target
    with gateway.write() as tx:
        # The advisory lock comes first, so the schema is created and checked
        # by one process at a time.
        tx.one("schema_version_table", {"schema": schema})
        # An identifier cannot be a parameter; doubling its quotes keeps a
        # current_schema() such as 'a"b' one identifier.
        quoted = '"' + schema.replace('"', '""') + '"'
        gateway.script(tx, f"CREATE SCHEMA IF NOT EXISTS {quoted}")
        current = _version(tx, schema)
        if current is None:
            half = tx.one("schema_foreign_tables")
            if half is not None and half["n"]:
                raise StoreCorruptError(
                    f"schema {schema!r} has dagwerk tables but no dagwerk_schema_version "
                    "table; it was not made by dagwerk migrations"
                )
            current = 0
        if current > LATEST_VERSION:
            raise _too_new(schema, current)
        for version, path in MIGRATIONS:
            if current < version <= target:
                gateway.script(tx, path.read_text(encoding="utf-8"))
                tx.run("schema_version_set", {"version": version})
        return current


def _version(tx: Tx, schema: str) -> int | None:
    """The recorded version, or ``None`` when the version table is missing."""
    row = tx.one("schema_version_table", {"schema": schema})
    if row is None or not row["n"]:
        return None
    found = tx.one("schema_version_get")
    return int(found["version"]) if found is not None and found["version"] is not None else 0


def _too_new(schema: str, version: int) -> SchemaTooNewError:
    return SchemaTooNewError(
        f"PostgreSQL schema {schema!r} has dagwerk schema version {version}; this dagwerk "
        f"supports up to version {LATEST_VERSION}; upgrade dagwerk to open it"
    )
