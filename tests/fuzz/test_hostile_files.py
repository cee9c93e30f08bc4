"""Hostile YAML and JSON pipeline files.

``load_pipeline`` (a file) and ``parse_pipeline`` (text) give a
:class:`~dagwerk.pipeline_file.Pipeline` or raise
:class:`~dagwerk.pipeline_file.PipelineFileError` — a ``DagwerkError`` —
and nothing else (no ``yaml.YAMLError``, ``RecursionError``,
``UnicodeDecodeError``, ``pydantic.ValidationError``), within the call
budget. The inputs: arbitrary bytes and text, a valid pipeline mutated at
random and dumped as YAML or JSON, and the known attacks on parsers (alias
bombs, 10^5-deep nesting, huge numbers, NaN, invalid UTF-8, NUL, Python
tags, 10 MB files, special files).
"""

from __future__ import annotations

import copy
import json
import os
import random
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from dagwerk.errors import DagwerkError
from dagwerk.pipeline_file import (
    MAX_PIPELINE_FILE_BYTES,
    Pipeline,
    PipelineFileError,
    load_pipeline,
    parse_pipeline,
)

from .conftest import FUZZ, Rejected, bounded, hostile_json, hostile_text

ONLY_DAGWERK = (DagwerkError,)

VALID: dict[str, Any] = {
    "name": "fuzz",
    "failure_policy": "fail_fast",
    "defaults": {"since": "2024-01-01"},
    "nodes": [
        {
            "slug": "extract",
            "plugin": "extract",
            "bindings": {"since": {"source": "runtime", "key": "since"}},
        },
        {
            "slug": "clean",
            "plugin": "clean",
            "input_mode": "each",
            "edges": [
                {
                    "name": "orders",
                    "source": "extract",
                    "filter": {"rules": [{"field": "amount", "operator": "gt", "value": 0}]},
                }
            ],
            "bindings": {"title": {"source": "expression", "expression": "{orders.title | trim}"}},
        },
        {
            "slug": "report",
            "plugin": "report",
            "input_mode": "all",
            "edges": [
                {"name": "rows", "source": "clean", "selection": {"field": "amount", "limit": 3}}
            ],
            "retry": {"max_attempts": 3, "backoff_base": 0.5, "backoff_max": 2},
        },
    ],
}


def _parse(text: str, source_format: str) -> Pipeline | Rejected:
    return bounded(
        lambda: parse_pipeline(text, source=f"fuzz.{source_format}", source_format=source_format),  # type: ignore[arg-type]
        allowed=ONLY_DAGWERK,
    )


def _load(path: Path) -> Pipeline | Rejected:
    return bounded(lambda: load_pipeline(path), allowed=ONLY_DAGWERK)


def _paths(value: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every path into ``value`` (containers and leaves)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_paths(item, (*prefix, index)))
    return found


def _replace(document: dict[str, Any], path: tuple[object, ...], new: object) -> object:
    if not path:
        return new
    target: Any = document
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return document


def _dump(value: object, source_format: str) -> str | None:
    """YAML or JSON text of ``value``; ``None`` when the dumper itself refuses it."""
    try:
        if source_format == "json":
            return json.dumps(value, allow_nan=True, default=repr)
        return yaml.safe_dump(value, allow_unicode=True)
    except (TypeError, ValueError, yaml.YAMLError, RecursionError):
        return None


# --- properties ---------------------------------------------------------------------


def test_the_valid_pipeline_loads_in_both_formats() -> None:
    """The mutation base is valid, so mutations test rejections, not typos."""
    for source_format in ("json", "yaml"):
        text = _dump(VALID, source_format)
        assert text is not None
        result = _parse(text, source_format)
        assert isinstance(result, Pipeline), result
        assert [node.slug for node in result.nodes] == ["extract", "clean", "report"]


@FUZZ
@given(data=st.binary(max_size=400), suffix=st.sampled_from([".yaml", ".yml", ".json", ""]))
def test_arbitrary_bytes_as_a_file(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, suffix: str
) -> None:
    path = tmp_path_factory.mktemp("bytes") / f"pipeline{suffix}"
    path.write_bytes(data)
    _load(path)


@FUZZ
@given(text=st.text(max_size=300) | hostile_text, source_format=st.sampled_from(["yaml", "json"]))
def test_arbitrary_text(text: str, source_format: str) -> None:
    _parse(text, source_format)


_YAML_TOKENS = st.sampled_from(
    [
        "nodes:",
        "- ",
        "  ",
        "\n",
        "slug: a",
        "plugin: p",
        "&a ",
        "*a",
        "!!python/object:os.system",
        "!!binary",
        "<<: *a",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "? ",
        "|",
        ">",
        "'",
        '"',
        "#",
        "---",
        "...",
        "%YAML 1.1",
        "%TAG ! tag:x:",
        "!x",
        "1e999",
        "0x1F",
        ".nan",
        ".inf",
        "~",
        "null",
        "edges:",
        "input_mode: each",
        "source: a",
        "name: e",
        "bindings:",
        "\t",
        "\ufeff",
        "\u2028",
    ]
)


@FUZZ
@given(tokens=st.lists(_YAML_TOKENS, max_size=40))
def test_yaml_shaped_token_soup(tokens: list[str]) -> None:
    _parse("".join(tokens), "yaml")


@FUZZ
@given(
    seed=st.integers(0, 2**32 - 1),
    new=hostile_json | hostile_text,
    source_format=st.sampled_from(["yaml", "json"]),
)
def test_a_valid_pipeline_mutated_at_random(seed: int, new: object, source_format: str) -> None:
    document = copy.deepcopy(VALID)
    path = random.Random(seed).choice(_paths(document))
    text = _dump(_replace(document, path, new), source_format)
    if text is not None:
        _parse(text, source_format)


@FUZZ
@given(seed=st.integers(0, 2**32 - 1), source_format=st.sampled_from(["yaml", "json"]))
def test_a_valid_pipeline_with_text_cut_or_spliced(seed: int, source_format: str) -> None:
    rng = random.Random(seed)
    text = _dump(VALID, source_format)
    assert text is not None
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(text) + 1)
        if rng.random() < 0.5:
            text = text[:at] + text[rng.randrange(at, len(text) + 1) :]
        else:
            text = (
                text[:at]
                + rng.choice(["{", "]", "&x ", "*x", "\x00", "\ud800", "'", ": :", "- -"])
                + text[at:]
            )
    _parse(text, source_format)


# --- the known attacks ---------------------------------------------------------------


def _bomb_line(i: int) -> str:
    """Level ``i + 1`` of the alias bomb: nine aliases of level ``i``."""
    this, previous = chr(98 + i), chr(97 + i)
    return f"{this}: &{this} [" + ", ".join([f"*{previous}"] * 9) + "]\n"


_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(_bomb_line(i) for i in range(9))

ATTACKS: dict[str, tuple[str, str]] = {
    "yaml alias bomb (billion laughs)": ("yaml", _BOMB),
    "yaml alias bomb under nodes": ("yaml", _BOMB + "nodes: *j\n"),
    "yaml python object tag": ("yaml", "nodes: !!python/object/apply:os.system ['true']\n"),
    "yaml python name tag": ("yaml", "name: !!python/name:os.system\nnodes: []\n"),
    "yaml custom tag": ("yaml", "name: !secret x\nnodes: []\n"),
    "yaml merge key": ("yaml", "base: &b {slug: a, plugin: p}\nnodes:\n  - <<: *b\n"),
    "yaml recursive alias": ("yaml", "nodes: &n [*n]\n"),
    "yaml duplicate keys": ("yaml", "nodes: []\nnodes: [{slug: a, plugin: p}]\n"),
    "yaml 10^5-deep flow lists": ("yaml", "nodes: " + "[" * 100_000 + "]" * 100_000),
    "yaml 10^5-deep flow maps": ("yaml", "nodes: " + "{a: " * 100_000 + "1" + "}" * 100_000),
    "yaml 10^4-deep block maps": ("yaml", "".join(" " * i + "a:\n" for i in range(10_000))),
    "yaml huge integer": (
        "yaml",
        "name: x\nnodes:\n  - {slug: a, plugin: p, timeout_seconds: " + "9" * 50_000 + "}\n",
    ),
    "yaml huge float": ("yaml", "nodes:\n  - {slug: a, plugin: p, timeout_seconds: 1e999999}\n"),
    "yaml nan": ("yaml", "nodes:\n  - {slug: a, plugin: p, timeout_seconds: .nan}\n"),
    "yaml document stream": ("yaml", "nodes: []\n---\nnodes: []\n"),
    "yaml bom and separators": ("yaml", "\ufeffname: \u2028x\u202e\nnodes: []\n"),
    "yaml lone surrogate": ("yaml", "name: \ud800\nnodes: []\n"),
    "yaml NUL": ("yaml", "name: a\x00b\nnodes: []\n"),
    "yaml empty": ("yaml", ""),
    "yaml scalar document": ("yaml", "42"),
    "yaml 12,000 nodes": ("yaml", "nodes:\n" + "  - {slug: a, plugin: p}\n" * 12_000),
    "json 10^5-deep lists": ("json", '{"nodes": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    "json 10^5-deep objects": (
        "json",
        '{"nodes": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}",
    ),
    "json NaN and Infinity": (
        "json",
        '{"nodes": [{"slug": "a", "plugin": "p", "timeout_seconds": NaN}]}',
    ),
    "json -Infinity": (
        "json",
        '{"nodes": [{"slug": "a", "plugin": "p", "timeout_seconds": -Infinity}]}',
    ),
    "json 50,000-digit integer": ("json", '{"nodes": [], "defaults": {"n": ' + "9" * 50_000 + "}}"),
    "json huge exponent": (
        "json",
        '{"nodes": [{"slug": "a", "plugin": "p", "timeout_seconds": 1e999999}]}',
    ),
    "json duplicate keys": ("json", '{"nodes": [], "nodes": [{"slug": "a", "plugin": "p"}]}'),
    "json lone surrogate escape": ("json", '{"name": "\\ud800", "nodes": []}'),
    "json NUL escape": (
        "json",
        '{"name": "a\\u0000b", "nodes": [{"slug": "a\\u0000", "plugin": "p"}]}',
    ),
    "json trailing garbage": ("json", '{"nodes": []} {"nodes": []}'),
    "json brackets in strings": ("json", '{"name": "' + "[" * 100_000 + '", "nodes": []}'),
    "json top-level array": ("json", "[]"),
}


#: Attacks that may legitimately load: a merge key is plain YAML, and NUL is
#: ordinary text in slugs and names (docs/reliability.md, "NUL bytes").
ACCEPTABLE = {"yaml merge key", "json NUL escape"}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_known_attack(name: str) -> None:
    source_format, text = ATTACKS[name]
    result = _parse(text, source_format)
    if name not in ACCEPTABLE:
        assert isinstance(result, Rejected), f"{name}: accepted"


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_invalid_utf8_and_binary_files(tmp_path: Path) -> None:
    cases = [
        b"name: \xff\xfe\nnodes: []\n",
        b"\xef\xbb\xbfname: x\nnodes: []\n\x80",
        b"\x00\x01\x02\x03" * 100,
        "name: é\nnodes: []\n".encode("utf-16"),
        b"name: \xed\xa0\x80\nnodes: []\n",  # an encoded surrogate
        b'{"name": "\xc3\x28", "nodes": []}',
    ]
    for index, data in enumerate(cases):
        for suffix in (".yaml", ".json"):
            result = _load(_write(tmp_path / f"bad{index}{suffix}", data))
            assert isinstance(result, Rejected), data[:40]


def test_a_10_mb_file_is_refused_without_parsing(tmp_path: Path) -> None:
    path = _write(tmp_path / "big.yaml", b"nodes:\n" + b"  - {slug: a, plugin: p}\n" * 420_000)
    assert path.stat().st_size > 10_000_000 > MAX_PIPELINE_FILE_BYTES
    result = _load(path)
    assert isinstance(result, Rejected)
    assert isinstance(result.error, PipelineFileError) and "larger than" in str(result.error)
    text_result = _parse("name: " + "x" * 10_000_000 + "\nnodes: []\n", "yaml")
    assert isinstance(text_result, Rejected) and "larger than" in str(text_result.error)


def test_directories_and_missing_files(tmp_path: Path) -> None:
    for path in (tmp_path, tmp_path / "missing.yaml", tmp_path / "missing" / "x.json"):
        assert isinstance(_load(path), Rejected)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_an_endless_device_is_refused_in_bounded_time() -> None:
    assert isinstance(_load(Path("/dev/zero")), Rejected)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX FIFOs")
def test_a_fifo_with_no_writer_does_not_hang(tmp_path: Path) -> None:
    """Opening a FIFO for reading blocks until a writer appears; the loader
    must refuse it instead of hanging on the open."""
    fifo = tmp_path / "pipeline.yaml"
    os.mkfifo(fifo)
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(_load(fifo)), daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():
        # Unblock the stuck open so the thread ends, then fail.
        with open(fifo, "wb"):
            pass
        thread.join(5)
        pytest.fail("load_pipeline blocked on a FIFO with no writer")
    (result,) = outcome
    assert isinstance(result, Rejected), result
