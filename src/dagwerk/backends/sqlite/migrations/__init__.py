"""The SQLite schema's numbered migrations (``NNNN_name.sql`` in this folder)
and its forward migrator (:mod:`dagwerk.backends.sql.migrations`)."""

from __future__ import annotations

from pathlib import Path

from dagwerk.backends.errors import SchemaTooNewError, StoreCorruptError
from dagwerk.backends.sql import migrations
from dagwerk.backends.sql.gateway import Tx
from dagwerk.backends.sqlite.gateway import SqliteGateway

__all__ = ["LATEST_VERSION", "MIGRATIONS", "SCHEMA_PATH", "migrate"]

SCHEMA_PATH = Path(__file__).parent.with_name("schema.sql")
MIGRATIONS: tuple[tuple[int, Path], ...] = migrations.discover(Path(__file__).parent)
LATEST_VERSION: int = MIGRATIONS[-1][0]


def migrate(gateway: SqliteGateway, *, target: int = LATEST_VERSION) -> int:
    """Bring the database to ``target`` in one write transaction; returns the
    version found before migrating.

    A database newer than this dagwerk raises :class:`SchemaTooNewError`; a
    SQLite file with other tables but no dagwerk schema raises
    :class:`StoreCorruptError`. Two processes opening a new file at once are
    serialised by the write lock: the second sees the first one's schema.
    """
    return migrations.migrate(gateway, _SqliteSchema(gateway), MIGRATIONS, target=target)


class _SqliteSchema:
    """The SQLite file as the migrator sees it."""

    def __init__(self, gateway: SqliteGateway) -> None:
        self._gateway = gateway

    def version(self, tx: Tx) -> int | None:
        row = tx.one("schema_version_table")
        if row is None or not row["n"]:
            return None
        found = tx.one("schema_version_get")
        return int(found["version"]) if found is not None and found["version"] is not None else 0

    def claim(self, tx: Tx) -> None:
        """Nothing: ``write()`` holds the file's write lock from its start."""

    def refuse_foreign(self, tx: Tx) -> None:
        foreign = tx.one("schema_foreign_tables")
        if foreign is not None and foreign["n"]:
            raise StoreCorruptError(
                f"{self._gateway.path!r} is a SQLite database without a dagwerk schema"
            )

    def apply(self, tx: Tx, path: Path) -> None:
        self._gateway.script(path.read_text(encoding="utf-8"))

    def too_new(self, version: int, latest: int) -> SchemaTooNewError:
        return SchemaTooNewError(
            f"{self._gateway.path!r} has dagwerk schema version {version}; this dagwerk "
            f"supports up to version {latest}; upgrade dagwerk to open it"
        )
