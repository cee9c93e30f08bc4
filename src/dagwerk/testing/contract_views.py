"""Contract tests: the dashboard's read-only views (VW-01..VW-07) of
:class:`~dagwerk.store.RunViewStore`.

Uses the ``make_store`` fixture (called with ``clock=``) and the fake clock
of ``contract_queue``, so creation times are chosen by the test.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dagwerk.constants import FailurePolicy, InputMode, NodeDisposition, RunStatus, TaskStatus
from dagwerk.orchestrator import start_run
from dagwerk.store import (
    InvalidStoreValueError,
    RunCursor,
    RunPage,
    RunQuery,
    RunViewStore,
    TaskQuery,
)
from dagwerk.testing.contract_queue import FakeClock, QueueContractStore
from dagwerk.testing.helpers import (
    Complete,
    Fail,
    FakeWorker,
    Wait,
    WorkItem,
    child,
    emit,
    new_run,
    root,
)
from dagwerk.waiting import resume_task

__all__ = [
    "test_vw_01_run_pages_cover_every_run_once_newest_first",
    "test_vw_02_run_pages_filter_by_status_pipeline_and_time",
    "test_vw_03_invalid_view_requests_name_the_field",
    "test_vw_04_task_counts_per_run_and_per_node",
    "test_vw_05_task_pages_filter_by_node_and_status",
    "test_vw_06_waits_outputs_and_input_of_a_task_and_run",
    "test_vw_07_unknown_runs_and_tasks_read_as_empty",
]


def _views(store: object) -> RunViewStore:
    if not isinstance(store, RunViewStore):
        pytest.skip("the store does not implement RunViewStore")
    return store


def _all_pages(views: RunViewStore, **filters: object) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: RunCursor | None = None
    while True:
        page = views.list_runs_page(RunQuery(after=cursor, limit=2, **filters))  # type: ignore[arg-type]
        pages.append([run.run_id for run in page.runs])
        if page.next is None:
            return pages
        cursor = RunCursor.decode(page.next.encode())


def test_vw_01_run_pages_cover_every_run_once_newest_first(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock)
    views = _views(store)
    for n in range(5):
        new_run(store, [root("a")], f"run-{n}", start=False)
        if n != 1:  # run-1 and run-2 share a creation time: the ID breaks the tie
            queue_clock.advance(1.0)
    pages = _all_pages(views)
    assert pages == [["run-4", "run-3"], ["run-2", "run-1"], ["run-0"]]
    first = views.list_runs_page(RunQuery(limit=2))
    assert first.next is not None and first.runs[0].created_at == queue_clock.now - 1.0
    # A run created after the first page does not shift the later pages.
    new_run(store, [root("a")], "run-5", start=False)
    rest = views.list_runs_page(RunQuery(after=first.next, limit=10))
    assert [run.run_id for run in rest.runs] == ["run-2", "run-1", "run-0"]
    assert rest.next is None
    assert views.list_runs_page(RunQuery(limit=6)).next is None


def test_vw_02_run_pages_filter_by_status_pipeline_and_time(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock)
    views = _views(store)
    for n in range(4):
        store.create_run(f"run-{n}", [root("a")], pipeline="etl" if n % 2 else "load")
        queue_clock.advance(10.0)
    store.try_cancel_run("run-2")

    def ids(page: RunPage) -> list[str]:
        return [run.run_id for run in page.runs]

    assert ids(views.list_runs_page(RunQuery(status=RunStatus.CANCELLED))) == ["run-2"]
    assert ids(views.list_runs_page(RunQuery(status=RunStatus.PENDING))) == [
        "run-3",
        "run-1",
        "run-0",
    ]
    assert ids(views.list_runs_page(RunQuery(pipeline="etl"))) == ["run-3", "run-1"]
    start = queue_clock.now - 40.0  # run-0's creation time
    window = RunQuery(created_after=start + 10.0, created_before=start + 30.0)
    assert ids(views.list_runs_page(window)) == ["run-2", "run-1"]
    both = RunQuery(pipeline="load", status=RunStatus.PENDING, created_before=start + 30.0)
    assert ids(views.list_runs_page(both)) == ["run-0"]
    assert _all_pages(views, pipeline="etl") == [["run-3", "run-1"]]
    assert dict(views.run_status_counts_since(start + 10.0)) == {
        RunStatus.PENDING: 2,
        RunStatus.CANCELLED: 1,
    }
    assert dict(views.run_status_counts_since(queue_clock.now)) == {}
    assert ids(views.list_runs_page(RunQuery(pipeline="none"))) == []


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: RunQuery(limit=0), "limit"),
        (lambda: RunQuery(limit=501), "limit"),
        (lambda: RunQuery(status="nope"), "status"),  # type: ignore[arg-type]
        (lambda: RunQuery(pipeline=""), "pipeline"),
        (lambda: RunQuery(created_after=float("nan")), "created_after"),
        (lambda: RunQuery(created_before="x"), "created_before"),  # type: ignore[arg-type]
        (lambda: RunCursor.decode("garbage"), "after"),
        (lambda: TaskQuery(node_index=-1), "node_index"),
        (lambda: TaskQuery(status="nope"), "status"),  # type: ignore[arg-type]
        (lambda: TaskQuery(after="x" * 201), "after"),
    ],
)
def test_vw_03_invalid_view_requests_name_the_field(
    store: QueueContractStore, build: Callable[[], object], field: str
) -> None:
    _views(store)
    with pytest.raises(InvalidStoreValueError) as raised:
        build()
    assert raised.value.field == field
    with pytest.raises(InvalidStoreValueError) as counted:
        _views(store).run_task_counts(["r"] * 501)
    assert counted.value.field == "run_ids"
    with pytest.raises(InvalidStoreValueError) as since:
        _views(store).run_status_counts_since(float("inf"))
    assert since.value.field == "since"


def _fan_run(store: QueueContractStore) -> FakeWorker:
    """run-1: ``fan`` emits four outputs; ``work`` runs once per output,
    failing for n=1 and waiting for n=2 (continue_others keeps the rest)."""
    nodes = [root("fan"), child("work", "fan", mode=InputMode.EACH)]
    store.create_run(
        "run-1", nodes, run_input={"who": "<b>me</b>"}, failure_policy=FailurePolicy.CONTINUE_OTHERS
    )

    def fan(item: WorkItem) -> Complete:
        return Complete(emit(*(f"{item.claim.task_id}/{n}" for n in range(4)), kind="x"))

    def work(item: WorkItem) -> Complete | Fail | Wait:
        (edge,) = item.inputs.edges.values()
        n = int(edge[0].id.rsplit("/", 1)[1])
        if n == 1:
            return Fail("boom")
        if n == 2:
            return Wait("approval")
        return Complete()

    worker = FakeWorker(store, handlers={"fan": fan, "work": work})
    start_run(store, "run-1", callbacks=worker.log.callbacks)
    worker.drain("run-1")
    return worker


def test_vw_04_task_counts_per_run_and_per_node(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock)
    views = _views(store)
    _fan_run(store)
    new_run(store, [root("a")], "run-2", start=False)
    counts = views.run_task_counts(["run-1", "run-2", "run-unknown"])
    assert set(counts) == {"run-1", "run-2"}
    assert dict(counts["run-1"]) == {
        TaskStatus.COMPLETED: 3,
        TaskStatus.FAILED: 1,
        TaskStatus.WAITING: 1,
    }
    assert dict(counts["run-2"]) == {}
    stats = views.node_task_stats("run-1")
    assert stats is not None
    assert [s.node_index for s in stats] == [0, 1]
    fan, work = stats
    assert dict(fan.counts) == {TaskStatus.COMPLETED: 1} and fan.total == 1
    assert (fan.disposition, fan.complete, fan.error) == (NodeDisposition.LAUNCHED, True, None)
    assert (work.disposition, work.complete) == (NodeDisposition.LAUNCHED, False)
    assert dict(work.counts) == {
        TaskStatus.COMPLETED: 2,
        TaskStatus.FAILED: 1,
        TaskStatus.WAITING: 1,
    }
    assert work.attempts == 4
    assert fan.first_started_at == queue_clock.now and fan.last_finished_at == queue_clock.now
    assert views.node_task_stats("run-2") == []


def test_vw_05_task_pages_filter_by_node_and_status(store: QueueContractStore) -> None:
    views = _views(store)
    _fan_run(store)
    every = store.list_tasks("run-1")
    page = views.list_tasks_page("run-1", TaskQuery(limit=2))
    assert [t.task_id for t in page] == [t.task_id for t in every[:2]]
    rest = views.list_tasks_page("run-1", TaskQuery(after=page[-1].task_id, limit=10))
    assert [t.task_id for t in rest] == [t.task_id for t in every[2:]]
    work = views.list_tasks_page("run-1", TaskQuery(node_index=1))
    assert len(work) == 4 and all(t.node_index == 1 for t in work)
    (failed,) = views.list_tasks_page("run-1", TaskQuery(status=TaskStatus.FAILED))
    assert failed.error == "boom" and failed.node_index == 1
    (waiting,) = views.list_tasks_page("run-1", TaskQuery(node_index=1, status=TaskStatus.WAITING))
    assert waiting.active_wait_id == "approval"
    assert views.list_tasks_page("run-1", TaskQuery(node_index=0, status=TaskStatus.FAILED)) == []


def test_vw_06_waits_outputs_and_input_of_a_task_and_run(
    make_store: Callable[..., QueueContractStore], queue_clock: FakeClock
) -> None:
    store = make_store(clock=queue_clock)
    views = _views(store)
    _fan_run(store)
    assert views.get_run_input("run-1") == {"who": "<b>me</b>"}
    (waiting,) = views.list_tasks_page("run-1", TaskQuery(status=TaskStatus.WAITING))
    (wait,) = views.list_task_waits(waiting.task_id)
    assert (wait.wait_id, wait.state, wait.attempt_id) == (
        "approval",
        "active",
        waiting.attempt_id,
    )
    assert wait.waited_at == queue_clock.now and wait.response is None
    resumed = resume_task(
        store,
        waiting.task_id,
        "approval",
        expected_attempt_id=waiting.attempt_id,
        expected_generation=waiting.generation,
        response={"ok": True},
    )
    assert resumed is not None
    (wait,) = views.list_task_waits(waiting.task_id)
    assert wait.state == "resolved" and wait.response == {"ok": True}
    assert wait.resumed_attempt_id == resumed.resumed_attempt_id
    (fan,) = views.list_tasks_page("run-1", TaskQuery(node_index=0))
    outputs = views.list_task_outputs(fan.task_id)
    assert [o.id for o in outputs] == [f"{fan.task_id}/{n}" for n in range(4)]
    assert dict(outputs[0].fields) == {"kind": "x"}
    (done, *_) = views.list_tasks_page("run-1", TaskQuery(status=TaskStatus.COMPLETED))
    assert done.node_index == 0
    work_done = views.list_tasks_page("run-1", TaskQuery(node_index=1, status=TaskStatus.COMPLETED))
    (out,) = views.list_task_outputs(work_done[0].task_id)
    assert out.id == f"{work_done[0].task_id}/out-0"
    assert dict(out.data) == {"path": f"/data/{work_done[0].task_id}/0"}


def test_vw_07_unknown_runs_and_tasks_read_as_empty(store: QueueContractStore) -> None:
    views = _views(store)
    _fan_run(store)
    assert views.node_task_stats("run-unknown") is None
    assert views.get_run_input("run-unknown") is None
    assert views.list_tasks_page("run-unknown", TaskQuery()) == []
    assert views.list_tasks_page("run-1", TaskQuery(after="task-unknown")) == []
    assert views.list_task_waits("task-unknown") == []
    assert views.list_task_outputs("task-unknown") == []
    assert views.run_task_counts([]) == {}
