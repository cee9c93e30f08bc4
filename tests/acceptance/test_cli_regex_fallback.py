"""google-re2 is a regular dependency where PyPI has wheels of it; without it
the ``dagwerk`` command says so only when a pipeline uses the ``match`` pipe,
not on every command."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
ETL = str(ROOT / "examples" / "pipelines" / "etl.yaml")
# ``dagwerk`` in an environment where ``import re2`` fails.
WITHOUT_RE2 = (
    "import sys; sys.modules['re2'] = None; sys.argv[0] = 'dagwerk'; "
    "from dagwerk.cli import main; main()"
)
MATCHING = """\
name: ids
nodes:
  - slug: extract
    plugin: extract_orders
  - slug: tag
    plugin: tag_order
    input_mode: each
    edges: [{name: orders, source: extract}]
    bindings:
      code: {source: expression, expression: "{orders.title | match([0-9]+)}"}
"""


def dagwerk_without_re2(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PYTHONWARNINGS" and not k.startswith("DAGWERK_")
    }
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_RE2, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "args", [("--help",), ("schema",), ("validate", ETL), ("submit", ETL), ("runs",)]
)
def test_commands_say_nothing_about_re2_when_no_match_pipe_is_used(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    if args == ("runs",):
        # `runs` reads a database that exists: make one first.
        assert dagwerk_without_re2("submit", ETL, cwd=tmp_path).returncode == 0
    result = dagwerk_without_re2(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_validating_a_match_pipe_without_re2_warns_once(tmp_path: Path) -> None:
    pipeline = tmp_path / "ids.yaml"
    pipeline.write_text(MATCHING, encoding="utf-8")
    result = dagwerk_without_re2("validate", str(pipeline), "--no-plugin-check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("valid ")
    # One line, without the dagwerk source line a Python warning would show.
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("warning: google-re2 is not installed: the 'match' pipe runs")
    assert lines[0].endswith("pip install 'dagwerk[re2]'")


def _re2_requirement() -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    found = [Requirement(text) for text in project["dependencies"]]
    return next(requirement for requirement in found if requirement.name == "google-re2")


@pytest.mark.parametrize(
    ("system", "machine", "implementation", "installed"),
    [
        ("linux", "x86_64", "CPython", True),
        ("linux", "aarch64", "CPython", True),
        ("darwin", "arm64", "CPython", True),
        ("darwin", "x86_64", "CPython", True),
        ("win32", "AMD64", "CPython", True),
        ("win32", "ARM64", "CPython", True),
        # No wheels on PyPI: the sdist needs a C++ toolchain and RE2's headers.
        ("linux", "ppc64le", "CPython", False),
        ("linux", "s390x", "CPython", False),
        ("linux", "i686", "CPython", False),
        ("linux", "x86_64", "PyPy", False),
    ],
)
def test_google_re2_is_a_dependency_where_pypi_has_wheels(
    system: str, machine: str, implementation: str, installed: bool
) -> None:
    requirement = _re2_requirement()
    assert requirement.marker is not None
    environment = {
        "sys_platform": system,
        "platform_machine": machine,
        "platform_python_implementation": implementation,
    }
    assert requirement.marker.evaluate(environment) is installed
