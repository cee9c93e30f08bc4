"""``dagwerk run`` stores a plugin's INFO lines whatever ``--log-level`` shows
on its stderr (the level decides what is printed, not what is kept)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagwerk.testing.cli import DagwerkCli

_PIPELINE = """\
name: leveled
plugins: [leveled_plugins]
nodes:
  - slug: talk
    plugin: talk
"""

_PLUGINS = """\
import dagwerk


@dagwerk.plugin("talk")
def talk(inputs, ctx):
    ctx.logger.info("an info line")
    ctx.logger.warning("a warning line")
    return {}
"""


@pytest.fixture
def cli(tmp_path: Path) -> DagwerkCli:
    (tmp_path / "leveled_plugins.py").write_text(_PLUGINS, encoding="utf-8")
    (tmp_path / "leveled.yaml").write_text(_PIPELINE, encoding="utf-8")
    return DagwerkCli(tmp_path, "leveled.db")


@pytest.mark.parametrize(
    ("level", "printed"),
    [("warning", ["a warning line"]), ("off", []), ("info", ["an info line", "a warning line"])],
)
def test_run_keeps_info_lines_at_every_log_level(
    cli: DagwerkCli, level: str, printed: list[str]
) -> None:
    ran = cli("run", "leveled.yaml", "--run-id", "run-leveled", "--log-level", level, "--json")
    assert ran.returncode == 0, ran.stderr
    shown = [m for m in ("an info line", "a warning line") if m in ran.stderr]
    assert shown == printed
    stored = cli("logs", "run-leveled", "--json")
    assert stored.returncode == 0, stored.stderr
    assert "an info line" in stored.stdout and "a warning line" in stored.stdout
    assert stored.stdout.count("a warning line") == 1
