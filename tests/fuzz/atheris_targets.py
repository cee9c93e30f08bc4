"""Coverage-guided fuzz targets for atheris (libFuzzer).

Usage::

    python tests/fuzz/atheris_targets.py TARGET [libFuzzer flags, e.g. -runs=2000]

``TARGET`` is one of ``expressions``, ``pipeline_file`` or ``json``. Each
target swallows only the errors the API documents (``DagwerkError``
subclasses, plus ``pydantic.ValidationError`` where a model validates its
own input); any other exception escapes and libFuzzer reports it as a crash
with a reproducer file.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable

import atheris

with atheris.instrument_imports():
    import pydantic

    from dagwerk.errors import DagwerkError
    from dagwerk.expressions import (
        EvaluationBudget,
        resolve_expression,
        tokenize_expression,
        validate_expression,
    )
    from dagwerk.json import canonical_json_bytes, freeze_json
    from dagwerk.pipeline_file import parse_pipeline

DOCUMENTED_ERRORS: tuple[type[BaseException], ...] = (DagwerkError, pydantic.ValidationError)

#: Small JSON values the expression lookup hands back, chosen by key.
_LOOKUP_VALUES: tuple[object, ...] = (
    None,
    "text",
    "",
    0,
    -1.5,
    True,
    [1, "a", None],
    {"a": {"b": [1, 2]}, "c": "d"},
    "[1, 2]",
    '{"k": "v"}',
)


def _lookup(namespace: str, key: str) -> object | None:
    """Deterministic small JSON per (namespace, key); never raises."""
    index = sum(map(ord, namespace + key)) % len(_LOOKUP_VALUES)
    return _LOOKUP_VALUES[index]


def _text(data: bytes) -> str:
    # surrogateescape keeps every input byte, so invalid UTF-8 becomes lone
    # surrogates: hostile text the library must reject cleanly.
    return data.decode("utf-8", errors="surrogateescape")


def fuzz_expressions(data: bytes) -> None:
    """Tokenize, validate and resolve arbitrary expression text."""
    expression = _text(data)
    with contextlib.suppress(DagwerkError):
        tokenize_expression(expression)
    problem = validate_expression(expression)
    if problem is not None and not isinstance(problem, str):
        raise AssertionError(f"validate_expression returned {problem!r}")
    with contextlib.suppress(DagwerkError):
        resolve_expression(expression, _lookup, budget=EvaluationBudget(1 << 20))


def fuzz_pipeline_file(data: bytes) -> None:
    """Parse arbitrary text as a YAML and as a JSON pipeline file."""
    text = _text(data)
    for source_format in ("yaml", "json"):
        with contextlib.suppress(*DOCUMENTED_ERRORS):
            parse_pipeline(text, source=f"fuzz.{source_format}", source_format=source_format)


def fuzz_json(data: bytes) -> None:
    """Freeze arbitrary parsed JSON and check its canonical form is a fixed point."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        # The stdlib parser rejected the bytes; dagwerk never saw them.
        return
    try:
        frozen = freeze_json(value)
        canonical = canonical_json_bytes(frozen)
    except DagwerkError:
        return
    again = canonical_json_bytes(freeze_json(json.loads(canonical)))
    if again != canonical:
        raise AssertionError(f"canonical form is not stable: {canonical!r} -> {again!r}")


TARGETS: dict[str, Callable[[bytes], None]] = {
    "expressions": fuzz_expressions,
    "pipeline_file": fuzz_pipeline_file,
    "json": fuzz_json,
}


def main(argv: list[str]) -> None:
    """Run the target named by ``argv[1]``; the rest goes to libFuzzer."""
    if len(argv) < 2 or argv[1] not in TARGETS:
        sys.exit(f"usage: {argv[0]} {{{','.join(TARGETS)}}} [libFuzzer flags]")
    target = TARGETS[argv[1]]
    atheris.Setup([argv[0], *argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
