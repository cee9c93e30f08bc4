"""The migrator both SQL backends share: migration files are found by number
in a backend's folder, and a database is brought forward from its version
to the target, one recorded version per file."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from dagwerk.backends.errors import SchemaTooNewError, StoreCorruptError
from dagwerk.backends.postgres import migrations as postgres_migrations
from dagwerk.backends.sql.gateway import Params, Row
from dagwerk.backends.sql.migrations import discover, migrate
from dagwerk.backends.sqlite import migrations as sqlite_migrations


def _folder(tmp_path: Path, *names: str) -> Path:
    for name in names:
        (tmp_path / name).write_text(f"-- {name}\n", encoding="utf-8")
    return tmp_path


def test_discover_orders_the_files_by_number_and_picks_up_a_new_one(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "0002_two.sql", "0001_one.sql")
    assert [(v, p.name) for v, p in discover(folder)] == [(1, "0001_one.sql"), (2, "0002_two.sql")]
    _folder(tmp_path, "0003_three.sql")
    assert [v for v, _ in discover(folder)] == [1, 2, 3]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (("0001_one.sql", "0003_three.sql"), "numbered 1..n without gaps"),
        (("0002_two.sql",), "numbered 1..n without gaps"),
        (("0001_one.sql", "2_two.sql"), "is not named NNNN_name.sql"),
        (("0001_One.sql",), "is not named NNNN_name.sql"),
    ],
)
def test_discover_refuses_misnamed_or_missing_numbers(
    tmp_path: Path, names: tuple[str, ...], message: str
) -> None:
    with pytest.raises(RuntimeError, match=message):
        discover(_folder(tmp_path, *names))


def test_both_backends_have_the_same_migration_numbers() -> None:
    sqlite = [v for v, _ in sqlite_migrations.MIGRATIONS]
    postgres = [v for v, _ in postgres_migrations.MIGRATIONS]
    assert sqlite == postgres == list(range(1, sqlite_migrations.LATEST_VERSION + 1))


class _Tx:
    """A transaction that only records versions (the host reads the version)."""

    def __init__(self, database: _Database) -> None:
        self._db = database

    def one(self, name: str, params: Params | None = None) -> Row | None:
        raise AssertionError(name)

    def all(self, name: str, params: Params | None = None) -> list[Row]:
        raise AssertionError(name)

    def all_of(self, queries: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        raise AssertionError(queries)

    def all_committing(self, name: str, params: Params | None = None) -> list[Row]:
        raise AssertionError(name)

    def all_of_committing(self, queries: Sequence[tuple[str, Params]]) -> list[list[Row]]:
        raise AssertionError(queries)

    def many(self, name: str, rows: Iterable[Params]) -> None:
        raise AssertionError(name)

    def many_of(self, calls: Sequence[tuple[str, Iterable[Params]]]) -> None:
        raise AssertionError(calls)

    def run(self, name: str, params: Params | None = None) -> int:
        assert name == "schema_version_set" and params is not None
        self._db.version = int(str(params["version"]))
        self._db.log.append(f"version {self._db.version}")
        return 1


class _Database:
    """A gateway and a schema host over a version number and a log."""

    def __init__(self, version: int | None, *, foreign: bool = False) -> None:
        self.version = version
        self.foreign = foreign
        self.log: list[str] = []

    @contextmanager
    def read(self) -> Iterator[_Tx]:
        self.log.append("read")
        yield _Tx(self)

    @contextmanager
    def write(self) -> Iterator[_Tx]:
        self.log.append("write")
        yield _Tx(self)

    def version_of(self, tx: _Tx) -> int | None:
        return self.version

    def claim(self, tx: _Tx) -> None:
        self.log.append("claim")

    def refuse_foreign(self, tx: _Tx) -> None:
        if self.foreign:
            raise StoreCorruptError("foreign tables")

    def apply(self, tx: _Tx, path: Path) -> None:
        self.log.append(path.name)

    def too_new(self, version: int, latest: int) -> SchemaTooNewError:
        return SchemaTooNewError(f"version {version} > {latest}")


class _Host:
    def __init__(self, database: _Database) -> None:
        self.db = database
        self.version = database.version_of
        self.claim = database.claim
        self.refuse_foreign = database.refuse_foreign
        self.apply = database.apply
        self.too_new = database.too_new


@pytest.fixture
def steps(tmp_path: Path) -> tuple[tuple[int, Path], ...]:
    return discover(_folder(tmp_path, "0001_a.sql", "0002_b.sql", "0003_c.sql"))


def test_migrate_applies_the_files_after_the_version_up_to_the_target(
    steps: tuple[tuple[int, Path], ...],
) -> None:
    db = _Database(1)
    assert migrate(db, _Host(db), steps, target=3) == 1
    assert db.log == [
        "read",
        "write",
        "claim",
        "0002_b.sql",
        "version 2",
        "0003_c.sql",
        "version 3",
    ]
    db.log.clear()
    assert migrate(db, _Host(db), steps, target=3) == 3  # current: a read, no write
    assert db.log == ["read"]


def test_migrate_starts_a_database_without_a_version_table_at_zero(
    steps: tuple[tuple[int, Path], ...],
) -> None:
    db = _Database(None)
    assert migrate(db, _Host(db), steps, target=2) == 0
    assert [entry for entry in db.log if entry.endswith(".sql")] == ["0001_a.sql", "0002_b.sql"]
    foreign = _Database(None, foreign=True)
    with pytest.raises(StoreCorruptError):
        migrate(foreign, _Host(foreign), steps, target=3)
    assert not [entry for entry in foreign.log if entry.endswith(".sql")]


def test_migrate_refuses_a_newer_database(steps: tuple[tuple[int, Path], ...]) -> None:
    db = _Database(4)
    with pytest.raises(SchemaTooNewError, match="version 4 > 3"):
        migrate(db, _Host(db), steps, target=3)
    assert db.log == ["read"]
