"""The README's first two commands, followed as a newcomer would.

The fast tests check that the commands name files and modules that exist and
run the example command with this interpreter; the slow test (``DAGWERK_SLOW=1``)
runs the first line literally in a fresh copy of the checkout with a fresh
virtual environment.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def first_commands() -> list[str]:
    """The lines of the README's first fenced ``bash`` block."""
    match = re.search(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert match is not None, "README has no ```bash block"
    return [line for line in match.group(1).splitlines() if line.strip()]


def test_the_first_block_is_install_and_run_then_test() -> None:
    install, run_tests = first_commands()
    assert "python3 -m venv .venv" in install
    assert "pip install" in install and "-e '.[dev]'" in install
    assert run_tests == ".venv/bin/python -m pytest -q -n auto"
    # Everything the first line names exists: the example and the dev extra.
    example = install.rsplit("&&", 1)[1].split()
    assert example[0] == ".venv/bin/python"
    assert (ROOT / example[1]).is_file()
    assert "dev = [" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_the_example_command_succeeds() -> None:
    install, _ = first_commands()
    argv = shlex.split(install.rsplit("&&", 1)[1])
    argv[0] = sys.executable  # the venv's interpreter is the one running the tests
    result = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "completed" in result.stdout


def test_every_file_and_command_the_tour_names_exists() -> None:
    text = README.read_text(encoding="utf-8")
    for path in sorted(set(re.findall(r"examples/[\w/.-]+\.(?:py|yaml)", text))):
        assert (ROOT / path).is_file(), path
    from dagwerk.cli import cli

    named = set(re.findall(r"^\s*(?:\w+=\S+ )?dagwerk ([a-z]+)", text, re.MULTILINE))
    assert named, "the tour shows no dagwerk commands"
    assert named <= set(cli.commands), named - set(cli.commands)


@pytest.mark.skipif(os.environ.get("DAGWERK_SLOW") != "1", reason="set DAGWERK_SLOW=1")
def test_the_first_command_in_a_fresh_checkout(tmp_path: Path) -> None:
    checkout = tmp_path / "dagwerk"
    shutil.copytree(
        ROOT,
        checkout,
        ignore=shutil.ignore_patterns(
            ".venv",
            ".ci-venv",
            ".git",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
            ".hypothesis",
            "*.db",
        ),
    )
    install, _ = first_commands()
    result = subprocess.run(
        ["bash", "-c", install],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "completed" in result.stdout
