"""A worker *process* started after the parent runs were created enforces the
persisted lineage: depth (CL-01) and ancestor cancellation (CL-02)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from dagwerk.backends.sqlite import SqliteStore
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.lineage import RunLineage, RunLink, child_lineage, encode_lineage, pipeline_identity
from dagwerk.orchestrator import cancel_run, start_run
from dagwerk.testing.helpers import CallbackLog, new_run, only_task, root

_WORKER = textwrap.dedent(
    """
    import sys
    from dagwerk.backends.sqlite import SqliteStore
    from dagwerk.runtime.worker import Worker

    store = SqliteStore(sys.argv[1])
    def leaf(inputs, ctx):
        open(sys.argv[3], "a").write(ctx.run_id + "\\n")
        return {"ok": 1}
    def hold(inputs, ctx):
        ctx.wait("hold")
    worker = Worker(store, {"leaf": leaf, "mid": leaf, "p": hold},
                    execution_root=sys.argv[2], max_child_depth=1)
    worker.run_until_idle()
    store.close()
    """
)


def _child(
    store: SqliteStore, run_id: str, parent: str, above: RunLineage | None, slug: str
) -> RunLineage:
    lineage = child_lineage(
        above,
        parent_run_id=parent,
        parent_task_id=f"{parent}-t",
        parent_pipeline_id="p" if above is None else above.pipeline_id,
        pipeline_id=pipeline_identity([root(slug)]),
    )
    link = RunLink(run_id, parent, f"{parent}-t", lineage.root_run_id, encode_lineage(lineage))
    assert store.create_child_run(run_id, [root(slug)], link=link)
    start_run(store, run_id, callbacks=CallbackLog().callbacks)
    return lineage


def test_cl_01_cl_02_worker_process_started_later_enforces_lineage(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = SqliteStore(url)
    new_run(store, [root("p")], "r0")
    first = _child(store, "r1", "r0", None, "mid")
    _child(store, "r2", "r1", first, "leaf")  # depth 2 > the worker's limit 1
    new_run(store, [root("p")], "gone")
    assert cancel_run(store, "gone")
    _child(store, "orphan", "gone", None, "leaf")  # its root is committed cancelled
    store.close()
    ran = tmp_path / "ran.txt"
    ran.touch()
    subprocess.run(
        [sys.executable, "-c", _WORKER, url, str(tmp_path), str(ran)], check=True, timeout=120
    )
    store = SqliteStore(url)
    try:
        assert ran.read_text().split() == ["r1"]
        depth_task = only_task(store, "r2", 0)
        assert depth_task.status is TaskStatus.FAILED
        assert "child_depth_exceeded" in (depth_task.error or "")
        assert store.get_run_status("orphan") is RunStatus.CANCELLED
        assert only_task(store, "orphan", 0).status is TaskStatus.CANCELLED
    finally:
        store.close()
