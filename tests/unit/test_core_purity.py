"""The pure core imports no I/O or concurrency module (ARCHITECTURE.md).

The imports of every core module are read from its source (the AST) and
followed through the other dagwerk modules it imports, so an indirect import
through our own code is caught. Third-party dependencies (pydantic, re2) are
trusted to be what they are and are not followed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dagwerk

PACKAGE_DIR = Path(dagwerk.__file__).parent
CORE_MODULES = [
    "dagwerk.constants",
    "dagwerk.errors",
    "dagwerk.limits",
    "dagwerk.json",
    "dagwerk.models",
    "dagwerk.graph",
    "dagwerk.topology",
    "dagwerk.filter",
    "dagwerk.pipes",
    "dagwerk.expressions",
    "dagwerk.bindings",
    "dagwerk.planning",
    "dagwerk.schema",
    "dagwerk.plugins",
    "dagwerk.transitions",
    "dagwerk.lineage",
    "dagwerk.budgets",
    "dagwerk.stall",
]
FORBIDDEN = {
    "sqlite3",
    "psycopg",
    "psycopg_pool",
    "socket",
    "threading",
    "asyncio",
    "subprocess",
    "multiprocessing",
    "concurrent",
    "selectors",
    "urllib.request",
    "http",
}


def _module_path(name: str) -> Path:
    rel = name.split(".")[1:]
    candidate = PACKAGE_DIR.joinpath(*rel).with_suffix(".py")
    if candidate.exists():
        return candidate
    return PACKAGE_DIR.joinpath(*rel, "__init__.py")


def _imports(source: str) -> tuple[set[str], bool]:
    """Imported module names, and whether ``time.sleep`` is used."""
    tree = ast.parse(source)
    names: set[str] = set()
    sleeps = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "time" and any(a.name == "sleep" for a in node.names):
                sleeps = True
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "sleep"
            and isinstance(node.value, ast.Name)
            and node.value.id == "time"
        ):
            sleeps = True
    return names, sleeps


def forbidden_imports(module: str) -> list[str]:
    seen: set[str] = set()
    todo = [module]
    bad: list[str] = []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_path(name)
        if not path.exists():
            continue
        imported, sleeps = _imports(path.read_text(encoding="utf-8"))
        if sleeps:
            bad.append(f"{name}: time.sleep")
        for target in imported:
            if target.split(".")[0] in FORBIDDEN or target in FORBIDDEN:
                bad.append(f"{name}: {target}")
            elif target.startswith("dagwerk."):
                todo.append(target)
    return sorted(bad)


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_no_io_or_concurrency(module: str) -> None:
    if not _module_path(module).exists():
        pytest.fail(f"core module {module} is missing")
    assert forbidden_imports(module) == []


def test_checker_detects_direct_and_sleep_imports() -> None:
    names, sleeps = _imports("import threading\nfrom time import sleep\n")
    assert "threading" in names
    assert sleeps
    names, sleeps = _imports("import time\ntime.sleep(1)\n")
    assert sleeps
