"""No code of ours uses ``sqlite3.connect(...)`` itself as a ``with`` block.

A connection's ``with`` block commits or rolls back but leaves the
connection open; the connection then lives until the garbage collector finds
it, and Python 3.13 warns about it there, in whichever later test happens to
be running (the suite turns that warning into an error). ``closing(...)``
closes it where the block ends.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    path
    for folder in ("src", "tests", "bench", "examples")
    for path in (ROOT / folder).rglob("*.py")
)


def _opens_in_with(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                call = item.context_expr
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "connect"
                    and isinstance(call.func.value, ast.Name)
                    and call.func.value.id == "sqlite3"
                ):
                    lines.append(call.lineno)
    return lines


def test_the_check_finds_a_connection_opened_by_a_with_block() -> None:
    tree = ast.parse("with sqlite3.connect(path) as conn:\n    conn.execute('SELECT 1')\n")
    assert _opens_in_with(tree) == [1]
    closed = ast.parse("with closing(sqlite3.connect(path)) as conn:\n    pass\n")
    assert _opens_in_with(closed) == []


def test_no_sqlite_connection_is_left_open_by_a_with_block() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in SOURCES
        for line in _opens_in_with(ast.parse(path.read_text(), filename=str(path)))
    ]
    assert not found, f"sqlite3.connect() as a with block (wrap it in closing()): {found}"
