"""The package's structure, read from its source with ``ast`` (nothing is
imported): no import cycle between modules (but the listed ones), no module
using another module's private names, a pure core that imports neither the
store nor the runtime, and no store or gateway probed with
``getattr``/``hasattr``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_core_purity import CORE_MODULES

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "dagwerk"

# The pure core, as the purity test lists it (ARCHITECTURE.md).
CORE = CORE_MODULES
NOT_CORE = (
    "dagwerk.store",
    "dagwerk._store_extensions",
    "dagwerk._store_types",
    "dagwerk.capabilities",
    "dagwerk.runtime",
    "dagwerk.backends",
    "dagwerk.engine",
    "dagwerk.cli",
    "dagwerk.testing",
)
# Import cycles the package may have (none): a new cycle fails.
KNOWN_CYCLES: list[list[str]] = []


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module
    names: tuple[str, ...]  # names taken with ``from target import ...``
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    for _ in range(node.level - 1):
        base.pop()
    return ".".join([*base, node.module] if node.module else base)


def imports_of(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_package, node)
            yield Import(module, target, tuple(a.name for a in node.names), node.lineno)


def _resolve(target: str, name: str, known: dict[str, Path]) -> str:
    """``from target import name``: the module it names, when it is one."""
    candidate = f"{target}.{name}"
    return candidate if candidate in known else target


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in known}
    for module, path in known.items():
        for imp in imports_of(module, path):
            if not imp.target.startswith("dagwerk"):
                continue
            targets = {_resolve(imp.target, n, known) for n in imp.names} or {imp.target}
            for target in targets:
                # ``import a.b.c`` runs a, a.b and a.b.c: the deepest known one counts.
                while target and target not in known:
                    target = target.rpartition(".")[0]
                # A package's __init__ importing its own submodules (and a
                # submodule importing its package) is how packages work.
                if (
                    target
                    and target != module
                    and not module.startswith(f"{target}.")
                    and not target.startswith(f"{module}.")
                ):
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def private_imports(known: dict[str, Path]) -> list[str]:
    """``from X import _name`` where ``_name`` is not a module."""
    bad: list[str] = []
    for module, path in known.items():
        for imp in imports_of(module, path):
            if not imp.target.startswith("dagwerk"):
                continue
            for name in imp.names:
                private = name.startswith("_") and not name.startswith("__")
                if private and f"{imp.target}.{name}" not in known:
                    bad.append(f"{module}:{imp.line} imports {imp.target}.{name}")
    return bad


def core_violations(known: dict[str, Path]) -> list[str]:
    bad: list[str] = []
    for module in CORE:
        for imp in imports_of(module, known[module]):
            if imp.target.startswith(NOT_CORE) or any(
                f"{imp.target}.{n}".startswith(NOT_CORE) for n in imp.names
            ):
                bad.append(f"{module}:{imp.line} imports {imp.target}")
    return bad


def _names_a_store(node: ast.expr) -> bool:
    last = ast.unparse(node).lower().rpartition(".")[2]
    return "store" in last or "gateway" in last or last.strip("_") == "gw"


def probes(known: dict[str, Path]) -> list[str]:
    bad: list[str] = []
    for module, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"getattr", "hasattr"}
                and node.args
                and _names_a_store(node.args[0])
            ):
                bad.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    return bad


KNOWN = modules()


def test_no_import_cycles_between_modules_but_the_listed_ones() -> None:
    assert cycles(import_graph(KNOWN)) == KNOWN_CYCLES


def test_no_module_imports_another_modules_private_names() -> None:
    assert private_imports(KNOWN) == []


@pytest.mark.parametrize("module", CORE)
def test_the_core_imports_neither_store_nor_runtime(module: str) -> None:
    assert module in KNOWN, f"core module {module} is missing"
    assert [v for v in core_violations(KNOWN) if v.startswith(f"{module}:")] == []


def test_no_store_or_gateway_is_probed_by_name() -> None:
    assert probes(KNOWN) == []


# --- the checks themselves ---------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    known: dict[str, Path] = {}
    for name, text in files.items():
        path = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        known[name] = path
    return known


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    known = _tree(
        tmp_path,
        {
            "dagwerk.a": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from dagwerk.b import B\n",
            "dagwerk.b": "from dagwerk.a import _helper\nfrom dagwerk import _mod\n",
            "dagwerk._mod": "X = 1\n",
            "dagwerk.c": "def f(store):\n"
            "    return getattr(store, 'x', None) or hasattr(self._gateway, 'y')\n",
        },
    )
    assert cycles(import_graph(known)) == [["dagwerk.a", "dagwerk.b"]]
    assert private_imports(known) == ["dagwerk.b:1 imports dagwerk.a._helper"]
    assert [p.split(" ")[0] for p in probes(known)] == ["dagwerk.c:2", "dagwerk.c:2"]
