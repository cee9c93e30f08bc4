"""A fail-fast run whose worker died between a task's final failure and the
run's finalisation is ended by the next reconcile (the backstop's).

Found by the chaos suite on PostgreSQL: ``on_task_failed`` commits the
failure, then finalises the run in a second commit; a SIGKILL in between
left the run RUNNING for good, because fail-fast reconciles looked only at
FAILED launches, never at FAILED or CRASHED tasks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.engine import Engine
from dagwerk.execution import claim_task
from dagwerk.models import DagNode
from dagwerk.orchestrator import OrchestratorCallbacks, reconcile_run
from dagwerk.runtime.backstop import Backstop


def _ignore(run_id: str) -> None:
    del run_id


CALLBACKS = OrchestratorCallbacks(_ignore, _ignore, _ignore, _ignore)


@pytest.fixture(params=["memory", "sqlite"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'f.db'}"
    return Engine(url, execution_root=tmp_path)


def _failed_without_finalising(engine: Engine, *, crashed: bool) -> str:
    run_id = engine.submit([DagNode(slug="a", plugin="p"), DagNode(slug="b", plugin="p")], {})
    store = engine.store
    task = engine.list_tasks(run_id)[0]
    claimed = claim_task(
        store,
        task.task_id,
        expected_attempt_id=task.attempt_id,
        expected_generation=task.generation,
    )
    assert claimed is not None
    # What a worker commits before it dies: the failure, not the run's end.
    mark = store.mark_task_crashed if crashed else store.mark_task_failed
    assert mark(task.task_id, "boom", expected_attempt_id=task.attempt_id) is not None
    assert engine.get_run(run_id).status is RunStatus.RUNNING  # type: ignore[union-attr]
    return run_id


@pytest.mark.parametrize("crashed", [False, True])
def test_reconcile_finalises_a_fail_fast_run_holding_a_failed_task(
    engine: Engine, crashed: bool
) -> None:
    with engine:
        run_id = _failed_without_finalising(engine, crashed=crashed)
        reconcile_run(engine.store, run_id, callbacks=CALLBACKS)
        run = engine.get_run(run_id)
        assert run is not None
        assert run.status is (RunStatus.CRASHED if crashed else RunStatus.FAILED)
        statuses = sorted(t.status.value for t in engine.list_tasks(run_id))
        assert statuses == sorted(
            [(TaskStatus.CRASHED if crashed else TaskStatus.FAILED).value, "cancelled"]
        )


def test_a_backstop_pass_ends_the_stranded_run(engine: Engine) -> None:
    with engine:
        run_id = _failed_without_finalising(engine, crashed=False)
        Backstop(engine.store, interval=1.0, callbacks=CALLBACKS).run_pass()
        run = engine.get_run(run_id)
        assert run is not None and run.status is RunStatus.FAILED
