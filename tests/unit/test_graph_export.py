"""Mermaid and DOT pictures of a pipeline: structure and label escaping."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagwerk.constants import InputMode, InputRole, SortOrder
from dagwerk.errors import GraphValidationError
from dagwerk.graph_export import to_dot, to_mermaid
from dagwerk.models import DagNode, EdgeFilter, FilterRule, InputEdge, Selection
from dagwerk.pipeline_file import load_pipeline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pipelines"

MERMAID_NODE = re.compile(r'^    n(\d+)\["([^"]*)"\]$')
MERMAID_EDGE = re.compile(r'^    n(\d+) (-->|-\.->)\|"([^"]*)"\| n(\d+)$')
DOT_NODE = re.compile(r'^    n(\d+) \[label="((?:[^"\\]|\\.)*)"\];$')
DOT_EDGE = re.compile(r'^    n(\d+) -> n(\d+) \[label="((?:[^"\\]|\\.)*)"(.*)\];$')


def mermaid_decode(label: str) -> str:
    return re.sub(r"#(\d+);", lambda match: chr(int(match.group(1))), label)


def dot_decode(label: str) -> str:
    return re.sub(r"\\(.)", lambda match: match.group(1), label)


def sample_nodes() -> list[DagNode]:
    return [
        DagNode(slug="load", plugin="loader"),
        DagNode(slug="settings", plugin="conf"),
        DagNode(
            slug="each",
            plugin="work",
            input_mode=InputMode.EACH,
            edges=(
                InputEdge(
                    name="records",
                    source="load",
                    filter=EdgeFilter(rules=(FilterRule(field="ok", operator="exists"),)),
                ),
                InputEdge(name="conf", source="settings", role=InputRole.SIDE, required=False),
            ),
        ),
        DagNode(
            slug="sum",
            plugin="sum",
            input_mode=InputMode.ALL,
            edges=(
                InputEdge(
                    name="results",
                    source="each",
                    selection=Selection(field="score", order=SortOrder.DESC, limit=2),
                ),
                InputEdge(name="extra", source="load", required=False),
            ),
        ),
    ]


def test_mermaid_shows_every_node_and_every_labelled_edge() -> None:
    nodes = sample_nodes()
    lines = to_mermaid(nodes).splitlines()
    assert lines[0] == "flowchart LR"
    labels = {int(m[1]): m[2] for line in lines if (m := MERMAID_NODE.match(line))}
    assert sorted(labels) == [0, 1, 2, 3]
    assert labels[0].split("<br/>") == ["load", "plugin: loader", "mode: all"]
    assert labels[2].split("<br/>") == ["each", "plugin: work", "mode: each"]
    edges = [m.groups() for line in lines if (m := MERMAID_EDGE.match(line))]
    assert len(edges) == sum(len(node.edges) for node in nodes)
    assert len(lines) == 1 + len(labels) + len(edges)
    by_label = {mermaid_decode(label).split(" ")[0]: (s, a, t) for s, a, label, t in edges}
    assert by_label["records"] == ("0", "-->", "2")
    assert by_label["conf"] == ("1", "-.->", "2")
    assert by_label["results"] == ("2", "-->", "3")
    assert by_label["extra"] == ("0", "-->", "3")
    decoded = {mermaid_decode(label) for _, _, label, _ in edges}
    assert "records (filtered)" in decoded
    assert "conf (side, optional)" in decoded
    assert "results (top 2 by score desc)" in decoded
    assert "extra (optional)" in decoded


def test_dot_shows_every_node_and_every_labelled_edge() -> None:
    nodes = sample_nodes()
    text = to_dot(nodes, title="demo")
    lines = text.splitlines()
    assert lines[0] == 'digraph "demo" {'
    assert lines[-1] == "}"
    labels = {int(m[1]): m[2] for line in lines if (m := DOT_NODE.match(line))}
    assert labels[3] == "sum\\nplugin: sum\\nmode: all"
    edges = {dot_decode(m[3]): m.groups() for line in lines if (m := DOT_EDGE.match(line))}
    assert len(edges) == 4
    assert edges["records (filtered)"][:2] == ("0", "2")
    conf = edges["conf (side, optional)"]
    assert conf[:2] == ("1", "2")
    assert "style=dashed" in conf[3]
    assert "arrowhead=odot" in conf[3]
    assert "style=dashed" not in edges["extra (optional)"][3]
    assert "arrowhead=odot" in edges["extra (optional)"][3]
    assert edges["results (top 2 by score desc)"][3] == ""


def test_the_etl_example_draws_all_three_modes() -> None:
    pipeline = load_pipeline(EXAMPLES / "etl.yaml")
    mermaid = to_mermaid(pipeline.nodes)
    dot = to_dot(pipeline.nodes, title=pipeline.name)
    for mode in ("each", "all", "by_correlation"):
        assert f"mode: {mode}" in mermaid
        assert f"mode: {mode}" in dot
    for node in pipeline.nodes:
        for edge in node.edges:
            assert edge.name in mermaid
            assert edge.name in dot


HOSTILE = [
    'quote"d',
    "new\nline",
    "<script>alert(1)</script>",
    "pipe|bracket]end",
    "hash#35;entity",
    "back\\slash\\N",
    "Zürich→東京 🚀",
    "bidi\u202eevil",
]


@pytest.mark.parametrize("slug", HOSTILE)
def test_hostile_labels_are_escaped_in_mermaid(slug: str) -> None:
    nodes = [DagNode(slug=slug, plugin='plug"in')]
    lines = to_mermaid(nodes).splitlines()
    assert len(lines) == 2
    match = MERMAID_NODE.match(lines[1])
    assert match is not None, lines[1]
    label = match[2]
    assert "<script" not in label
    assert not re.search(r"[\x00-\x1f\u202e|\[\]]", label)
    first, plugin, _ = mermaid_decode(label).split("<br/>")
    visible = slug.replace("\n", "\\n").replace("\u202e", "\\u202e")
    assert first == visible
    assert plugin == 'plugin: plug"in'
    if slug.startswith("Zürich"):
        assert "Zürich→東京" in label


@pytest.mark.parametrize("slug", HOSTILE)
def test_hostile_labels_are_escaped_in_dot(slug: str) -> None:
    nodes = [DagNode(slug=slug, plugin="p")]
    lines = to_dot(nodes, title='ti"tle\n').splitlines()
    assert lines[0] == 'digraph "ti\\"tle\\\\n" {'
    node_lines = [m for line in lines if (m := DOT_NODE.match(line))]
    assert len(node_lines) == 1
    first = node_lines[0][2].split("\\nplugin: ")[0]
    visible = slug.replace("\n", "\\n").replace("\u202e", "\\u202e")
    assert dot_decode(first) == visible


@settings(max_examples=150, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_any_slug_round_trips_through_both_formats(slug: str) -> None:
    visible = re.sub(
        "[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]",
        lambda m: m.group().encode("unicode_escape").decode(),
        slug,
    )
    mermaid_line = to_mermaid([DagNode(slug=slug, plugin="p")]).splitlines()[1]
    match = MERMAID_NODE.match(mermaid_line)
    assert match is not None
    assert mermaid_decode(match[2]).split("<br/>")[0] == visible
    dot_lines = to_dot([DagNode(slug=slug, plugin="p")]).splitlines()
    dot_match = next(m for line in dot_lines if (m := DOT_NODE.match(line)))
    assert dot_decode(dot_match[2].split("\\nplugin: ")[0]) == visible


def test_invalid_pipelines_are_not_drawn() -> None:
    nodes = [
        DagNode(slug="a", plugin="p", input_mode="all", edges=(InputEdge(name="r", source="x"),))
    ]
    with pytest.raises(GraphValidationError, match="unknown source"):
        to_mermaid(nodes)
    with pytest.raises(GraphValidationError, match="unknown source"):
        to_dot(nodes)


def test_mermaid_direction_is_checked() -> None:
    nodes = [DagNode(slug="a", plugin="p")]
    assert to_mermaid(nodes, direction="TB").startswith("flowchart TB\n")
    with pytest.raises(ValueError, match="direction"):
        to_mermaid(nodes, direction="LR; click n0 call alert()")
