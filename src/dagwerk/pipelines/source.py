"""Reading a pipeline file into plain JSON values, safely and with line numbers.

A pipeline file is untrusted text. Reading it is bounded before any parser
runs: at most :data:`MAX_PIPELINE_FILE_BYTES` bytes are read, NUL bytes and
invalid UTF-8 are refused, and container nesting deeper than
:data:`MAX_PIPELINE_NESTING` is refused before a recursive parser could see
it. YAML is read with the safe loader only; anchors, aliases, merge keys,
custom tags, several documents and non-JSON scalars (dates, binary) are
refused, so a file can neither expand exponentially nor build objects.

Every mapping key and sequence item keeps the 1-based line it starts on, so
a later validation error can point at the line of the field at fault.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, TypeAlias

import yaml

from dagwerk.errors import DagwerkError
from dagwerk.json import first_too_deep

__all__ = [
    "MAX_PIPELINE_FILE_BYTES",
    "MAX_PIPELINE_NESTING",
    "MAX_REPORTED_PROBLEMS",
    "FieldPath",
    "PipelineFileError",
    "SourceDocument",
    "one_line",
    "parse_source_text",
    "read_source",
]

MAX_PIPELINE_FILE_BYTES: Final = 4 * 1024 * 1024
# Deep enough for a routing JSON value (16 levels) under nodes[i].edges[j]
# .filter.rules[k].value, shallow enough for any recursive parser.
MAX_PIPELINE_NESTING: Final = 32

SourceFormat: TypeAlias = Literal["yaml", "json"]
FieldPath: TypeAlias = tuple[str | int, ...]

_YAML_LOADER: Final = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_PREFIX: Final = "tag:yaml.org,2002:"
_SCALAR_TAGS: Final = frozenset(
    _YAML_PREFIX + name for name in ("str", "int", "float", "bool", "null")
)
_COLLECTION_TAGS: Final = frozenset((_YAML_PREFIX + "map", _YAML_PREFIX + "seq"))
# Characters that would break a one-line message or fool a terminal: C0/C1
# controls, line and paragraph separators, and bidirectional overrides.
_UNSAFE_TEXT: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def one_line(text: str) -> str:
    """``text`` with control and bidi characters shown as escapes, so it is one safe line."""
    return _UNSAFE_TEXT.sub(lambda match: match.group().encode("unicode_escape").decode(), text)


MAX_REPORTED_PROBLEMS: Final = 20
"""A :class:`PipelineFileError` lists at most this many problems of one file."""


class PipelineFileError(DagwerkError, ValueError):
    """A pipeline file cannot be read or is not a valid pipeline.

    The message is one line: ``file:line: node 'slug', field 'path': reason``,
    leaving out the parts that do not apply. ``path``, ``line``, ``node``,
    ``field`` and ``rule`` hold the same facts for programs; ``reason`` is
    the message without the location.

    A file with several problems raises one error for the first (its message
    ends ``(and N more problems)``); ``problems`` holds each problem as its
    own error, the first included, at most :data:`MAX_REPORTED_PROBLEMS` of
    them, and ``problem_count`` how many there are in all. A single problem
    is ``problems == (self,)``.
    """

    code = "pipeline_invalid"

    def __init__(
        self,
        reason: str,
        *,
        path: str,
        line: int | None = None,
        node: str | None = None,
        field: str | None = None,
        rule: str = "invalid",
        limit: int | None = None,
    ) -> None:
        location = f"{path}:{line}" if line is not None else path
        subject = []
        if node is not None:
            subject.append(f"node '{node}'")
        if field is not None:
            subject.append(f"field '{field}'")
        prefix = f"{location}: " + (", ".join(subject) + ": " if subject else "")
        super().__init__(one_line(prefix + reason), field=field, limit=limit)
        self.path = path
        self.line = line
        self.node = node
        self.rule = rule
        self.reason = one_line(reason)
        self.problems: tuple[PipelineFileError, ...] = (self,)
        self.problem_count = 1


@dataclass
class SourceDocument:
    """A parsed pipeline file: plain JSON ``data`` and the line of each field.

    ``line_of(path)`` returns the line of the deepest known prefix of
    ``path`` (a tuple of mapping keys and sequence indices), or ``None``.
    """

    path: str
    format: SourceFormat
    data: object
    text: str
    _lines: dict[FieldPath, int] | None = field(default=None, repr=False)

    def line_of(self, path: FieldPath) -> int | None:
        if self._lines is None:
            # JSON is parsed by the json module, which keeps no positions.
            # Lines are only needed for an error, so the (slower) YAML
            # composer maps them then; JSON it cannot read gets no lines.
            try:
                self._lines = _yaml_document(self.text, self.path)[1]
            except PipelineFileError:
                self._lines = {}
        for size in range(len(path), -1, -1):
            line = self._lines.get(path[:size])
            if line is not None:
                return line
        return None


def _line_at(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _decode(data: bytes, path: str) -> str:
    nul = data.find(b"\x00")
    if nul >= 0:
        raise PipelineFileError(
            "contains a NUL byte; pipeline files are UTF-8 text",
            path=path,
            line=_line_at(data, nul),
            rule="binary_file",
        )
    body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        offset = error.start + (len(data) - len(body))
        raise PipelineFileError(
            f"invalid UTF-8 at byte offset {offset}; pipeline files are UTF-8 text",
            path=path,
            line=_line_at(data, offset),
            rule="invalid_utf8",
        ) from None


def _format_for(path: str, text: str) -> SourceFormat:
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    return "json" if text.lstrip().startswith("{") else "yaml"


def read_source(file: str | os.PathLike[str]) -> SourceDocument:
    """Read and parse the pipeline file ``file`` (YAML, or JSON for ``.json``).

    Raises :class:`PipelineFileError` when the file cannot be read, is not a
    regular file, is larger than :data:`MAX_PIPELINE_FILE_BYTES`, is not
    UTF-8 text, or does not parse within the limits described above.
    """
    path = os.fspath(file)
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise block
        # forever; the fstat below then refuses it (no effect on files).
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            regular = stat.S_ISREG(os.fstat(descriptor).st_mode)
        except OSError:
            os.close(descriptor)
            raise
        if not regular:
            os.close(descriptor)
            raise PipelineFileError("is not a regular file", path=path, rule="not_a_file")
        with os.fdopen(descriptor, "rb") as handle:
            # One byte past the limit tells an oversize file apart without
            # reading all of it (or forever, for /dev/zero).
            data = handle.read(MAX_PIPELINE_FILE_BYTES + 1)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise PipelineFileError(
            f"cannot read file: {reason}", path=path, rule="unreadable"
        ) from None
    if len(data) > MAX_PIPELINE_FILE_BYTES:
        raise PipelineFileError(
            f"file is larger than {MAX_PIPELINE_FILE_BYTES} bytes",
            path=path,
            rule="file_too_large",
            limit=MAX_PIPELINE_FILE_BYTES,
        )
    text = _decode(data, path)
    return parse_source_text(text, path=path, source_format=_format_for(path, text))


def parse_source_text(
    text: str, *, path: str = "<string>", source_format: SourceFormat = "yaml"
) -> SourceDocument:
    """Parse pipeline text already in memory (same limits as :func:`read_source`)."""
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_PIPELINE_FILE_BYTES:
        raise PipelineFileError(
            f"file is larger than {MAX_PIPELINE_FILE_BYTES} bytes",
            path=path,
            rule="file_too_large",
            limit=MAX_PIPELINE_FILE_BYTES,
        )
    if "\x00" in text:
        raise PipelineFileError(
            "contains a NUL character; pipeline files are text",
            path=path,
            line=text.count("\n", 0, text.index("\x00")) + 1,
            rule="binary_file",
        )
    # Text from memory can hold lone surrogates, which no UTF-8 file can:
    # the YAML parser would fail on them with UnicodeEncodeError.
    surrogate = _LONE_SURROGATE.search(text)
    if surrogate is not None:
        raise PipelineFileError(
            "contains a lone surrogate; pipeline text must be valid Unicode",
            path=path,
            line=text.count("\n", 0, surrogate.start()) + 1,
            rule="invalid_utf8",
        )
    if source_format == "json":
        return SourceDocument(path, "json", _parse_json(text, path), text)
    data, lines = _yaml_document(text, path)
    return SourceDocument(path, "yaml", data, text, lines)


# --- JSON -------------------------------------------------------------------


def _check_json_nesting(text: str, path: str) -> None:
    offset = first_too_deep(text, MAX_PIPELINE_NESTING)
    if offset is not None:
        raise PipelineFileError(
            f"nesting is deeper than {MAX_PIPELINE_NESTING} levels",
            path=path,
            line=text.count("\n", 0, offset) + 1,
            rule="too_deep",
            limit=MAX_PIPELINE_NESTING,
        )


def _parse_json(text: str, path: str) -> object:
    _check_json_nesting(text, path)

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        result: dict[str, object] = {}
        for key, value in items:
            if key in result:
                raise _JsonProblem(f"duplicate key {key!r}")
            result[key] = value
        return result

    def constant(name: str) -> object:
        raise _JsonProblem(f"{name} is not a JSON number")

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as error:
        raise PipelineFileError(
            f"invalid JSON: {error.msg} (column {error.colno})",
            path=path,
            line=error.lineno,
            rule="syntax",
        ) from None
    except (_JsonProblem, ValueError, RecursionError) as error:
        raise PipelineFileError(f"invalid JSON: {error}", path=path, rule="syntax") from None


class _JsonProblem(Exception):
    pass


# --- YAML -------------------------------------------------------------------


def _mark_line(mark: object) -> int | None:
    # libyaml and the pure-Python parser use different Mark classes.
    line = getattr(mark, "line", None)
    return line + 1 if isinstance(line, int) else None


def _check_yaml_events(text: str, path: str) -> None:
    """Refuse anchors, aliases, foreign tags, deep nesting and several documents.

    The event stream is flat, so this check is not itself recursive and runs
    before the composer (which recurses and would expand aliases).
    """
    depth = 0
    documents = 0
    for event in yaml.parse(text, Loader=_YAML_LOADER):
        line = _mark_line(event.start_mark)
        if isinstance(event, yaml.AliasEvent):
            raise PipelineFileError(
                "YAML aliases (*name) are not allowed in pipeline files",
                path=path,
                line=line,
                rule="yaml_alias",
            )
        if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            raise PipelineFileError(
                "YAML anchors (&name) are not allowed in pipeline files",
                path=path,
                line=line,
                rule="yaml_alias",
            )
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise PipelineFileError(
                    "a pipeline file holds one YAML document",
                    path=path,
                    line=line,
                    rule="yaml_documents",
                )
        tag = getattr(event, "tag", None)
        if isinstance(event, yaml.ScalarEvent) and tag not in (None, "!", *_SCALAR_TAGS):
            raise _tag_error(tag, path, line)
        if isinstance(event, yaml.CollectionStartEvent):
            if tag not in (None, "!", *_COLLECTION_TAGS):
                raise _tag_error(tag, path, line)
            depth += 1
            if depth > MAX_PIPELINE_NESTING:
                raise PipelineFileError(
                    f"nesting is deeper than {MAX_PIPELINE_NESTING} levels",
                    path=path,
                    line=line,
                    rule="too_deep",
                    limit=MAX_PIPELINE_NESTING,
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _tag_error(tag: str | None, path: str, line: int | None) -> PipelineFileError:
    return PipelineFileError(
        f"YAML tag {tag!r} is not allowed; pipeline files hold plain JSON values",
        path=path,
        line=line,
        rule="yaml_tag",
    )


def _yaml_document(text: str, path: str) -> tuple[object, dict[FieldPath, int]]:
    try:
        _check_yaml_events(text, path)
        root = yaml.compose(text, Loader=_YAML_LOADER)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        problem = error.problem or error.context or "syntax error"
        raise PipelineFileError(
            f"invalid YAML: {problem}", path=path, line=_mark_line(mark), rule="syntax"
        ) from None
    except yaml.YAMLError as error:
        raise PipelineFileError(f"invalid YAML: {error}", path=path, rule="syntax") from None
    if root is None:
        raise PipelineFileError("file is empty", path=path, line=1, rule="empty_file")
    builder = _YamlBuilder(path)
    return builder.build(root, ()), builder.lines


class _YamlBuilder:
    """Turns a composed YAML node tree into plain JSON values, keeping lines.

    Recursion depth is bounded by the event check that ran first.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines: dict[FieldPath, int] = {(): 1}
        # A constructor for scalars only; it never sees a tag we did not allow.
        self._constructor = _YAML_LOADER("")

    def build(self, node: yaml.Node, at: FieldPath) -> object:
        if isinstance(node, yaml.MappingNode):
            result: dict[str, object] = {}
            for key_node, value_node in node.value:
                key = self._key(key_node)
                if key in result:
                    raise PipelineFileError(
                        f"duplicate key {key!r}",
                        path=self.path,
                        line=_mark_line(key_node.start_mark),
                        rule="duplicate_key",
                    )
                self.lines[(*at, key)] = key_node.start_mark.line + 1
                result[key] = self.build(value_node, (*at, key))
            return result
        if isinstance(node, yaml.SequenceNode):
            items: list[object] = []
            for index, item in enumerate(node.value):
                self.lines[(*at, index)] = item.start_mark.line + 1
                items.append(self.build(item, (*at, index)))
            return items
        return self._scalar(node)

    def _key(self, node: yaml.Node) -> str:
        value = self._scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(value, str):
            raise PipelineFileError(
                "mapping keys must be strings (quote it)",
                path=self.path,
                line=_mark_line(node.start_mark),
                rule="key_type",
            )
        return value

    def _scalar(self, node: yaml.Node) -> object:
        line = _mark_line(node.start_mark)
        if node.tag not in _SCALAR_TAGS:
            kind = node.tag.removeprefix(_YAML_PREFIX)
            raise PipelineFileError(
                f"a YAML {kind} is not a JSON value; quote it to make it a string",
                path=self.path,
                line=line,
                rule="yaml_tag",
            )
        try:
            value = self._constructor.construct_object(node, deep=True)
        except (ValueError, yaml.YAMLError) as error:
            raise PipelineFileError(
                f"invalid value: {error}", path=self.path, line=line, rule="value"
            ) from None
        if isinstance(value, float) and not math.isfinite(value):
            raise PipelineFileError(
                "non-finite numbers are not JSON values", path=self.path, line=line, rule="value"
            )
        return value
