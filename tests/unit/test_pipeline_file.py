"""Pipeline files: loading, error locations, hostile input and the JSON Schema."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import dagwerk
from dagwerk.constants import FailurePolicy, InputMode, InputRole
from dagwerk.errors import DagwerkError
from dagwerk.json import thaw_json
from dagwerk.models import EdgeSource, ExpressionSource, validate_edge_name
from dagwerk.pipeline_file import (
    MAX_PIPELINE_FILE_BYTES,
    MAX_PIPELINE_NESTING,
    Pipeline,
    PipelineFileError,
    load_pipeline,
    parse_pipeline,
    pipeline_json_schema,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pipelines"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml")) + sorted(EXAMPLES.glob("*.json"))


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def load_error(tmp_path: Path, content: str | bytes, name: str = "p.yaml") -> PipelineFileError:
    path = write(tmp_path, name, content)
    with pytest.raises(PipelineFileError) as caught:
        load_pipeline(path)
    error = caught.value
    assert str(path) in str(error)
    assert "\n" not in str(error)
    return error


# --- good files ---------------------------------------------------------------


def test_etl_example_uses_every_routing_feature() -> None:
    pipeline = load_pipeline(EXAMPLES / "etl.yaml")
    assert pipeline.name == "etl"
    assert pipeline.failure_policy is FailurePolicy.FAIL_FAST
    assert pipeline.defaults == {"since": "2024-01-01", "currency": "eur"}
    modes = {node.input_mode for node in pipeline.nodes}
    assert {InputMode.EACH, InputMode.ALL, InputMode.BY_CORRELATION} <= modes
    edges = [edge for node in pipeline.nodes for edge in node.edges]
    assert any(edge.filter is not None and edge.filter.rules for edge in edges)
    assert any(edge.selection is not None for edge in edges)
    assert any(edge.role is InputRole.SIDE and not edge.required for edge in edges)
    bindings = [binding for node in pipeline.nodes for binding in node.bindings.values()]
    assert any(isinstance(binding, ExpressionSource) for binding in bindings)
    assert any(isinstance(binding, EdgeSource) for binding in bindings)
    assert pipeline.root_slugs == ("extract", "settings")
    assert pipeline.edge_count == len(edges)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda path: path.name)
def test_every_shipped_example_loads(path: Path) -> None:
    pipeline = load_pipeline(path)
    assert pipeline.nodes
    assert pipeline.source == str(path)


def test_json_and_yaml_files_load_to_the_same_pipeline(tmp_path: Path) -> None:
    data = yaml.safe_load((EXAMPLES / "etl.yaml").read_text(encoding="utf-8"))
    json_path = write(tmp_path, "etl.json", json.dumps(data, indent=1))
    from_yaml = load_pipeline(EXAMPLES / "etl.yaml")
    from_json = load_pipeline(json_path)
    assert from_json.nodes == from_yaml.nodes
    assert from_json.defaults == from_yaml.defaults


def test_name_defaults_to_the_file_stem_and_text_can_be_parsed(tmp_path: Path) -> None:
    text = "nodes:\n  - {slug: only, plugin: p}\n"
    assert load_pipeline(write(tmp_path, "my-flow.yml", text)).name == "my-flow"
    parsed = parse_pipeline(text, source="inline.yaml")
    assert parsed.name == "inline"
    assert parsed.nodes[0].slug == "only"
    assert parsed.plugins == ()
    assert parsed.failure_policy is FailurePolicy.FAIL_FAST


def test_top_level_fields_are_read(tmp_path: Path) -> None:
    text = (
        '{"$schema": "pipeline.schema.json", "name": "n", "description": "d",\n'
        ' "defaults": {"k": [1, {"x": null}]}, "plugins": ["pkg.mod", "pkg.mod:fn"],\n'
        ' "failure_policy": "continue_others", "nodes": [{"slug": "a", "plugin": "p"}]}'
    )
    pipeline = load_pipeline(write(tmp_path, "p.json", text))
    assert (pipeline.name, pipeline.description) == ("n", "d")
    assert pipeline.plugins == ("pkg.mod", "pkg.mod:fn")
    assert pipeline.failure_policy is FailurePolicy.CONTINUE_OTHERS
    assert thaw_json(pipeline.defaults) == {"k": [1, {"x": None}]}


def test_a_loaded_pipeline_is_frozen() -> None:
    pipeline = load_pipeline(EXAMPLES / "approval.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        pipeline.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        pipeline.defaults["reviewer"] = "x"


def test_load_pipeline_is_exported_lazily_from_the_package() -> None:
    assert dagwerk.load_pipeline is load_pipeline
    code = "import sys, dagwerk; print('yaml' in sys.modules, 'pydantic' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.split() == ["False", "False"]
    with pytest.raises(AttributeError):
        _ = dagwerk.no_such_name


# --- errors name the file, the line, the node and the field ------------------

NODE_A = "  - slug: a\n    plugin: p\n"


@pytest.mark.parametrize(
    ("content", "line", "node", "field", "text"),
    [
        pytest.param(
            f"nodes:\n{NODE_A}    colour: red\n", 4, "a", "colour", "unknown field", id="unknown"
        ),
        pytest.param("nodes:\n  - slug: a\n", 2, "a", "plugin", "missing", id="missing"),
        pytest.param(
            f"nodes:\n{NODE_A}  - slug: b\n    plugin: p\n    input_mode: each\n"
            "    edges:\n      - name: r\n        source: zz\n",
            9,
            "b",
            "edges[0].source",
            "unknown source 'zz'",
            id="unknown-source",
        ),
        pytest.param(
            f"nodes:\n{NODE_A}{NODE_A}", 4, "a", "slug", "duplicate node slug", id="dup-slug"
        ),
        pytest.param(
            f"nodes:\n{NODE_A}    input_mode: each\n",
            4,
            "a",
            "input_mode",
            "must use ALL input mode",
            id="root-mode",
        ),
        pytest.param(
            f"nodes:\n{NODE_A}  - slug: b\n    plugin: p\n    input_mode: all\n"
            "    edges: [{name: r, source: a}]\n    bindings:\n"
            "      t: {source: edge, edge: r}\n",
            9,
            "b",
            "bindings.t.field",
            "missing",
            id="binding-field",
        ),
        pytest.param(
            f"nodes:\n{NODE_A}  - slug: b\n    plugin: p\n    input_mode: all\n"
            "    edges: [{name: r, source: a}]\n    bindings:\n"
            '      t: {source: expression, expression: "{r.title | nope}"}\n',
            9,
            "b",
            "bindings.t.expression",
            "Unknown pipe 'nope'",
            id="expression",
        ),
        pytest.param(
            "nodes:\n  - {slug: a, plugin: p, input_mode: all, edges: [{name: r, source: b}]}\n"
            "  - {slug: b, plugin: p, input_mode: all, edges: [{name: r, source: a}]}\n",
            2,
            "a",
            "edges[0].source",
            "cycle detected involving node 'a'",
            id="cycle",
        ),
        pytest.param(
            f"nodes:\n{NODE_A}  - slug: b\n    plugin: p\n    input_mode: all\n"
            "    edges:\n      - {name: r, source: a}\n      - {name: '9x', source: a}\n",
            9,
            "b",
            "edges[1].name",
            "invalid edge name",
            id="edge-name",
        ),
        pytest.param(
            f"nodes:\n  - plugin: p\n{NODE_A}    edges: 3\n",
            2,
            "Node 1",
            "slug",
            "missing",
            id="no-slug",
        ),
    ],
)
def test_errors_point_at_line_node_and_field(
    tmp_path: Path, *, content: str, line: int, node: str, field: str, text: str
) -> None:
    error = load_error(tmp_path, content)
    assert (error.line, error.node, error.field) == (line, node, field)
    assert text in str(error)
    assert str(error).startswith(f"{tmp_path / 'p.yaml'}:{line}: node '{node}', field '{field}': ")
    assert isinstance(error, DagwerkError)
    assert isinstance(error, ValueError)
    assert error.code == "pipeline_invalid"


@pytest.mark.parametrize(
    ("content", "line", "field", "text"),
    [
        pytest.param(f"nodes:\n{NODE_A}extra: 1\n", 4, "extra", "unknown field", id="top-key"),
        pytest.param("name: x\n", 1, "nodes", "missing", id="no-nodes"),
        pytest.param("nodes: []\n", 1, "nodes", "pipeline has no nodes", id="empty-nodes"),
        pytest.param(f"defaults: [1]\nnodes:\n{NODE_A}", 1, "defaults", "dict", id="defaults"),
        pytest.param(
            f"plugins: ['not a module']\nnodes:\n{NODE_A}",
            1,
            "plugins[0]",
            "pattern",
            id="plugins",
        ),
        pytest.param(
            f"failure_policy: sometimes\nnodes:\n{NODE_A}",
            1,
            "failure_policy",
            "fail_fast",
            id="policy",
        ),
    ],
)
def test_top_level_errors_name_the_field(
    tmp_path: Path, content: str, line: int, field: str, text: str
) -> None:
    error = load_error(tmp_path, content)
    assert (error.line, error.field, error.node) == (line, field, None)
    assert text in str(error)


def test_default_run_input_is_bounded(tmp_path: Path) -> None:
    big = "x" * 262_144
    error = load_error(tmp_path, f"defaults: {{k: '{big}'}}\nnodes:\n{NODE_A}")
    assert error.field == "defaults"
    assert error.limit == 262_144


@pytest.mark.parametrize(
    ("content", "line", "text"),
    [
        pytest.param("nodes: [\n  {slug: a\n", 3, "invalid YAML", id="syntax"),
        pytest.param("- 1\n- 2\n", 1, "must be a mapping", id="not-mapping"),
        pytest.param("", 1, "empty", id="empty"),
        pytest.param(f"nodes:\n{NODE_A}nodes: []\n", 4, "duplicate key 'nodes'", id="dup-key"),
        pytest.param(f"nodes:\n{NODE_A}1: x\n", 4, "keys must be strings", id="int-key"),
        pytest.param(f"nodes:\n{NODE_A}---\nnodes: []\n", 4, "one YAML document", id="docs"),
    ],
)
def test_yaml_syntax_problems_have_line_numbers(
    tmp_path: Path, content: str, line: int, text: str
) -> None:
    error = load_error(tmp_path, content)
    assert error.line == line
    assert text in str(error)


@pytest.mark.parametrize(
    ("content", "line", "text"),
    [
        pytest.param('{"nodes": [\n  {"slug": "a",,}]}', 2, "invalid JSON", id="syntax"),
        pytest.param('{"nodes": [], "nodes": []}', None, "duplicate key", id="dup-key"),
        pytest.param('{"defaults": {"x": NaN}, "nodes": []}', None, "NaN", id="nan"),
        pytest.param(
            '{"nodes": [{"slug": "a", "plugin": "p"},\n {"slug": "b", "plugin": "p",\n'
            '  "input_mode": "all", "edges": [{"name": "input", "source": "a"}]}]}',
            3,
            "reserved",
            id="validation-line",
        ),
    ],
)
def test_json_problems_are_located(
    tmp_path: Path, content: str, line: int | None, text: str
) -> None:
    error = load_error(tmp_path, content, name="p.json")
    assert error.line == line
    assert text in str(error)


# --- hostile input -------------------------------------------------------------


def test_an_oversized_file_is_refused_without_parsing(tmp_path: Path) -> None:
    content = f"nodes:\n{NODE_A}" + "#" * MAX_PIPELINE_FILE_BYTES
    error = load_error(tmp_path, content)
    assert error.rule == "file_too_large"
    assert error.limit == MAX_PIPELINE_FILE_BYTES


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_special_files_and_directories_are_refused(tmp_path: Path) -> None:
    for target in ("/dev/zero", str(tmp_path)):
        with pytest.raises(PipelineFileError) as caught:
            load_pipeline(target)
        assert target in str(caught.value)


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PipelineFileError, match="cannot read file"):
        load_pipeline(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("deep.yaml", "nodes: " + "[" * 200 + "]" * 200 + "\n"),
        ("deep2.yaml", "".join(f"{'  ' * level}k{level}:\n" for level in range(100)) + "  x\n"),
        ("deep.json", '{"nodes": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    ],
)
def test_deep_nesting_is_refused(tmp_path: Path, name: str, content: str) -> None:
    error = load_error(tmp_path, content, name=name)
    assert error.rule == "too_deep"
    assert error.limit == MAX_PIPELINE_NESTING
    assert error.line == 1 or name == "deep2.yaml"


def test_nesting_within_the_limit_is_accepted(tmp_path: Path) -> None:
    # A routing JSON value may be 16 levels deep; it fits under the limit.
    value: Any = 1
    for _ in range(15):
        value = {"k": value}
    text = json.dumps({"defaults": {"v": value}, "nodes": [{"slug": "a", "plugin": "p"}]})
    assert load_pipeline(write(tmp_path, "ok.json", text)).defaults["v"] is not None


def test_an_alias_bomb_is_refused_before_expansion(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        refs = ", ".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{refs}]")
    lines.append("nodes: *a9")
    error = load_error(tmp_path, "\n".join(lines) + "\n")
    assert error.rule == "yaml_alias"
    assert error.line == 1


def test_merge_keys_and_plain_aliases_are_refused(tmp_path: Path) -> None:
    error = load_error(tmp_path, "base: &b {plugin: p}\nnodes:\n  - {<<: *b, slug: a}\n")
    assert error.rule == "yaml_alias"


@pytest.mark.parametrize(
    ("content", "rule"),
    [
        ("nodes: !!python/object/apply:os.system ['true']\n", "yaml_tag"),
        ("nodes: !custom [1]\n", "yaml_tag"),
        ("defaults: {since: 2024-01-01}\nnodes: []\n", "yaml_tag"),
        ("defaults: {blob: !!binary aGVsbG8=}\nnodes: []\n", "yaml_tag"),
        ("defaults: {x: .nan}\nnodes: []\n", "value"),
        ("defaults: {x: " + "9" * 5000 + "}\nnodes: []\n", "value"),
    ],
)
def test_non_json_yaml_values_are_refused(tmp_path: Path, content: str, rule: str) -> None:
    error = load_error(tmp_path, content)
    assert error.rule == rule
    assert error.line == 1


def test_non_utf8_bytes_are_refused_with_their_line(tmp_path: Path) -> None:
    error = load_error(tmp_path, b"nodes:\n  - slug: caf\xe9\n    plugin: p\n")
    assert error.rule == "invalid_utf8"
    assert error.line == 2


def test_nul_bytes_are_refused_with_their_line(tmp_path: Path) -> None:
    error = load_error(tmp_path, b"nodes:\n  - slug: a\n    plugin: p\x00\n")
    assert error.rule == "binary_file"
    assert error.line == 3
    with pytest.raises(PipelineFileError, match="NUL"):
        parse_pipeline("nodes: [\x00]")


def test_a_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, "bom.yaml", b"\xef\xbb\xbfnodes:\n  - {slug: a, plugin: p}\n")
    assert load_pipeline(path).nodes[0].slug == "a"


def test_hostile_text_in_messages_stays_on_one_line(tmp_path: Path) -> None:
    slug = "evil\\n\\u001b[31m\\u202eslug"
    error = load_error(
        tmp_path,
        f'nodes:\n  - {{slug: "{slug}", plugin: p, input_mode: all, '
        "edges: [{name: r, source: gone}]}\n",
    )
    message = str(error)
    assert not re.search("[\x00-\x1f\x7f\u202e]", message)
    assert "\\n" in message
    assert "\\x1b" in message


def test_too_many_nodes_are_refused_before_validation(tmp_path: Path) -> None:
    nodes = [{"slug": f"n{i}", "plugin": "p"} for i in range(10_001)]
    error = load_error(tmp_path, json.dumps({"nodes": nodes}), name="many.json")
    assert error.rule == "too_many_nodes"
    assert error.limit == 10_000


# --- JSON Schema ---------------------------------------------------------------


def _resolve(schema: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    ref = fragment.get("$ref")
    if ref is None:
        for option in fragment.get("anyOf", ()):
            if option.get("type") != "null":
                return _resolve(schema, option)
        return fragment
    resolved: dict[str, Any] = schema["$defs"][ref.split("/")[-1]]
    return resolved


def _check_object(schema: dict[str, Any], fragment: dict[str, Any], value: Any, at: str) -> None:
    """A minimal structural check: known keys, required keys, nested objects."""
    fragment = _resolve(schema, fragment)
    if fragment.get("type") != "object" or "properties" not in fragment:
        return
    assert isinstance(value, dict), at
    properties = fragment["properties"]
    assert set(value) <= set(properties), (at, set(value) - set(properties))
    assert set(fragment.get("required", ())) <= set(value), at
    for key, item in value.items():
        spec = _resolve(schema, properties[key])
        if spec.get("type") == "array" and isinstance(item, list):
            for position, element in enumerate(item):
                _check_object(schema, spec["items"], element, f"{at}.{key}[{position}]")
        elif isinstance(spec.get("additionalProperties"), dict) and isinstance(item, dict):
            union = spec["additionalProperties"]
            for name, binding in item.items():
                mapping = union.get("discriminator", {}).get("mapping", {})
                _check_object(schema, {"$ref": mapping[binding["source"]]}, binding, name)
        else:
            _check_object(schema, spec, item, f"{at}.{key}")


def test_schema_is_json_and_describes_every_node_field() -> None:
    schema = json.loads(json.dumps(pipeline_json_schema()))
    assert schema["$schema"].endswith("2020-12/schema")
    assert schema["required"] == ["nodes"]
    top = set(schema["properties"])
    assert {"name", "description", "defaults", "plugins", "failure_policy", "nodes"} <= top
    node = schema["$defs"]["DagNode"]
    from dagwerk.models import DagNode

    assert set(node["properties"]) == set(DagNode.model_fields)
    assert set(node["required"]) == {"slug", "plugin"}
    assert schema["properties"]["nodes"]["items"] == {"$ref": "#/$defs/DagNode"}
    assert pipeline_json_schema() is not pipeline_json_schema()


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda path: path.name)
def test_shipped_examples_fit_the_schema(path: Path) -> None:
    schema = pipeline_json_schema()
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    _check_object(schema, schema, data, path.name)


def test_schema_edge_name_pattern_matches_the_model_grammar() -> None:
    pattern = re.compile(
        pipeline_json_schema()["$defs"]["InputEdge"]["properties"]["name"]["pattern"]
    )
    for name in ("records", "_x", "a-b_9", "input", "9x", "-r", "a.b", "", "inputs"):
        try:
            validate_edge_name(name)
            valid = True
        except ValueError:
            valid = False
        assert bool(pattern.search(name)) is valid, name


def test_pipeline_type_is_exported() -> None:
    assert Pipeline.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_every_field_of_the_schema_is_described_for_users() -> None:
    schema = pipeline_json_schema()
    undescribed = [
        f"{name}.{prop}"
        for name, definition in [("pipeline", schema), *schema["$defs"].items()]
        for prop, spec in definition.get("properties", {}).items()
        if prop != "source" and not spec.get("description")
    ]
    assert undescribed == []
    enums = [name for name, definition in schema["$defs"].items() if "enum" in definition]
    assert enums and all(schema["$defs"][name].get("description") for name in enums)
    # The schema speaks to users: no reference to design notes they do not have.
    assert "decisions.md" not in json.dumps(schema)
