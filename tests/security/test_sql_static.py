"""Static check: no SQL in ``src/dagwerk/backends`` is built from variables.

Every statement a store runs is a named block of ``queries.sql`` whose
values travel as parameters. The AST scan looks at every ``execute``,
``executemany``, ``executescript`` and ``script`` call and at every
f-string, ``%`` and ``.format`` whose constant text reads like SQL. A
statement argument passes when it is a literal, the named-block lookup
(``QUERIES[name]`` or an attribute of the block it returns), or one of the
few listed exceptions, each with its reason; anything else fails the test,
so a new ``f"SELECT ... {value}"`` cannot slip in.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

BACKENDS = Path(__file__).resolve().parents[2] / "src" / "dagwerk" / "backends"
EXECUTORS = {"execute", "executemany", "executescript", "script"}
SQL_WORDS = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|PRAGMA|LISTEN|NOTIFY|BEGIN)\b|\bFROM\s|\bWHERE\s"
)

#: (file, source of the statement argument) -> why it is safe.
ALLOWED: dict[tuple[str, str], str] = {
    ("postgres/_tx.py", "prelude"): "a lock prelude of a named block (QUERIES[name].preludes)",
    ("postgres/_tx.py", "begin"): "BEGIN ... ISOLATION LEVEL, chosen from two literals",
    ("postgres/_tx.py", "_TOGETHER[name]"): (
        "named blocks' statements joined by together(), their parameters renamed"
    ),
    (
        "postgres/gateway.py",
        "sql.encode('utf-8')",
    ): "a migration file of the package, run by script()",
    ("postgres/_listen.py", "f'LISTEN {self._channel}'"): (
        "one of the module's constant channel names (Listener refuses any other)"
    ),
    ("sqlite/gateway.py", "begin"): "BEGIN IMMEDIATE or BEGIN, literals of write()/read()",
    ("sqlite/gateway.py", "buffer"): "a statement of a migration file of the package",
    ("sqlite/gateway.py", "f'PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}'"): (
        "PRAGMA takes no parameters; the value is forced through int()"
    ),
    ("sqlite/gateway.py", "f'PRAGMA max_page_count = {int(self.max_page_count)}'"): (
        "PRAGMA takes no parameters; the value is forced through int()"
    ),
    ("sqlite/gateway.py", "_SYNCHRONOUS_PRAGMAS[self.synchronous]"): (
        "one of three literal statements, chosen by a validated option"
    ),
    ("postgres/migrations/__init__.py", "f'CREATE SCHEMA IF NOT EXISTS {quoted}'"): (
        "an identifier cannot be a parameter; its quotes are doubled"
    ),
    ("postgres/migrations/__init__.py", "path.read_text(encoding='utf-8')"): (
        "a migration file of the package"
    ),
    ("sqlite/migrations/__init__.py", "path.read_text(encoding='utf-8')"): (
        "a migration file of the package"
    ),
}


def _is_block_lookup(node: ast.expr) -> bool:
    """``QUERIES[name]``, ``QUERIES[name].main`` or ``statement.main``."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        return node.value.id == "QUERIES"
    if isinstance(node, ast.Attribute) and node.attr == "main":
        return (
            isinstance(node.value, ast.Name) and node.value.id == "statement"
        ) or _is_block_lookup(node.value)
    return False


def _constant_text(node: ast.expr) -> str:
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )
    if isinstance(node, ast.BinOp):
        return _constant_text(node.left) + _constant_text(node.right)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return ""


def _findings() -> tuple[list[str], set[tuple[str, str]]]:
    problems: list[str] = []
    used: set[tuple[str, str]] = set()
    for path in sorted(BACKENDS.rglob("*.py")):
        rel = path.relative_to(BACKENDS).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in EXECUTORS
            ):
                if not node.args:
                    continue
                statement = node.args[-1] if node.func.attr == "script" else node.args[0]
                if isinstance(statement, ast.Constant) or _is_block_lookup(statement):
                    continue
                key = (rel, ast.unparse(statement))
                if key in ALLOWED:
                    used.add(key)
                    continue
                problems.append(f"{rel}:{node.lineno}: {node.func.attr}({key[1]})")
            built: ast.expr | None = None
            if (
                isinstance(node, ast.JoinedStr)
                and any(isinstance(v, ast.FormattedValue) for v in node.values)
            ) or (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add)):
                built = node
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "format"
            ):
                built = node.func.value if isinstance(node.func.value, ast.Constant) else None
            if built is not None and SQL_WORDS.search(_constant_text(built)):
                key = (rel, ast.unparse(built))
                if key in ALLOWED:
                    used.add(key)
                else:
                    problems.append(f"{rel}:{built.lineno}: SQL built from variables: {key[1]}")
    return problems, used


def test_no_sql_statement_in_the_backends_is_built_from_variables() -> None:
    problems, _ = _findings()
    assert problems == [], "\n".join(problems)


def test_every_allowed_exception_still_exists() -> None:
    """A stale entry would let a new statement of the same text through unseen."""
    _, used = _findings()
    assert sorted(set(ALLOWED) - used) == []


def test_the_scan_catches_interpolated_sql(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scanner itself: an f-string, a % and a .format statement are found."""
    import sys

    module = sys.modules[__name__]
    sample = tmp_path / "backends" / "x"
    sample.mkdir(parents=True)
    (sample / "bad.py").write_text(
        "def f(conn, run_id, QUERIES):\n"
        "    conn.execute(f\"SELECT * FROM dagwerk_runs WHERE run_id = '{run_id}'\")\n"
        "    conn.execute(\"DELETE FROM t WHERE id = '%s'\" % run_id)\n"
        '    conn.execute("UPDATE t SET a = {}".format(run_id))\n'
        "    conn.execute(QUERIES['ok'], {'run_id': run_id})\n"
    )
    monkeypatch.setattr(module, "BACKENDS", tmp_path / "backends")
    problems, _ = _findings()
    assert len([p for p in problems if "execute(" in p]) == 3, problems
