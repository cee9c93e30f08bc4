"""Dialect-neutral store logic shared by the SQL backends.

:class:`~dagwerk.backends.sql.store.SqlStore` implements every store protocol
in terms of named queries; a backend supplies the queries (one ``.sql`` file
per database) and the few hooks in :class:`~dagwerk.backends.sql.gateway.Gateway`
(opening transactions, translating driver errors).
"""

from __future__ import annotations

from dagwerk.backends.sql._retention import GLOBAL_TABLES, RUN_TABLES, RunTable
from dagwerk.backends.sql.gateway import Gateway, Row, Tx, load_queries
from dagwerk.backends.sql.store import SqlStore

__all__ = [
    "GLOBAL_TABLES",
    "RUN_TABLES",
    "Gateway",
    "Row",
    "RunTable",
    "SqlStore",
    "Tx",
    "load_queries",
]
