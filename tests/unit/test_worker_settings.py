"""A worker's settings as one object: ``Worker(store, plugins, settings)``
configures the worker as the same fields given as keyword arguments do."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.errors import DagwerkError
from dagwerk.runtime import Worker, WorkerSettings
from dagwerk.runtime.budget_guard import ByteLimits


def test_a_settings_object_configures_the_worker_as_keyword_arguments_do(
    tmp_path: Path,
) -> None:
    settings = WorkerSettings(
        execution_root=tmp_path,
        concurrency=3,
        lease_seconds=12.0,
        lease_grace=4.0,
        poll_interval=0.2,
        queues=["a", "b"],
        worker_id="w-settings",
        byte_limits=ByteLimits(max_output_bytes=10),
    )
    by_object = Worker(MemoryStore(), {}, settings)
    by_keywords = Worker(
        MemoryStore(),
        {},
        execution_root=tmp_path,
        concurrency=3,
        lease_seconds=12.0,
        lease_grace=4.0,
        poll_interval=0.2,
        queues=["a", "b"],
        worker_id="w-settings",
        byte_limits=ByteLimits(max_output_bytes=10),
    )
    try:
        assert by_object.settings == by_keywords.settings
        assert by_object.worker_id == "w-settings"
        assert (by_object.concurrency, by_object.lease_bound(None)) == (3, 16.0)
        # Unset intervals fall back to the poll interval.
        assert by_object.cancel_check_interval == by_object.idle_wait == 0.2
        assert by_object.queues == ["a", "b"]
        assert by_object.execution_root == tmp_path.resolve()
    finally:
        by_object.stop()
        by_keywords.stop()


def test_keyword_arguments_override_the_settings_object(tmp_path: Path) -> None:
    settings = WorkerSettings(execution_root=tmp_path, lease_seconds=12.0)
    worker = Worker(MemoryStore(), {}, settings, lease_seconds=5.0)
    try:
        assert worker.lease_seconds == 5.0
        assert settings.lease_seconds == 12.0  # the object given is not changed
        # The queue's own bound and a fresh ID fill what the settings leave open.
        assert worker.max_deliveries == MemoryStore().max_deliveries
        assert worker.worker_id.startswith("worker-")
    finally:
        worker.stop()


@pytest.mark.parametrize(
    ("field", "value"), [("concurrency", 0), ("concurrency", 1.5), ("max_child_depth", -1)]
)
def test_an_invalid_setting_names_its_field(tmp_path: Path, field: str, value: object) -> None:
    with pytest.raises(DagwerkError) as caught:
        WorkerSettings(execution_root=tmp_path, **{field: value})  # type: ignore[arg-type]
    assert caught.value.field == field


def test_every_way_of_building_a_worker_has_the_same_default_concurrency(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from dagwerk.cli import cli
    from dagwerk.constants import DEFAULT_CONCURRENCY
    from dagwerk.engine import Engine

    assert DEFAULT_CONCURRENCY > 1  # a default worker runs attempts side by side
    direct = Worker(MemoryStore(), {}, execution_root=tmp_path)
    with Engine("memory://", execution_root=tmp_path) as engine:
        built = engine.worker()
        assert direct.settings.concurrency == built.settings.concurrency == DEFAULT_CONCURRENCY
    shown = CliRunner().invoke(cli, ["worker", "--help"]).output
    assert f"default: {DEFAULT_CONCURRENCY};" in " ".join(shown.split()), shown
