"""Gated-dispatch settings (GD-17 in this engine's terms): the backstop
interval of the engine and its workers, and the per-node wait timeout of a
pipeline file."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from dagwerk.engine import Engine
from dagwerk.engine import _engine as engine_module
from dagwerk.models import DagNode
from dagwerk.pipeline_file import load_pipeline
from dagwerk.pipelines.source import PipelineFileError
from dagwerk.pipelines.spec import pipeline_json_schema
from dagwerk.runtime.backstop import (
    DEFAULT_BACKSTOP_INTERVAL,
    Backstop,
    BackstopConfigError,
    check_backstop_interval,
)
from dagwerk.runtime.worker import Worker

# --- backstop interval ----------------------------------------------------------------


def test_gd_17_backstop_interval_defaults_to_30_seconds_everywhere(tmp_path: Path) -> None:
    assert DEFAULT_BACKSTOP_INTERVAL == 30.0
    with Engine("memory://", execution_root=tmp_path) as engine:
        assert engine.backstop_interval == 30.0
        worker = engine.worker()
        assert worker.backstop is not None and worker.backstop.interval == 30.0


def test_gd_17_engine_backstop_interval_reaches_the_workers_it_builds(tmp_path: Path) -> None:
    with Engine("memory://", execution_root=tmp_path, backstop_interval=2.5) as engine:
        worker = engine.worker()
        assert worker.backstop is not None and worker.backstop.interval == 2.5
        # An explicit worker option still wins over the engine setting.
        other = engine.worker(backstop_interval=7)
        assert other.backstop is not None and other.backstop.interval == 7.0
    with Engine("memory://", execution_root=tmp_path, backstop_interval=None) as engine:
        worker = engine.worker()
        assert worker.backstop is not None and not worker.backstop.enabled
        assert worker.backstop.maybe_run() is None


def test_gd_17_engine_run_uses_the_engine_backstop_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[float | None] = []

    class Recording(Worker):
        def __init__(self, *args: Any, **options: Any) -> None:
            super().__init__(*args, **options)
            assert self.backstop is not None
            seen.append(self.backstop.interval)

    monkeypatch.setattr(engine_module, "Worker", Recording)
    with Engine("memory://", execution_root=tmp_path, backstop_interval=4.0) as engine:
        engine.plugin("a")(lambda inputs, ctx: {"ok": True})
        result = engine.run([DagNode(slug="a", plugin="a")], timeout=60)
        assert result.status.value == "completed"
    assert seen == [4.0]


@pytest.mark.parametrize("value", [-1, -0.5, math.nan, math.inf, True, "30", [30]])
def test_gd_17_a_backstop_interval_that_is_not_a_duration_is_refused(
    value: object, tmp_path: Path
) -> None:
    with pytest.raises(BackstopConfigError) as caught:
        check_backstop_interval(value)
    assert caught.value.field == "backstop_interval"
    assert isinstance(caught.value, ValueError)
    with pytest.raises(BackstopConfigError):
        Engine("memory://", execution_root=tmp_path, backstop_interval=value)  # type: ignore[arg-type]
    with pytest.raises(BackstopConfigError):
        Backstop(object(), interval=value)  # type: ignore[arg-type]


def test_gd_17_zero_or_none_disable_the_periodic_backstop() -> None:
    assert check_backstop_interval(None) is None
    assert check_backstop_interval(0) is None
    assert check_backstop_interval(0.0) is None
    assert check_backstop_interval(5) == 5.0
    assert Backstop(object(), interval=0).enabled is False


# --- wait timeout in pipeline files -------------------------------------------------------

PIPELINE = """\
name: approval
nodes:
  - slug: ask
    plugin: ask
    wait_timeout_seconds: 90
  - slug: act
    plugin: act
    input_mode: each
    wait_timeout_seconds: 0.5
    edges:
      - {name: answer, source: ask}
  - slug: log
    plugin: log
"""


def test_gd_12_pipeline_files_accept_wait_timeout_seconds(tmp_path: Path) -> None:
    path = tmp_path / "approval.yaml"
    path.write_text(PIPELINE, encoding="utf-8")
    pipeline = load_pipeline(path)
    timeouts = {node.slug: node.wait_timeout_seconds for node in pipeline.nodes}
    assert timeouts == {"ask": 90.0, "act": 0.5, "log": None}
    node_schema = pipeline_json_schema()["$defs"]["DagNode"]["properties"]
    assert "wait_timeout_seconds" in node_schema


@pytest.mark.parametrize("value", ["0", "-5", "[1]", "soon"])
def test_gd_12_a_bad_wait_timeout_in_a_pipeline_file_names_the_field(
    tmp_path: Path, value: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        f"nodes:\n  - slug: ask\n    plugin: ask\n    wait_timeout_seconds: {value}\n",
        encoding="utf-8",
    )
    with pytest.raises(PipelineFileError) as caught:
        load_pipeline(path)
    assert caught.value.node == "ask"
    assert "wait_timeout_seconds" in str(caught.value.field)
