"""Plugins as a user names them, through the ``dagwerk`` command: a module
next to the pipeline file or in the current directory resolves the same
under ``dagwerk`` and ``python -m dagwerk``; ``validate`` and ``submit``
refuse a misspelt plugin or module (with "did you mean") as ``run`` does,
before anything is stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / ("dagwerk.exe" if os.name == "nt" else "dagwerk")
PLUGINS = """\
import dagwerk


def read_orders(inputs, ctx):
    return [{"id": 1}, {"id": 2}]


@dagwerk.plugin("count_orders")
def count_orders(inputs, ctx):
    return {"n": 2}
"""


def pipeline_text(module: str, *, plugin: str = "read_orders", count: str = "count_orders") -> str:
    """Node ``read`` names its plugin by import path, ``count`` by the name
    the module registers."""
    return f"""\
name: orders
plugins: [{module}]
nodes:
  - slug: read
    plugin: {module}:{plugin}
  - slug: count
    plugin: {count}
    input_mode: all
    edges: [{{name: orders, source: read}}]
"""


def command(launcher: str) -> list[str]:
    if launcher == "script":
        if not SCRIPT.exists():
            pytest.skip(f"no dagwerk console script next to {sys.executable}")
        return [str(SCRIPT)]
    return [sys.executable, "-m", "dagwerk"]


def dagwerk(*args: str, cwd: Path, launcher: str = "python -m") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGWERK_")}
    env["DAGWERK_DB"] = f"sqlite:///{cwd / 'runs.db'}"
    return subprocess.run(
        [*command(launcher), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.parametrize("launcher", ["script", "python -m"])
@pytest.mark.parametrize("module_in", ["pipeline folder", "current directory"])
def test_a_plugin_module_resolves_the_same_under_dagwerk_and_python_m(
    tmp_path: Path, launcher: str, module_in: str
) -> None:
    project = tmp_path / "project"
    (project / "pipelines").mkdir(parents=True)
    folder = project / "pipelines" if module_in == "pipeline folder" else project
    # A fresh module name per case: the child processes share no imports anyway.
    module = f"orders_{'here' if module_in == 'pipeline folder' else 'cwd'}"
    (folder / f"{module}.py").write_text(PLUGINS, encoding="utf-8")
    # Import paths only, no 'plugins:' list: the user's first pipeline.
    text = pipeline_text(module, count=f"{module}:count_orders").replace(
        f"plugins: [{module}]\n", ""
    )
    (project / "pipelines" / "orders.yaml").write_text(text, encoding="utf-8")

    checked = dagwerk("validate", "pipelines/orders.yaml", cwd=project, launcher=launcher)
    assert checked.returncode == 0, checked.stderr
    result = dagwerk("run", "pipelines/orders.yaml", "--json", cwd=project, launcher=launcher)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["status"] == "completed"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "orders_plugins.py").write_text(PLUGINS, encoding="utf-8")
    return tmp_path


def write(project: Path, text: str) -> str:
    (project / "orders.yaml").write_text(text, encoding="utf-8")
    return "orders.yaml"


def test_validate_names_a_misspelt_plugin_with_did_you_mean(project: Path) -> None:
    pipeline = write(project, pipeline_text("orders_plugins", count="count_order"))
    result = dagwerk("validate", pipeline, cwd=project)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        "error: orders.yaml:7: node 'count', field 'plugin': no plugin is registered as "
        "'count_order'; did you mean 'count_orders'?\n"
    )


def test_validate_names_a_misspelt_function_of_an_import_path(project: Path) -> None:
    pipeline = write(project, pipeline_text("orders_plugins", plugin="read_order"))
    result = dagwerk("validate", pipeline, "--json", cwd=project)
    assert result.returncode == 2
    document = json.loads(result.stdout)
    assert document["valid"] is False
    error = document["error"]
    assert (error["rule"], error["node"], error["field"], error["line"]) == (
        "unknown_plugin",
        "read",
        "plugin",
        5,
    )
    assert error["reason"] == (
        "plugin 'orders_plugins:read_order': module 'orders_plugins' has no function "
        "'read_order'; did you mean 'read_orders'?"
    )


def test_validate_names_a_misspelt_plugin_module(project: Path) -> None:
    text = pipeline_text("orders_plugins").replace(
        "plugins: [orders_plugins]", "plugins: [order_plugins]"
    )
    result = dagwerk("validate", write(project, text), cwd=project)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: orders.yaml:2: field 'plugins[0]': cannot import plugin module 'order_plugins'"
    )
    assert result.stderr.endswith("; did you mean 'orders_plugins'?\n")


def test_validate_without_the_plugin_check_passes_the_same_file(project: Path) -> None:
    pipeline = write(project, pipeline_text("orders_plugins", count="count_order"))
    result = dagwerk("validate", pipeline, "--no-plugin-check", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("valid orders.yaml")


def test_submit_refuses_a_misspelt_plugin_and_stores_nothing(project: Path) -> None:
    pipeline = write(project, pipeline_text("orders_plugins", count="count_order"))
    refused = dagwerk("submit", pipeline, cwd=project)
    assert refused.returncode == 2
    assert "did you mean 'count_orders'?" in refused.stderr
    # Refused before the database was opened: not even a file was made.
    assert not (project / "dagwerk.db").exists()

    # A machine without the plugins' code can still submit.
    stored = dagwerk("submit", pipeline, "--no-plugin-check", cwd=project)
    assert stored.returncode == 0, stored.stderr
    assert len(json.loads(dagwerk("runs", "--json", cwd=project).stdout)) == 1


def test_run_refuses_a_misspelt_import_path_before_storing(project: Path) -> None:
    pipeline = write(project, pipeline_text("orders_plugins", plugin="read_order"))
    refused = dagwerk("run", pipeline, cwd=project)
    assert refused.returncode == 2
    assert "did you mean 'read_orders'?" in refused.stderr
    assert not (project / "dagwerk.db").exists()
