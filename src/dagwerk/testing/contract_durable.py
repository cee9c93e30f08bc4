"""Contract tests: durable task records (:class:`~dagwerk.store.DurableTaskStore`)
and the straight-line plugins they make safe to re-run.

The store half checks the step and wait records: fencing by the attempt,
first-result-wins repeats, validation before any write, and a replanned
generation starting without records. The worker half runs plugins written
as straight-line code (``ctx.step``, ``ctx.wait``, ``ctx.start_child`` then
``ctx.wait_for_child``) through a real worker on the same store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dagwerk.constants import FailurePolicy, RunStatus, TaskStatus
from dagwerk.errors import DagwerkError
from dagwerk.execution import recover_task
from dagwerk.json import thaw_json
from dagwerk.lineage import child_wait_id
from dagwerk.models import DagNode, TaskInputs
from dagwerk.orchestrator import cancel_run, on_task_complete, reconcile_run
from dagwerk.retry import rerun_nodes
from dagwerk.runtime.budget_guard import ByteLimits
from dagwerk.runtime.children import ChildPipeline
from dagwerk.runtime.context import ChildRunFailed, TaskContext
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.worker import Worker
from dagwerk.store import DagChildStore, DurableTaskStore, StepRecord, TaskJournal
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    chain,
    claim,
    emit,
    new_run,
    only_task,
    root,
)
from dagwerk.waiting import resume_task, wait_task

__all__ = [
    "test_dt_journal_keeps_every_wait_with_its_state_and_response",
    "test_dt_journal_lists_the_child_runs_of_the_task",
    "test_dt_old_style_branch_on_resumed_from_wait_id_keeps_working",
    "test_dt_replanned_generation_starts_without_steps",
    "test_dt_run_journals_list_the_tasks_that_recorded_something",
    "test_dt_stale_attempt_records_no_step",
    "test_dt_step_is_fenced_by_the_running_attempt",
    "test_dt_step_name_reuse_fails_the_task_without_retry",
    "test_dt_step_records_once_and_a_repeat_returns_the_first_result",
    "test_dt_step_results_must_be_json_within_the_byte_limit",
    "test_dt_step_validation_happens_before_any_write",
    "test_dt_straight_line_approval_returns_the_response",
    "test_dt_straight_line_child_completes_with_one_child_run",
    "test_dt_straight_line_failed_child_fails_the_parent_without_retry",
    "test_dt_straight_line_nondeterministic_child_fails_without_retry",
    "test_dt_straight_line_recursion_ends_at_the_depth_limit",
    "test_dt_straight_line_step_runs_once_across_retries_and_waits",
    "test_dt_wait_for_children_returns_every_result_in_order",
]


def _durable(store: ContractStore) -> DurableTaskStore:
    assert isinstance(store, DurableTaskStore)
    return store


def _running(store: ContractStore, nodes: list[DagNode] | None = None) -> tuple[str, str, int]:
    new_run(store, nodes if nodes is not None else [root("a")])
    record = only_task(store, "run-1", 0)
    claim(store, record)
    return record.task_id, record.attempt_id, record.generation


def _record(  # noqa: PLR0917 (the test's shorthand for one step call)
    store: ContractStore, task_id: str, name: str, result: object, attempt: str, generation: int
) -> StepRecord | None:
    return _durable(store).try_record_step(
        task_id, name, result, expected_attempt_id=attempt, expected_generation=generation
    )


def _journal(store: ContractStore, task_id: str) -> TaskJournal:
    journal = _durable(store).get_task_journal(task_id)
    assert journal is not None
    return journal


# --- the store's records ---------------------------------------------------------------


def test_dt_step_records_once_and_a_repeat_returns_the_first_result(
    store: ContractStore,
) -> None:
    tid, aid, gen = _running(store)
    first = _record(store, tid, "charge", {"charge_id": "ch_1", "cents": [1, 2]}, aid, gen)
    assert first is not None
    assert (first.task_id, first.name, first.attempt_id, first.generation) == (
        tid,
        "charge",
        aid,
        gen,
    )
    assert thaw_json(first.result) == {"charge_id": "ch_1", "cents": [1, 2]}
    assert first.position == 0
    # A repeat (a timeout hid the commit) keeps the first result.
    again = _record(store, tid, "charge", {"charge_id": "ch_2"}, aid, gen)
    assert again == first
    second = _record(store, tid, "mail", None, aid, gen)
    assert second is not None and second.position == 1 and second.result is None
    journal = _journal(store, tid)
    assert [(s.name, thaw_json(s.result)) for s in journal.steps] == [
        ("charge", {"charge_id": "ch_1", "cents": [1, 2]}),
        ("mail", None),
    ]
    assert journal.generation == gen and journal.task_id == tid


def test_dt_step_is_fenced_by_the_running_attempt(store: ContractStore) -> None:
    tid, aid, gen = _running(store)
    assert _record(store, tid, "s", 1, aid, gen + 1) is None  # another generation
    assert _record(store, tid, "s", 1, "not-the-attempt", gen) is None
    assert _record(store, "no-such-task", "s", 1, aid, gen) is None
    recovered = recover_task(store, tid, expected_attempt_id=aid, expected_generation=gen)
    assert recovered is not None
    # The abandoned attempt is stale; the queued replacement is not running.
    assert _record(store, tid, "s", 1, aid, gen) is None
    assert _record(store, tid, "s", 1, recovered.recovered_attempt_id, gen) is None
    claim(store, only_task(store, "run-1", 0))
    assert _record(store, tid, "s", 2, recovered.recovered_attempt_id, gen) is not None
    # A waiting attempt records nothing; nor does a completed one.
    assert wait_task(
        store, tid, "w", expected_attempt_id=recovered.recovered_attempt_id, expected_generation=gen
    )
    assert _record(store, tid, "t", 3, recovered.recovered_attempt_id, gen) is None
    assert [s.name for s in _journal(store, tid).steps] == ["s"]
    assert [s.result for s in _journal(store, tid).steps] == [2]


def test_dt_step_validation_happens_before_any_write(store: ContractStore) -> None:
    tid, aid, gen = _running(store)
    for name in ("", "x" * 513, "a\x00b", 7):
        with pytest.raises(ValueError):
            _record(store, tid, name, 1, aid, gen)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _record(store, tid, "s", {"x": float("nan")}, aid, gen)
    with pytest.raises(ValueError):
        _record(store, tid, "s", {"x": object()}, aid, gen)
    assert _journal(store, tid).steps == ()
    assert _record(store, tid, "s", {"ok": True}, aid, gen) is not None


def test_dt_replanned_generation_starts_without_steps(store: ContractStore) -> None:
    """Re-running a node drops its steps with its generation, like its outputs."""
    tid, aid, gen = _running(store)
    assert _record(store, tid, "charge", "ch_1", aid, gen) is not None
    on_task_complete(
        store,
        task_id=tid,
        expected_attempt_id=aid,
        outputs=emit("o1"),
        callbacks=CallbackLog().callbacks,
    )
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    rerun_nodes(store, "run-1", [0])
    reconcile_run(store, "run-1", callbacks=CallbackLog().callbacks)
    fresh = only_task(store, "run-1", 0)
    assert fresh.generation == gen + 1 and fresh.task_id != tid
    assert _journal(store, fresh.task_id).steps == ()
    # The old generation's attempt cannot record any more.
    assert _record(store, tid, "late", 1, aid, gen) is None
    claim(store, fresh)
    assert _record(store, fresh.task_id, "charge", "ch_2", fresh.attempt_id, fresh.generation)
    assert [s.result for s in _journal(store, fresh.task_id).steps] == ["ch_2"]


def test_dt_journal_keeps_every_wait_with_its_state_and_response(store: ContractStore) -> None:
    tid, aid, gen = _running(store, [root("a"), root("b")])
    assert wait_task(store, tid, "review", expected_attempt_id=aid, expected_generation=gen)
    resumed = resume_task(
        store, tid, "review", expected_attempt_id=aid, expected_generation=gen, response={"ok": 1}
    )
    assert resumed is not None
    claim(store, only_task(store, "run-1", 0))
    second = resumed.resumed_attempt_id
    assert wait_task(store, tid, "sign-off", expected_attempt_id=second, expected_generation=gen)
    waits = {w.wait_id: w for w in _journal(store, tid).waits}
    assert set(waits) == {"review", "sign-off"}
    assert waits["review"].state == "resolved"
    assert waits["review"].response == {"ok": 1}
    assert waits["review"].attempt_id == aid and waits["review"].resumed_attempt_id == second
    assert waits["sign-off"].state == "active" and waits["sign-off"].response is None
    assert all(w.generation == gen for w in waits.values())
    assert cancel_run(store, "run-1")
    waits = {w.wait_id: w for w in _journal(store, tid).waits}
    assert waits["sign-off"].state == "invalidated" and waits["sign-off"].invalidated
    assert waits["review"].state == "resolved"


def test_dt_journal_lists_the_child_runs_of_the_task(store: ContractStore, tmp_path: Path) -> None:
    def parent(inputs: TaskInputs, ctx: TaskContext) -> None:
        ctx.start_child([root("leaf")], {"x": 3}, run_id="kid")
        ctx.wait_for_child("kid")

    new_run(store, [root("p")], "parent")
    Worker(store, {"p": parent}, execution_root=tmp_path).process_once()
    task = only_task(store, "parent", 0)
    assert task.status is TaskStatus.WAITING
    journal = _journal(store, task.task_id)
    (kid,) = journal.children
    assert kid.run_id == "kid" and kid.status is RunStatus.RUNNING
    assert kid.run_input == {"x": 3}
    assert [w.wait_id for w in journal.waits] == [child_wait_id("kid")]


def test_dt_run_journals_list_the_tasks_that_recorded_something(store: ContractStore) -> None:
    new_run(store, [root("a"), root("b"), root("c")])
    a, b, _ = (only_task(store, "run-1", index) for index in range(3))
    claim(store, a)
    claim(store, b)
    assert _record(store, a.task_id, "s", 1, a.attempt_id, a.generation)
    assert wait_task(
        store, b.task_id, "w", expected_attempt_id=b.attempt_id, expected_generation=b.generation
    )
    journals = _durable(store).list_run_journals("run-1")
    assert set(journals) == {a.task_id, b.task_id}
    assert [s.name for s in journals[a.task_id].steps] == ["s"]
    assert [w.wait_id for w in journals[b.task_id].waits] == ["w"]
    assert _durable(store).list_run_journals("no-such-run") == {}
    assert _durable(store).get_task_journal("no-such-task") is None


# --- straight-line plugins on a real worker --------------------------------------------

_CHILD = [DagNode(slug="leaf", plugin="leaf")]


def _leaf(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    return {"value": int(str(inputs.parameters["x"])) * 10}


def _worker(store: ContractStore, tmp_path: Path, plugins: dict[str, Any], **kw: Any) -> Worker:
    return Worker(store, plugins, execution_root=tmp_path, lease_seconds=30, **kw)


def _output_fields(store: ContractStore, run_id: str, node_index: int = 0) -> list[Any]:
    found = store.resolve_outputs(run_id, store.get_output_ids(run_id, node_index))
    return [dict(output.fields) for output in found.values()]


def test_dt_straight_line_child_completes_with_one_child_run(
    store: ContractStore, tmp_path: Path
) -> None:
    def parent(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        child = ctx.start_child(_CHILD, input={"x": 4})
        outcome = ctx.wait_for_child(child)
        return {"value": outcome.outputs["leaf"][0]["fields"]["value"]}

    new_run(store, [root("parent")], "r0")
    _worker(store, tmp_path, {"parent": parent, "leaf": _leaf}).run_until_idle()
    assert store.get_run_status("r0") is RunStatus.COMPLETED
    assert _output_fields(store, "r0") == [{"value": 40}]
    assert isinstance(store, DagChildStore)
    assert len(store.list_child_runs("r0")) == 1


def test_dt_straight_line_failed_child_fails_the_parent_without_retry(
    store: ContractStore, tmp_path: Path
) -> None:
    caught: list[ChildRunFailed] = []

    def boom(inputs: TaskInputs, ctx: TaskContext) -> None:
        raise RuntimeError("leaf exploded")

    def parent(inputs: TaskInputs, ctx: TaskContext) -> None:
        try:
            ctx.wait_for_child(ctx.start_child(_CHILD, input={"x": 1}))
        except ChildRunFailed as exc:
            caught.append(exc)
            raise

    new_run(store, [root("parent")], "r0")
    policy = RetryPolicy(max_attempts=5, backoff_base=0, backoff_max=0)
    worker = _worker(store, tmp_path, {"parent": parent, "leaf": boom})
    worker.plugins.register("parent", parent, retry=policy)
    worker.run_until_idle()
    assert store.get_run_status("r0") is RunStatus.FAILED
    (kid,) = _durable_children(store, "r0")
    task = only_task(store, "r0", 0)
    assert task.status is TaskStatus.FAILED
    assert "child_run_failed" in (task.error or "") and kid in (task.error or "")
    assert "leaf exploded" in (task.error or "")
    # Resumed once after the child finished, then no retry.
    assert task.attempt_number == 2
    (exc,) = caught
    assert isinstance(exc, DagwerkError) and exc.result.status is RunStatus.FAILED
    assert exc.result.run_id == kid


def _durable_children(store: ContractStore, run_id: str) -> list[str]:
    assert isinstance(store, DagChildStore)
    return store.list_child_runs(run_id)


def test_dt_straight_line_nondeterministic_child_fails_without_retry(
    store: ContractStore, tmp_path: Path
) -> None:
    def parent(inputs: TaskInputs, ctx: TaskContext) -> None:
        # Asks for another input on the resumed attempt than on the first.
        child = ctx.start_child(_CHILD, input={"x": ctx.attempt})
        ctx.wait_for_child(child)

    new_run(store, [root("parent")], "r0")
    worker = _worker(store, tmp_path, {"leaf": _leaf})
    policy = RetryPolicy(max_attempts=5, backoff_base=0, backoff_max=0)
    worker.plugins.register("parent", parent, retry=policy)
    worker.run_until_idle()
    task = only_task(store, "r0", 0)
    assert task.status is TaskStatus.FAILED
    assert "child_run_nondeterministic" in (task.error or "")
    assert "start_child call 0" in (task.error or "")
    assert task.attempt_number == 2
    assert len(_durable_children(store, "r0")) == 1


def test_dt_straight_line_recursion_ends_at_the_depth_limit(
    store: ContractStore, tmp_path: Path
) -> None:
    """A plugin that starts a child of its own pipeline and waits for it: the
    deepest run is refused at the depth limit and every ancestor fails."""
    nodes = [root("rec")]
    recursive = ChildPipeline(tuple(nodes), allow_recursion=True, max_recursion=1_000)

    def rec(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        outcome = ctx.wait_for_child(ctx.start_child(recursive))
        return {"status": outcome.status.value}

    new_run(store, nodes, "r0")
    _worker(store, tmp_path, {"rec": rec}, max_child_depth=3).run_until_idle()
    assert store.get_run_status("r0") is RunStatus.FAILED
    runs = ["r0"]
    while children := _durable_children(store, runs[-1]):
        (kid,) = children
        runs.append(kid)
    assert len(runs) == 4  # depths 0..3; depth 4 was refused
    assert all(store.get_run_status(run) is RunStatus.FAILED for run in runs)
    error = only_task(store, "r0", 0).error or ""
    assert "child_depth_exceeded" in error and "limit of 3" in error


def test_dt_straight_line_approval_returns_the_response(
    store: ContractStore, tmp_path: Path
) -> None:
    calls: list[str] = []

    def approve(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        calls.append("start")
        review = ctx.wait("review")
        answer = ctx.wait("approval")
        return {"approved": answer["ok"], "review": review["by"]}

    new_run(store, [root("approve")], "r0")
    worker = _worker(store, tmp_path, {"approve": approve})
    worker.run_until_idle()
    task = only_task(store, "r0", 0)
    assert task.status is TaskStatus.WAITING and task.active_wait_id == "review"
    assert resume_task(
        store,
        task.task_id,
        "review",
        expected_attempt_id=task.attempt_id,
        expected_generation=task.generation,
        response={"by": "ana"},
    )
    worker.run_until_idle()
    task = only_task(store, "r0", 0)
    assert task.status is TaskStatus.WAITING and task.active_wait_id == "approval"
    assert resume_task(
        store,
        task.task_id,
        "approval",
        expected_attempt_id=task.attempt_id,
        expected_generation=task.generation,
        response={"ok": True},
    )
    worker.run_until_idle()
    assert store.get_run_status("r0") is RunStatus.COMPLETED
    assert _output_fields(store, "r0") == [{"approved": True, "review": "ana"}]
    assert calls == ["start"] * 3


def test_dt_straight_line_step_runs_once_across_retries_and_waits(
    store: ContractStore, tmp_path: Path
) -> None:
    charged: list[int] = []
    attempts: list[int] = []

    def charge(cents: int) -> dict[str, object]:
        charged.append(cents)
        return {"charge_id": f"ch_{len(charged)}", "cents": cents}

    def checkout(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        attempts.append(ctx.attempt)
        receipt = ctx.step("charge", charge, 500)

        @ctx.step("mail")
        def mail(to: str) -> str:
            charged.append(0)
            return f"sent to {to}"

        sent = mail("ana@example.org")
        if ctx.attempt == 1:
            raise RuntimeError("flaky after the charge")
        ctx.wait("confirm")
        return {"charge": receipt["charge_id"], "mail": sent}

    new_run(store, [root("checkout")], "r0")
    worker = _worker(store, tmp_path, {})
    policy = RetryPolicy(max_attempts=3, backoff_base=0, backoff_max=0)
    worker.plugins.register("checkout", checkout, retry=policy)
    worker.run_until_idle()
    task = only_task(store, "r0", 0)
    assert task.status is TaskStatus.WAITING, task.error
    assert resume_task(
        store,
        task.task_id,
        "confirm",
        expected_attempt_id=task.attempt_id,
        expected_generation=task.generation,
    )
    worker.run_until_idle()
    assert store.get_run_status("r0") is RunStatus.COMPLETED
    assert charged == [500, 0]  # each step ran once over three attempts
    assert attempts == [1, 2, 3]
    assert _output_fields(store, "r0") == [{"charge": "ch_1", "mail": "sent to ana@example.org"}]
    steps = _journal(store, task.task_id).steps
    assert [s.name for s in steps] == ["charge", "mail"]


def test_dt_step_name_reuse_fails_the_task_without_retry(
    store: ContractStore, tmp_path: Path
) -> None:
    def twice(inputs: TaskInputs, ctx: TaskContext) -> None:
        ctx.step("s", lambda: 1)
        ctx.step("s", lambda: 2)

    new_run(store, chain(1, prefix="t"))
    worker = _worker(store, tmp_path, {})
    worker.plugins.register("t0", twice, retry=RetryPolicy(max_attempts=3, backoff_base=0))
    worker.run_until_idle()
    task = only_task(store, "run-1", 0)
    assert task.status is TaskStatus.FAILED and task.attempt_number == 1
    assert "step_name_reused" in (task.error or "")


def test_dt_old_style_branch_on_resumed_from_wait_id_keeps_working(
    store: ContractStore, tmp_path: Path
) -> None:
    def review(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        if ctx.resumed_from_wait_id != "review":
            ctx.wait("review")
        response: Any = ctx.wait_response
        return {"ok": response["ok"]}

    new_run(store, [root("review")], "r0")
    worker = _worker(store, tmp_path, {"review": review})
    worker.run_until_idle()
    task = only_task(store, "r0", 0)
    assert resume_task(
        store,
        task.task_id,
        "review",
        expected_attempt_id=task.attempt_id,
        expected_generation=task.generation,
        response={"ok": True},
    )
    worker.run_until_idle()
    assert _output_fields(store, "r0") == [{"ok": True}]


def test_dt_stale_attempt_records_no_step(store: ContractStore, tmp_path: Path) -> None:
    ran: list[str] = []

    def stale(inputs: TaskInputs, ctx: TaskContext) -> None:
        if ctx.attempt == 1:
            # Another worker recovers the task while this attempt still runs.
            recover_task(
                store,
                ctx.task_id,
                expected_attempt_id=ctx.attempt_id,
                expected_generation=ctx.generation,
            )

        def charge() -> str:
            ran.append(ctx.attempt_id)
            return "ch"

        ctx.step("charge", charge)

    new_run(store, [root("stale")], "r0")
    worker = _worker(store, tmp_path, {"stale": stale})
    worker.run_until_idle()
    task = only_task(store, "r0", 0)
    assert task.status is TaskStatus.COMPLETED
    steps = _journal(store, task.task_id).steps
    # Both attempts ran the function; only the current one recorded it.
    assert len(ran) == 2 and [s.attempt_id for s in steps] == [ran[1]]


def test_dt_step_results_must_be_json_within_the_byte_limit(
    store: ContractStore, tmp_path: Path
) -> None:
    def big(inputs: TaskInputs, ctx: TaskContext) -> None:
        ctx.step("big", lambda: "x" * 100)

    def opaque(inputs: TaskInputs, ctx: TaskContext) -> None:
        ctx.step("opaque", object)

    new_run(
        store, [root("big"), root("opaque")], "r0", failure_policy=FailurePolicy.CONTINUE_OTHERS
    )
    policy = RetryPolicy(max_attempts=3, backoff_base=0, backoff_max=0)
    worker = _worker(store, tmp_path, {}, byte_limits=ByteLimits(max_output_bytes=50))
    worker.plugins.register("big", big, retry=policy)
    worker.plugins.register("opaque", opaque, retry=policy)
    worker.run_until_idle()
    too_big, not_json = only_task(store, "r0", 0), only_task(store, "r0", 1)
    assert too_big.status is TaskStatus.FAILED and too_big.attempt_number == 1
    assert "step_result_too_large" in (too_big.error or "")
    assert "max_output_bytes 50" in (too_big.error or "")
    assert not_json.status is TaskStatus.FAILED and not_json.attempt_number == 1
    assert "step_result_invalid" in (not_json.error or "")
    assert _journal(store, too_big.task_id).steps == ()


def test_dt_wait_for_children_returns_every_result_in_order(
    store: ContractStore, tmp_path: Path
) -> None:
    def parent(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        kids = [ctx.start_child(_CHILD, input={"x": x}) for x in (1, 2, 3)]
        results = ctx.wait_for_children(kids)
        return {"values": [r.outputs["leaf"][0]["fields"]["value"] for r in results]}

    new_run(store, [root("parent")], "r0")
    _worker(store, tmp_path, {"parent": parent, "leaf": _leaf}).run_until_idle()
    assert store.get_run_status("r0") is RunStatus.COMPLETED
    assert _output_fields(store, "r0") == [{"values": (10, 20, 30)}]
    assert len(_durable_children(store, "r0")) == 3
