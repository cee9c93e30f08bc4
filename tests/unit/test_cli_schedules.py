"""The schedule commands, ``backfill``, ``submit --idempotency-key`` and
``runs --schedule`` as a user calls them."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dagwerk.cli import cli
from dagwerk.engine import Engine
from dagwerk.scheduling.scheduler import Scheduler

PIPELINE = """\
name: hello
nodes:
  - slug: greet
    plugin: greet
    bindings:
      when: {source: runtime, key: scheduled_for}
schedules:
  - name: nightly
    cron: "30 2 * * *"
    timezone: Europe/Berlin
    catchup: latest
  - name: poll
    every: 30s
    overlap: skip
"""


def _setup(tmp_path: Path) -> tuple[CliRunner, str, Path]:
    pipeline = tmp_path / "hello.yaml"
    pipeline.write_text(PIPELINE, encoding="utf-8")
    return CliRunner(), f"sqlite:///{tmp_path / 'cli.db'}", pipeline


def test_add_list_show_pause_resume_delete(tmp_path: Path) -> None:
    runner, db, pipeline = _setup(tmp_path)
    added = runner.invoke(
        cli,
        [
            "schedule", "add", "s1", str(pipeline), "--cron", "*/5 * * * *",
            "--timezone", "Europe/Berlin", "--overlap", "skip", "--input", '{"a": 1}',
            "--no-plugin-check", "--db", db,
        ],
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert "schedule s1: cron */5 * * * *" in added.output
    listed = runner.invoke(cli, ["schedule", "list", "--db", db, "--json"])
    (doc,) = json.loads(listed.output)
    assert (doc["name"], doc["timezone"], doc["overlap"], doc["input"]) == (
        "s1", "Europe/Berlin", "skip", {"a": 1},
    )  # fmt: skip
    assert len(doc["next_ticks"]) == 5 and doc["next_ticks"][0][-6:] in ("+01:00", "+02:00")
    shown = runner.invoke(cli, ["schedule", "show", "s1", "--db", db])
    assert shown.exit_code == 0 and "next ticks:" in shown.output and "last runs" in shown.output
    assert runner.invoke(cli, ["schedule", "pause", "s1", "--db", db]).exit_code == 0
    paused = json.loads(runner.invoke(cli, ["schedule", "show", "s1", "--db", db, "--json"]).output)
    assert paused["paused"] is True and paused["next_ticks"] == []
    assert runner.invoke(cli, ["schedule", "resume", "s1", "--db", db]).exit_code == 0
    assert runner.invoke(cli, ["schedule", "delete", "s1", "--db", db]).exit_code == 0
    missing = runner.invoke(cli, ["schedule", "show", "s1", "--db", db])
    assert missing.exit_code != 0 and "schedule 's1' does not exist" in missing.output


def test_bad_settings_exit_2_naming_the_problem(tmp_path: Path) -> None:
    runner, db, pipeline = _setup(tmp_path)
    base = ["schedule", "add", "bad", str(pipeline), "--no-plugin-check", "--db", db]
    for extra, message in (
        (["--cron", "* * *"], "needs 5"),
        (["--every", "10 parsecs"], "every must be a duration"),
        (["--every", "10s", "--timezone", "Mars/Base"], "not a known IANA time zone"),
        ([], "exactly one of cron"),
    ):
        result = runner.invoke(cli, [*base, *extra])
        assert result.exit_code == 2, (extra, result.output)
        assert message in result.output


def test_sync_applies_the_file_schedules_once(tmp_path: Path) -> None:
    runner, db, pipeline = _setup(tmp_path)
    first = runner.invoke(cli, ["schedule", "sync", str(pipeline), "--db", db, "--json"])
    assert json.loads(first.output) == {
        "added": ["nightly", "poll"],
        "updated": [],
        "unchanged": [],
    }
    pipeline.write_text(PIPELINE.replace("every: 30s", "every: 1m"), encoding="utf-8")
    second = runner.invoke(cli, ["schedule", "sync", str(pipeline), "--db", db, "--json"])
    assert json.loads(second.output) == {
        "added": [], "updated": ["poll"], "unchanged": ["nightly"],
    }  # fmt: skip
    broken = tmp_path / "broken.yaml"
    broken.write_text(PIPELINE.replace('"30 2 * * *"', '"30 2 * *"'), encoding="utf-8")
    result = runner.invoke(cli, ["validate", str(broken)])
    assert result.exit_code != 0 and "schedules[0].cron" in result.output


def test_runs_of_a_schedule_and_backfill(tmp_path: Path) -> None:
    runner, db, pipeline = _setup(tmp_path)
    runner.invoke(cli, ["schedule", "sync", str(pipeline), "--db", db])
    with Engine(db) as engine:
        Scheduler(engine.store).run_pass()  # nothing is due yet
        ran = [r.run_id for r in engine.list_runs()]
    assert ran == []
    listed = runner.invoke(cli, ["runs", "--schedule", "nightly", "--db", db, "--json"])
    assert listed.exit_code == 0 and json.loads(listed.output) == []
    # A range without ticks: nothing to create or wait for.
    empty = runner.invoke(
        cli, ["backfill", "nightly", "--from", "2026-01-01T03:00", "--to", "2026-01-01T04:00",
              "--db", db, "--json"],
    )  # fmt: skip
    assert empty.exit_code == 0, empty.output
    assert json.loads(empty.stdout) == {"schedule": "nightly", "runs": []}


def test_submit_with_an_idempotency_key(tmp_path: Path) -> None:
    runner, db, pipeline = _setup(tmp_path)
    args = ["submit", str(pipeline), "--no-plugin-check", "--db", db, "--idempotency-key", "k1"]
    first = runner.invoke(cli, args)
    again = runner.invoke(cli, args)
    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    assert first.output == again.output
    other = runner.invoke(cli, [*args, "--input", '{"when": "other"}'])
    assert other.exit_code == 2 and "idempotency key 'k1' already names run" in other.output
    with Engine(db) as engine:
        assert [r.run_id for r in engine.list_runs()] == [first.output.strip()]
