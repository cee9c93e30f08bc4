"""Pictures of a pipeline: Mermaid flowcharts and Graphviz DOT.

Each node shows its slug, its plugin and its input mode (a root reads as
``all``). Each input edge is an arrow from the source node to the consumer,
labelled with the edge name; side edges are dashed, optional edges say
``optional``, and edges with a filter or a selection say so. Node IDs in the
output are ``n0``, ``n1``, ... (the node's index), so no user text is ever
used as an identifier; every label is escaped for its format, control
characters are shown as escapes (``\\n``), and other Unicode is kept.

The pipeline is validated first (:func:`dagwerk.graph.validate_graph`), so
an invalid pipeline raises :class:`~dagwerk.errors.GraphValidationError`
instead of producing a misleading picture.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from dagwerk.constants import InputMode, InputRole
from dagwerk.graph import validate_graph
from dagwerk.models import DagNode, InputEdge

__all__ = ["to_dot", "to_mermaid"]

# Characters Mermaid shows as they are inside a quoted label; everything else
# that is ASCII becomes a numeric entity (``#34;``), so quotes, brackets,
# pipes, ``<``/``>`` and ``#`` can neither end the label nor inject markup.
_MERMAID_PLAIN: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,:/()+=?!*'@"
)


# Control characters, line/paragraph separators and bidi overrides would
# break a label or reorder it; they are shown as Python escapes instead.
_INVISIBLE: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _visible(text: str) -> str:
    return _INVISIBLE.sub(lambda match: match.group().encode("unicode_escape").decode(), text)


@dataclass(frozen=True)
class _Arrow:
    source: int
    target: int
    label: str
    side: bool
    optional: bool


def _arrows(nodes: Sequence[DagNode]) -> list[_Arrow]:
    index = {node.slug: position for position, node in enumerate(nodes)}
    return [
        _Arrow(
            source=index[edge.source],
            target=target,
            label=_edge_label(edge),
            side=edge.role is InputRole.SIDE,
            optional=not edge.required,
        )
        for target, node in enumerate(nodes)
        for edge in node.edges
    ]


def _edge_label(edge: InputEdge) -> str:
    notes: list[str] = []
    if edge.role is InputRole.SIDE:
        notes.append("side")
    if not edge.required:
        notes.append("optional")
    if edge.filter is not None and edge.filter.rules:
        notes.append("filtered")
    if edge.selection is not None:
        selection = edge.selection
        notes.append(f"top {selection.limit} by {selection.field} {selection.order.value}")
    return f"{edge.name} ({', '.join(notes)})" if notes else edge.name


def _node_lines(node: DagNode) -> list[str]:
    mode = node.input_mode or InputMode.ALL
    return [node.slug, f"plugin: {node.plugin}", f"mode: {mode.value}"]


def _mermaid_text(text: str) -> str:
    out: list[str] = []
    for char in _visible(text):
        if char in _MERMAID_PLAIN or (ord(char) > 127 and char.isprintable()):
            out.append(char)
        else:
            out.append(f"#{ord(char)};")
    return "".join(out)


def to_mermaid(nodes: Sequence[DagNode], *, direction: str = "LR") -> str:
    """A Mermaid ``flowchart`` of ``nodes``; ``direction`` is LR, RL, TB or BT."""
    if direction not in ("LR", "RL", "TB", "BT"):
        raise ValueError(f"direction must be LR, RL, TB or BT, not {direction!r}")
    validate_graph(nodes)
    lines = [f"flowchart {direction}"]
    for position, node in enumerate(nodes):
        label = "<br/>".join(_mermaid_text(line) for line in _node_lines(node))
        lines.append(f'    n{position}["{label}"]')
    for arrow in _arrows(nodes):
        link = "-.->" if arrow.side else "-->"
        lines.append(f'    n{arrow.source} {link}|"{_mermaid_text(arrow.label)}"| n{arrow.target}')
    return "\n".join(lines) + "\n"


def _dot_text(text: str) -> str:
    # Inside a DOT quoted string only backslash and double quote are special;
    # doubling the backslash also disarms DOT's label escapes (\N, \G, \l).
    return _visible(text).replace("\\", "\\\\").replace('"', '\\"')


def to_dot(nodes: Sequence[DagNode], *, title: str = "pipeline") -> str:
    """A Graphviz ``digraph`` of ``nodes`` named ``title``."""
    validate_graph(nodes)
    lines = [
        f'digraph "{_dot_text(title)}" {{',
        "    rankdir=LR;",
        '    node [shape=box, style=rounded, fontname="Helvetica"];',
        '    edge [fontname="Helvetica"];',
    ]
    for position, node in enumerate(nodes):
        # "\n" between lines is DOT's centred line break, added after escaping.
        label = "\\n".join(_dot_text(line) for line in _node_lines(node))
        lines.append(f'    n{position} [label="{label}"];')
    for arrow in _arrows(nodes):
        attributes = [f'label="{_dot_text(arrow.label)}"']
        if arrow.side:
            attributes.append("style=dashed")
        if arrow.optional:
            attributes.append("arrowhead=odot")
        lines.append(f"    n{arrow.source} -> n{arrow.target} [{', '.join(attributes)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
