"""Set-based forms of the gateway's per-row statements (``set_writes.sql``).

:meth:`PostgresTx.many <dagwerk.backends.postgres._tx.PostgresTx.many>` runs a block
once per parameter set. On PostgreSQL a pipelined executemany costs client
work per row (every row is bound, queued and its result collected), which
made a busy worker CPU-bound on the client. For the blocks the worker's
batched writes use, ``set_writes.sql`` holds a form that takes all rows of
the call as one JSON array: one statement, one result.

A call takes the set form only when that cannot change what it does (see
:meth:`SetWrite.segments`); otherwise it runs one statement per row.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

from dagwerk.backends.sql.gateway import Params, load_queries

from ._statements import Statement, code_of, parse_block, statement_params

__all__ = ["SET_WRITES_PATH", "SetWrite", "load_set_writes"]

SET_WRITES_PATH = Path(__file__).with_name("set_writes.sql")

MAX_PAYLOAD_CHARS = 8 * 1024 * 1024
"""The longest JSON text one statement carries. A longer call is split into
several set statements in row order (a row longer on its own runs per row):
``jsonb`` holds at most 256 MiB, and a huge parameter would be held in
server memory several times over (text, ``jsonb``, the row set)."""

MIN_SET_ROWS = 2
"""The fewest rows a call sends as one set statement: for a single row the
block's own statement is cheaper on both sides (measured)."""

# The Python types whose JSON text converts back, in the column's SQL type,
# to the value the driver would send. bool is no int here (the driver sends
# a boolean, which a bigint column refuses), and a float is no bigint (the
# driver sends float8, which PostgreSQL compares as a float or rounds when
# it stores it; JSON "1.0" does not convert to bigint at all). None (JSON
# null, SQL NULL) is accepted for every column.
_TYPES: dict[str, frozenset[type]] = {
    "text": frozenset({str}),
    "bigint": frozenset({int}),
    "double precision": frozenset({float, int}),
}

_KEY = re.compile(r"^--\s*key:\s*(.+?)\s*$", re.MULTILINE)
_ROWS = "unnest(ARRAY(SELECT jsonb_array_elements(CAST(:rows AS jsonb))))"
_FILTER = "WHERE jsonb_typeof(e.v) = 'object'"
_RECORD = re.compile(r"jsonb_to_record\(e\.v\)\s+AS\s+j\s*\(([^()]*)\)")
_TARGET = re.compile(r"^\s*(?:INSERT INTO|UPDATE|DELETE FROM)\s+(\w+)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class SetWrite:
    """The set form of one block: its statement, the columns of the JSON
    rows (with the Python types each accepts) and the key columns."""

    name: str
    statement: Statement
    columns: tuple[tuple[str, frozenset[type]], ...]
    key: tuple[str, ...]
    table: str
    """The table the statement writes (tests check the key is unique there)."""

    def segments(self, rows: Sequence[Params]) -> list[str | list[Params]] | None:
        """How to send ``rows`` (checked parameter sets of the block): in row
        order, each segment a JSON payload for the set statement or a list
        of rows to run one by one; ``None`` when the call must run per row.

        ``None`` for fewer than :data:`MIN_SET_ROWS` rows, when a row lacks
        a parameter (the per-row path raises the driver's error), when a
        value is not of a type whose JSON form converts back exactly (or is
        a float that is not finite, or -0.0), or when two rows share a key:
        per-row statements apply such rows one after another, the set
        statement could not. A payload is at most :data:`MAX_PAYLOAD_CHARS`
        long; a longer call is split, a single longer row runs on its own.
        """
        if len(rows) < MIN_SET_ROWS:
            return None
        columns = self.columns
        items: list[dict[str, Any]] = []
        append = items.append
        try:
            for row in rows:
                item = {}
                for name, kinds in columns:
                    value = row[name]
                    if value is not None and type(value) not in kinds:
                        return None
                    if type(value) is float and not _exact(value):
                        return None
                    item[name] = value
                append(item)
        except KeyError:
            return None
        get_key = itemgetter(*self.key)
        if len(set(map(get_key, items))) != len(items):
            return None
        try:
            return _split(items, list(rows))
        except ValueError:  # no JSON form (ruled out above; kept as a guard)
            return None


def _exact(value: float) -> bool:
    """Whether a float survives JSON: NaN and the infinities have no JSON
    form, and JSON's -0.0 arrives as 0 (``jsonb`` numbers have no signed zero)."""
    return math.isfinite(value) and (value != 0.0 or math.copysign(1.0, value) > 0)


def _dumps(items: list[dict[str, Any]]) -> str:
    # ensure_ascii=False: characters travel as themselves, converted to the
    # server encoding as every text parameter is (a \u escape of a non-ASCII
    # character would fail in a database that is not UTF-8).
    return json.dumps(
        items, ensure_ascii=False, allow_nan=False, check_circular=False, separators=(",", ":")
    )


def _split(items: list[dict[str, Any]], rows: list[Params]) -> list[str | list[Params]]:
    text = _dumps(items)
    if len(text) <= MAX_PAYLOAD_CHARS:
        return [text]
    if len(items) == 1:
        return [rows]
    half = len(items) // 2
    return _split(items[:half], rows[:half]) + _split(items[half:], rows[half:])


def _columns(name: str, code: str) -> tuple[tuple[str, frozenset[type]], ...]:
    found = _RECORD.findall(code)
    if (
        code.count(_ROWS) != 1
        or len(found) != 1
        or _FILTER not in code
        or "OFFSET 0) AS r" not in code
    ):
        raise ValueError(f"set form {name!r} must read its rows once, as set_writes.sql describes")
    columns: list[tuple[str, frozenset[type]]] = []
    for definition in found[0].split(","):
        column, _, sql_type = definition.strip().partition(" ")
        kinds = _TYPES.get(" ".join(sql_type.split()).lower())
        if kinds is None:
            raise ValueError(f"set form {name!r}: column {column!r} has an unsupported type")
        columns.append((column, kinds))
    return tuple(columns)


def load_set_writes(path: Path, queries: Mapping[str, Statement]) -> dict[str, SetWrite]:
    """The set forms of ``path``, each checked against its block in
    ``queries``: same parameters, no lock prelude, a key among its columns."""
    found: dict[str, SetWrite] = {}
    for name, sql in load_queries(path).items():
        base = queries.get(name)
        if base is None:
            raise ValueError(f"set form {name!r} has no block in queries.sql")
        statement = parse_block(name, sql)
        if statement.preludes or base.preludes:
            raise ValueError(f"set form {name!r}: a block with a lock prelude runs with run()")
        if statement_params(statement) != {"rows"}:
            raise ValueError(f"set form {name!r} must take exactly one parameter, :rows")
        code = code_of(sql)
        columns = _columns(name, code)
        names = [column for column, _ in columns]
        if len(set(names)) != len(names) or set(names) != statement_params(base):
            raise ValueError(f"set form {name!r}: columns differ from the block's parameters")
        keys = _KEY.findall(sql)
        key = tuple(k.strip() for k in keys[0].split(",")) if len(keys) == 1 else ()
        if not key or not set(key) <= set(names):
            raise ValueError(f"set form {name!r} needs one '-- key:' line naming its columns")
        target = _TARGET.match(code)
        if target is None:
            raise ValueError(f"set form {name!r} must write one table (insert, update or delete)")
        found[name] = SetWrite(name, statement, columns, key, target.group(1))
    return found
