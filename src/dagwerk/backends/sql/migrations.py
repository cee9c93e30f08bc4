"""Numbered schema migrations of the SQL backends and their forward migrator.

Each backend keeps its migration files in its own ``migrations`` folder,
named ``NNNN_name.sql`` and numbered 1..n without gaps; :func:`discover`
finds them by number, so a new file is picked up by adding it. The
backend's database specifics (how the version is read, what the migrating
transaction does first, what a foreign database looks like, how a script
runs) are a :class:`SchemaHost`; :func:`migrate` is the same for every
backend.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, TypeVar

from dagwerk.backends.errors import SchemaTooNewError
from dagwerk.backends.sql.gateway import Tx

__all__ = ["Migration", "SchemaHost", "Transactions", "discover", "migrate"]

TxT = TypeVar("TxT", bound=Tx)
TxT_co = TypeVar("TxT_co", bound=Tx, covariant=True)
TxT_contra = TypeVar("TxT_contra", bound=Tx, contravariant=True)

_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

Migration = tuple[int, Path]
"""One migration: its version number and its file."""


def discover(directory: Path) -> tuple[Migration, ...]:
    """The migration files of ``directory``, by version.

    Raises ``RuntimeError`` for a ``.sql`` file not named ``NNNN_name.sql``
    and for numbers that are not 1..n without gaps.
    """
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.match(path.name)
        if match is None:
            raise RuntimeError(f"migration file {path.name!r} is not named NNNN_name.sql")
        found.append((int(match.group(1)), path))
    versions = [version for version, _ in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, got {versions}")
    return tuple(found)


class Transactions(Protocol[TxT_co]):
    """The transactions of a gateway (see :class:`~dagwerk.backends.sql.Gateway`)."""

    def read(self) -> AbstractContextManager[TxT_co]: ...

    def write(self) -> AbstractContextManager[TxT_co]: ...


class SchemaHost(Protocol[TxT_contra]):
    """One backend's database as the migrator sees it, in the transactions
    of its gateway."""

    def version(self, tx: TxT_contra) -> int | None:
        """The recorded schema version (0 when none is recorded yet), or
        ``None`` when the database has no version table."""
        ...

    def claim(self, tx: TxT_contra) -> None:
        """The first step of the migrating write transaction (taking a lock,
        creating the schema, ...)."""
        ...

    def refuse_foreign(self, tx: TxT_contra) -> None:
        """Raise :class:`~dagwerk.backends.errors.StoreCorruptError` when the
        database, having no version table, holds tables that are not a
        dagwerk schema."""
        ...

    def apply(self, tx: TxT_contra, path: Path) -> None:
        """Run the migration file ``path`` inside ``tx``."""
        ...

    def too_new(self, version: int, latest: int) -> SchemaTooNewError:
        """The error for a database at ``version``, newer than ``latest``."""
        ...


def migrate(
    gateway: Transactions[TxT],
    host: SchemaHost[TxT],
    migrations: Sequence[Migration],
    *,
    target: int,
) -> int:
    """Bring the database to ``target`` in one write transaction; returns the
    version found before migrating.

    A current schema is recognised in a read transaction, without the write
    lock (so a read-only store opens too). A database newer than the latest
    migration raises ``host.too_new``; one without a version table but with
    foreign tables raises from ``host.refuse_foreign``.
    """
    latest = migrations[-1][0]
    with gateway.read() as tx:
        version = host.version(tx)
        if version is not None and version > latest:
            raise host.too_new(version, latest)
        if version == target:
            return target
    with gateway.write() as tx:
        host.claim(tx)
        current = host.version(tx)
        if current is None:
            host.refuse_foreign(tx)
            current = 0
        if current > latest:
            raise host.too_new(current, latest)
        for version, path in migrations:
            if current < version <= target:
                host.apply(tx, path)
                tx.run("schema_version_set", {"version": version})
        return current
