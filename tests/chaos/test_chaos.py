"""The chaos layer: worker processes killed with SIGKILL while runs of mixed
pipelines go on (see ``driver.py``), on SQLite and, when
``DAGWERK_TEST_POSTGRES_URL`` is set, on PostgreSQL.

CI runs about a minute per backend (60 s of chaos, then the drain and the
check); ``DAGWERK_CHAOS_MINUTES=N`` runs N minutes of chaos per backend and
``DAGWERK_CHAOS_SEED`` replays a schedule. The summary line is printed
(``pytest -s`` shows it) and is part of every failure message.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from driver import ChaosReport, postgres_schema, run_chaos, sqlite_url

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL"),
]

CI_SECONDS = 60.0
KINDS = {"fan", "join", "chain", "wait", "doom"}


def _seconds() -> float:
    minutes = os.environ.get("DAGWERK_CHAOS_MINUTES")
    return float(minutes) * 60 if minutes else CI_SECONDS


def _assert_nothing_lost(report: ChaosReport) -> None:
    print(report.summary())
    details = "\n".join([report.summary(), *report.lost, *report.violations])
    assert report.lost == [], details
    assert report.violations == [], details
    assert report.unexpected_worker_exits == 0, details


def _assert_chaos_happened(report: ChaosReport, seconds: float) -> None:
    details = report.summary()
    # The schedule really exercised what it claims: every pipeline shape,
    # kills that landed on running attempts, waits the driver resumed,
    # failures the retry policies covered.
    assert set(report.runs_by_kind) == KINDS, details
    assert report.runs >= seconds / 2, details
    assert report.kills >= seconds / 5, details
    assert report.crashed_attempts > 0, details
    assert report.abandoned_executions > 0, details
    assert report.resumes > 0, details
    assert report.failed_attempts > 0, details
    assert report.probes > 0 and report.queued_seen > 0, details


def test_chaos_sqlite_loses_nothing_when_workers_are_killed(tmp_path: Path) -> None:
    seconds = _seconds()
    report = run_chaos(sqlite_url(tmp_path), seconds=seconds, workdir=tmp_path)
    _assert_nothing_lost(report)
    _assert_chaos_happened(report, seconds)


def test_chaos_postgres_loses_nothing_when_workers_are_killed(tmp_path: Path) -> None:
    url = os.environ.get("DAGWERK_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("DAGWERK_TEST_POSTGRES_URL is not set")
    seconds = _seconds()
    with postgres_schema(url) as schema_url:
        report = run_chaos(schema_url, seconds=seconds, workdir=tmp_path)
    _assert_nothing_lost(report)
    _assert_chaos_happened(report, seconds)


def test_sqlite_file_locked_by_another_process_workers_wait_and_continue(tmp_path: Path) -> None:
    """Another process holds ``BEGIN EXCLUSIVE`` for 3 s, three times, while
    runs are in flight: the workers wait (busy timeout) and every run ends as
    its plugins dictate; no worker logs an error or exits."""
    report = run_chaos(
        sqlite_url(tmp_path), seconds=10, workdir=tmp_path, workers=2, kill=False, lock_every=3.5
    )
    _assert_nothing_lost(report)
    assert report.locks_held >= 2, report.summary()
    assert report.worker_errors == [], "\n".join(report.worker_errors)
    assert report.runs >= 5, report.summary()
