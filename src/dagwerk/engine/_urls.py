"""Opening a store from a database URL."""

from __future__ import annotations

from typing import Any, Final

from dagwerk.errors import DagwerkError

__all__ = ["DEFAULT_URL", "BackendUnavailableError", "is_postgres_url", "open_store"]

DEFAULT_URL: Final = "sqlite:///dagwerk.db"
"""``Engine()`` and the ``dagwerk`` command use ``./dagwerk.db`` unless told otherwise."""


POSTGRES_SCHEMES: Final = ("postgresql:", "postgres:", "postgresql+psycopg:")


def is_postgres_url(url: str) -> bool:
    """Whether ``url`` names a PostgreSQL database."""
    return url.startswith(POSTGRES_SCHEMES)


class BackendUnavailableError(DagwerkError, RuntimeError):
    """The URL names a backend this installation does not have."""

    code = "backend_unavailable"


def open_store(url: str, **options: Any) -> Any:
    """A store for ``url``: ``sqlite:///path.db``, ``memory://`` or ``postgresql://...``.

    ``options`` go to the store's constructor (``limits``, ``clock``,
    ``max_deliveries``, ...). An unknown scheme raises ``ValueError``
    (:class:`~dagwerk.store.InvalidStoreValueError`).
    """
    from dagwerk.store import InvalidStoreValueError

    if not isinstance(url, str) or not url:
        raise InvalidStoreValueError("database URL must be a non-empty string", field="url")
    if url.startswith("sqlite:"):
        from dagwerk.backends.sqlite import SqliteStore

        return SqliteStore(url, **options)
    if url in ("memory://", "memory:"):
        from dagwerk.backends.memory import MemoryStore

        return MemoryStore(**options)
    if is_postgres_url(url):
        try:
            from dagwerk.backends.postgres import PostgresStore
        except ModuleNotFoundError as error:
            raise BackendUnavailableError(
                f"the PostgreSQL backend needs the postgres extra "
                f"(pip install 'dagwerk[postgres]'): {error}",
                field="url",
            ) from error
        return PostgresStore(url, **options)
    raise InvalidStoreValueError(
        f"unsupported database URL {url!r}; use sqlite:///path.db, memory:// or postgresql://...",
        field="url",
    )
