"""Observing lock waits of a store's connections (PostgreSQL integration tests)."""

from __future__ import annotations

import time

import psycopg


def until_waiting_for_a_lock(url: str, label: str, what: str, *, seconds: float = 20) -> None:
    """Return once a backend whose ``application_name`` is ``label`` waits
    for a lock; fail with ``what`` never waited after ``seconds``."""
    deadline = time.monotonic() + seconds
    with psycopg.connect(url, autocommit=True) as admin:
        while True:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = %s AND wait_event_type = 'Lock'",
                (label,),
            ).fetchone()
            if row is not None and row[0] > 0:
                return
            assert time.monotonic() < deadline, f"{what} never waited for a lock"
            time.sleep(0.01)  # polling with a deadline
