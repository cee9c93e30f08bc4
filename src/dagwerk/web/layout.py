"""The run page's DAG drawing: a layered layout and its SVG.

Layers by longest path from the roots (a node sits one layer right of its
deepest source), then, a few sweeps down and up, each layer ordered by the
barycentre (mean position) of each node's neighbours in the layer before.
Pure functions: no I/O, deterministic for a given graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

__all__ = [
    "NodeBox",
    "dag_svg",
    "gantt_svg",
    "layers_by_longest_path",
    "layout",
    "order_by_barycentre",
]

BOX_WIDTH = 190
BOX_HEIGHT = 58
GAP_X = 70
GAP_Y = 24
MARGIN = 12
SWEEPS = 4


def layers_by_longest_path(sources: Sequence[Sequence[int]]) -> list[int]:
    """The layer of each node: 0 for a root, else one more than its deepest
    source. ``sources[i]`` are the indices node ``i`` reads from (acyclic)."""
    layer: list[int | None] = [None] * len(sources)

    def depth(index: int) -> int:
        # Iterative, so a 1,000-node chain does not hit the recursion limit.
        stack = [index]
        while stack:
            current = stack[-1]
            pending = [s for s in sources[current] if layer[s] is None]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            if layer[current] is None:
                layer[current] = 1 + max((layer[s] or 0 for s in sources[current]), default=-1)
        found = layer[index]
        assert found is not None
        return found

    return [depth(index) for index in range(len(sources))]


def order_by_barycentre(
    layers: Sequence[int], sources: Sequence[Sequence[int]], *, sweeps: int = SWEEPS
) -> list[list[int]]:
    """Node indices per layer, each layer ordered to shorten edges: by the
    mean position of a node's sources (downward sweeps) or targets (upward
    sweeps); ties and nodes without neighbours keep their current order."""
    count = max(layers, default=-1) + 1
    rows: list[list[int]] = [[] for _ in range(count)]
    for index, layer in enumerate(layers):
        rows[layer].append(index)
    targets: list[list[int]] = [[] for _ in layers]
    for index, found in enumerate(sources):
        for source in found:
            targets[source].append(index)

    def reorder(row: list[int], neighbours: Sequence[Sequence[int]], pos: dict[int, int]) -> None:
        def key(item: tuple[int, int]) -> tuple[float, int]:
            place, index = item
            near = [pos[n] for n in neighbours[index] if n in pos]
            return (sum(near) / len(near) if near else float(place), place)

        row[:] = [index for _, index in sorted(enumerate(row), key=key)]

    for sweep in range(sweeps):
        down = sweep % 2 == 0
        span = range(1, count) if down else range(count - 2, -1, -1)
        for layer in span:
            other = rows[layer - 1] if down else rows[layer + 1]
            pos = {index: place for place, index in enumerate(other)}
            reorder(rows[layer], sources if down else targets, pos)
    return rows


@dataclass(frozen=True, slots=True)
class NodeBox:
    """One node as drawn: where, what it says and the state that colours it."""

    index: int
    slug: str
    state: str
    counts: str
    x: int
    y: int


def layout(sources: Sequence[Sequence[int]]) -> dict[int, tuple[int, int]]:
    """Top-left corner of each node's box."""
    layers = layers_by_longest_path(sources)
    rows = order_by_barycentre(layers, sources)
    tallest = max((len(row) for row in rows), default=0)
    height = tallest * (BOX_HEIGHT + GAP_Y)
    placed: dict[int, tuple[int, int]] = {}
    for layer, row in enumerate(rows):
        offset = (height - len(row) * (BOX_HEIGHT + GAP_Y)) // 2
        for place, index in enumerate(row):
            x = MARGIN + layer * (BOX_WIDTH + GAP_X)
            y = MARGIN + offset + place * (BOX_HEIGHT + GAP_Y)
            placed[index] = (x, y)
    return placed


def dag_svg(
    slugs: Sequence[str],
    sources: Sequence[Sequence[int]],
    states: Mapping[int, str],
    counts: Mapping[int, str],
    *,
    link: str = "?node={slug}",
) -> Markup:
    """The graph as an inline ``<svg>``: one box per node (class ``node
    state-STATE``, ``data-node`` the slug) with its counts, and one curve per
    edge. Every text is escaped."""
    placed = layout(sources)
    width = max((x for x, _ in placed.values()), default=0) + BOX_WIDTH + MARGIN
    height = max((y for _, y in placed.values()), default=0) + BOX_HEIGHT + MARGIN
    parts = [
        f'<svg class="dag" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="pipeline graph">'
    ]
    for index, found in enumerate(sources):
        tx, ty = placed[index]
        for source in found:
            sx, sy = placed[source]
            x1, y1 = sx + BOX_WIDTH, sy + BOX_HEIGHT // 2
            x2, y2 = tx, ty + BOX_HEIGHT // 2
            mid = (x1 + x2) // 2
            parts.append(f'<path class="edge" d="M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}"/>')
    for index, slug in enumerate(slugs):
        x, y = placed[index]
        state = states.get(index, "pending")
        href = escape(link.format(slug=slug))
        parts.append(
            f'<a href="{href}"><g class="node state-{escape(state)}" '
            f'data-node="{escape(slug)}" data-state="{escape(state)}">'
            f'<rect x="{x}" y="{y}" width="{BOX_WIDTH}" height="{BOX_HEIGHT}" rx="6"/>'
            f'<text class="slug" x="{x + 10}" y="{y + 22}">{escape(_clip(slug, 24))}</text>'
            f'<text class="counts" x="{x + 10}" y="{y + 44}">'
            f"{escape(_clip(counts.get(index, ''), 30))}</text>"
            f"<title>{escape(slug)}: {escape(state)}</title></g></a>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def _clip(text: str, size: int) -> str:
    return text if len(text) <= size else text[: size - 1] + "…"


def gantt_svg(
    rows: Sequence[tuple[str, float | None, float | None, int, str]], *, now: float
) -> Markup:
    """A timeline of attempts per node: one bar per ``(slug, first start,
    last finish, attempts, state)`` row from its first attempt's start to
    its last finish (``now`` while unfinished), on a shared time axis."""
    starts = [start for _, start, _, _, _ in rows if start is not None]
    if not starts:
        return Markup('<p class="muted">no attempt has started yet</p>')
    begin = min(starts)
    end = max(
        [now if finish is None else finish for _, start, finish, _, _ in rows if start is not None]
    )
    span = max(end - begin, 1e-3)
    label, bar, row_height = 170, 520, 22
    height = row_height * len(rows) + 24
    parts = [
        f'<svg class="gantt" xmlns="http://www.w3.org/2000/svg" width="{label + bar + 90}" '
        f'height="{height}" role="img" aria-label="timeline of attempts per node">'
    ]
    for place, (slug, start, finish, attempts, state) in enumerate(rows):
        y = place * row_height + 4
        parts.append(f'<text x="0" y="{y + 14}">{escape(_clip(slug, 22))}</text>')
        if start is None:
            continue
        stop = now if finish is None or finish < start else finish
        x = label + int((start - begin) / span * bar)
        width = max(2, int((stop - start) / span * bar))
        parts.append(
            f'<rect class="bar state-{escape(state)}" x="{x}" y="{y}" width="{width}" '
            f'height="{row_height - 6}" rx="3"><title>{escape(slug)}: {attempts} attempts, '
            f"{stop - start:.2f} s</title></rect>"
            f'<text class="muted" x="{x + width + 4}" y="{y + 14}">{attempts}×</text>'
        )
    parts.append(
        f'<text class="muted" x="{label}" y="{height - 4}">0 s</text>'
        f'<text class="muted" x="{label + bar - 40}" y="{height - 4}">{_seconds(span)}</text></svg>'
    )
    return Markup("".join(parts))
