"""``Worker.run_burst`` (``dagwerk worker --burst``) ends only once the
work it serves is done: a row left under the worker's own lease, which no
attempt of it holds any more (as a store fault can leave one), is waited
for and redelivered when that lease ends, not left for another worker."""

from __future__ import annotations

from pathlib import Path

from dagwerk import TaskContext
from dagwerk.constants import RunStatus
from dagwerk.engine import Engine
from dagwerk.testing.helpers import chain

WORKER = "burst-worker"
LEASE = 1.0  # seconds the orphaned lease lasts


def test_a_burst_worker_recovers_a_row_left_under_its_own_lease(
    database_url: str, tmp_path: Path
) -> None:
    with Engine(database_url, execution_root=tmp_path) as engine:
        ran: list[str] = []

        def step(inputs: object, ctx: TaskContext) -> list[dict[str, int]]:
            ran.append(ctx.plugin)
            return [{"n": 1}]

        for n in range(2):
            engine.plugin(f"n{n}")(step)
        run_id = engine.submit(chain(2))
        # The worker's claim of the root committed; the worker then lost it.
        (orphan,) = engine.store.claim_deliveries(WORKER, limit=1, lease_seconds=LEASE)
        assert orphan.task is not None
        worker = engine.worker(worker_id=WORKER, concurrency=1)
        handled = worker.run_burst(horizon=30.0)
        result = engine.result(run_id)
        assert result.status is RunStatus.COMPLETED, (handled, result)
        assert ran == ["n0", "n1"]
        # The redelivery recovered the root under a new attempt.
        (root_task,) = [t for t in engine.store.list_tasks(run_id) if t.node_index == 0]
        assert root_task.attempt_id != orphan.delivery.attempt_id
