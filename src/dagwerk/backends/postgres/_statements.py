"""Named blocks of the PostgreSQL query files, parsed for psycopg.

A block is one or more statements; every statement before the last is a
*lock prelude* (run in write transactions only, see ``queries.sql``). The
``:name`` parameters of the files become psycopg's ``%(name)s``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Statement", "exclusive_form", "parse_block", "statement_params"]

# ":name" outside "::" casts (the query files spell casts CAST(x AS t)).
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_PSYCOPG_PARAM = re.compile(rb"%\(([A-Za-z_]\w*)\)s")
_STATEMENT_END = re.compile(r";[ \t]*$", re.MULTILINE)
_JSON_PARAM = re.compile(r"CAST\(:([A-Za-z_]\w*) AS jsonb\)")


@dataclass(frozen=True, slots=True)
class Statement:
    """One named block: its lock preludes and its main statement (psycopg style)."""

    name: str
    preludes: tuple[bytes, ...]
    main: bytes
    json_params: frozenset[str]
    """Parameters cast to ``jsonb`` (JSON lists the statement expands)."""
    run_lock: int = 0
    """The strongest mode in which the block locks a run row (``RUN_LOCK_MODES``;
    0: it locks none)."""
    exclusive_preludes: tuple[bytes, ...] = ()
    """The preludes with every run-row lock in exclusive mode (the root run
    of a lineage in the mode exclusive blocks lock it in): what the block
    sends as the first locking block of a transaction that holds its run
    exclusively (see ``PostgresGateway.unit``)."""


RUN_LOCK_MODES = {"KEY SHARE": 1, "NO KEY UPDATE": 2, "UPDATE": 3}
"""The run-row lock modes of ``queries.sql`` (claim, completion, exclusive),
weakest first."""

# A statement that locks run rows themselves (not a join that locks others').
_RUN_LOCK = re.compile(
    r"^SELECT [\w, ]+ FROM dagwerk_runs\b(?:(?!JOIN).)*\bFOR (KEY SHARE|NO KEY UPDATE|UPDATE)$",
    re.DOTALL,
)


def run_lock_mode(statements: list[str]) -> int:
    """The strongest run-row lock mode among ``statements`` (0: none)."""
    found = (_RUN_LOCK.match(part) for part in statements)
    return max((RUN_LOCK_MODES[match.group(1)] for match in found if match), default=0)


_EXCLUSIVE_ROOT = "NO KEY UPDATE"
"""The lock an exclusive block takes on a lineage's root run (``run_status``)."""


def exclusive_form(statement: str) -> str:
    """``statement`` with its run-row lock, if any, in exclusive mode: the
    run itself ``FOR UPDATE``, a lineage's root ``FOR NO KEY UPDATE`` (or
    stronger, as given)."""
    match = _RUN_LOCK.match(statement)
    if match is None:
        return statement
    want = _EXCLUSIVE_ROOT if "root_run_id" in statement else "UPDATE"
    if RUN_LOCK_MODES[match.group(1)] >= RUN_LOCK_MODES[want]:
        return statement
    return statement[: match.start(1)] + want


def _psycopg_style(sql: str) -> bytes:
    return _PARAM.sub(r"%(\1)s", sql.replace("%", "%%")).encode("utf-8")


def code_of(sql: str) -> str:
    """``sql`` without its comment lines."""
    return "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))


def parse_block(name: str, sql: str) -> Statement:
    """Split a block at statement ends: every statement before the last is a
    lock prelude (run in write transactions only)."""
    code = code_of(sql)
    parts = [part.strip() for part in _STATEMENT_END.split(code)]
    parts = [part for part in parts if part]
    if not parts:
        raise ValueError(f"query {name!r} has no statement")
    *preludes, main = parts
    return Statement(
        name,
        tuple(_psycopg_style(p) for p in preludes),
        _psycopg_style(main),
        frozenset(_JSON_PARAM.findall(code)),
        run_lock_mode(parts),
        tuple(_psycopg_style(exclusive_form(p)) for p in preludes),
    )


def statement_params(statement: Statement) -> frozenset[str]:
    """The parameters the main statement of ``statement`` takes."""
    return frozenset(name.decode() for name in _PSYCOPG_PARAM.findall(statement.main))
