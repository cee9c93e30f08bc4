"""Numbered schema migrations (``NNNN_name.sql``) and the forward migrator."""

from __future__ import annotations

import re
from pathlib import Path

from dagwerk.backends.errors import SchemaTooNewError, StoreCorruptError
from dagwerk.backends.sqlite.gateway import SqliteGateway

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


def migrate(gateway: SqliteGateway, *, target: int = LATEST_VERSION) -> int:
    """Bring the database to ``target`` in one write transaction; returns the
    version found before migrating.

    A database newer than this dagwerk raises :class:`SchemaTooNewError`; a
    SQLite file with other tables but no dagwerk schema raises
    :class:`StoreCorruptError`. Two processes opening a new file at once are
    serialised by the write lock: the second sees the first one's schema.
    """
    # A current schema needs no write lock, so a read-only store opens too.
    with gateway.read() as tx:
        row = tx.one("schema_version_table")
        if row is not None and row["n"]:
            found = tx.one("schema_version_get")
            version = found["version"] if found is not None else None
            if version is not None and version > LATEST_VERSION:
                raise _too_new(gateway, version)
            if version == target:
                return target
    with gateway.write() as tx:
        has_table = tx.one("schema_version_table")
        assert has_table is not None
        if has_table["n"]:
            row = tx.one("schema_version_get")
            current = int(row["version"]) if row is not None and row["version"] is not None else 0
        else:
            foreign = tx.one("schema_foreign_tables")
            if foreign is not None and foreign["n"]:
                raise StoreCorruptError(
                    f"{gateway.path!r} is a SQLite database without a dagwerk schema"
                )
            current = 0
        if current > LATEST_VERSION:
            raise _too_new(gateway, current)
        for version, path in MIGRATIONS:
            if current < version <= target:
                gateway.script(path.read_text(encoding="utf-8"))
                tx.run("schema_version_set", {"version": version})
        return current


def _too_new(gateway: SqliteGateway, version: int) -> SchemaTooNewError:
    return SchemaTooNewError(
        f"{gateway.path!r} has dagwerk schema version {version}; this dagwerk "
        f"supports up to version {LATEST_VERSION}; upgrade dagwerk to open it"
    )
