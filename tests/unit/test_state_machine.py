"""Random interleavings of the task and run lifecycle against MemoryStore.

A hypothesis ``RuleBasedStateMachine`` builds a small random pipeline with a
random failure policy, then drives claim, complete, fail, crash, wait,
resume, recover, retry_task, retry_run, cancel, stale callbacks and exact
replays in any order. After every step it checks these invariants:

* no QUEUED task without a deliverable outbox row (OB-01);
* one current attempt per task: attempt IDs are unique and a superseded
  attempt never becomes current again (SM-05);
* a terminal run has no QUEUED, RUNNING or WAITING task in its active
  generation (OR-12), and a COMPLETED run has every active task COMPLETED
  (OR-09);
* every terminal transition fired exactly one matching callback (OR-13);
* stale callbacks change nothing (FN-12), and replays of wait, resume and
  recovery return the first result (WT-03, WT-06, WT-13).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import (
    RUN_RETRYABLE_STATUSES,
    RUN_TERMINAL_STATUSES,
    FailurePolicy,
    InputMode,
    RunStatus,
    TaskStatus,
)
from dagwerk.execution import claim_task, recover_task
from dagwerk.models import DagNode, EmittedOutput, InputEdge
from dagwerk.orchestrator import (
    cancel_run,
    on_task_complete,
    on_task_crashed,
    on_task_failed,
    reconcile_run,
    start_run,
)
from dagwerk.retry import retry_run, retry_task
from dagwerk.store import TaskRecord
from dagwerk.testing.helpers import CallbackLog, assert_queued_tasks_deliverable, fingerprint
from dagwerk.waiting import resume_task, wait_task

RUN = "run"
UNFINISHED = {TaskStatus.QUEUED, TaskStatus.RUNNING, TaskStatus.WAITING}
CALLBACK_OF = {
    RunStatus.COMPLETED: "completed",
    RunStatus.FAILED: "failed",
    RunStatus.CRASHED: "crashed",
    RunStatus.CANCELLED: "cancelled",
}


@st.composite
def pipelines(draw: st.DrawFn) -> list[DagNode]:
    """1-4 nodes; each non-root node reads one or two earlier nodes."""
    count = draw(st.integers(min_value=1, max_value=4))
    nodes = [DagNode(slug="n0", plugin="p0")]
    for index in range(1, count):
        parents = draw(
            st.lists(st.integers(0, index - 1), min_size=0, max_size=2, unique=True).map(sorted)
        )
        if not parents:
            nodes.append(DagNode(slug=f"n{index}", plugin=f"p{index}"))
            continue
        mode = (
            draw(st.sampled_from([InputMode.EACH, InputMode.ALL]))
            if len(parents) == 1
            else InputMode.ALL
        )
        nodes.append(
            DagNode(
                slug=f"n{index}",
                plugin=f"p{index}",
                input_mode=mode,
                edges=tuple(InputEdge(name=f"n{p}", source=f"n{p}") for p in parents),
            )
        )
    return nodes


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        self.log = CallbackLog()
        self.counter = 0
        self.superseded: dict[str, set[str]] = {}
        self.current: dict[str, str] = {}
        # (kind, args, first result) of wait / resume / recovery calls
        self.replays: list[tuple[str, tuple[Any, ...], object]] = []
        self.transitions = 0

    # -- helpers -------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def tasks(self, *statuses: TaskStatus) -> list[TaskRecord]:
        return [t for t in self.store.list_tasks(RUN) if not statuses or t.status in statuses]

    def status(self) -> RunStatus:
        status = self.store.get_run_status(RUN)
        assert status is not None
        return status

    def step(self, action: Callable[[], object]) -> object:
        """Run one action and account for the terminal transition it made."""
        before, events = self.status(), len(self.log.events)
        result = action()
        after = self.status()
        if after != before:
            event(f"run {before.value} -> {after.value}")
        fired = self.log.kinds()[events:]
        if after in RUN_TERMINAL_STATUSES and before not in RUN_TERMINAL_STATUSES:
            assert fired == [CALLBACK_OF[after]], (before, after, fired)
        elif after == before:
            assert fired == [], (before, after, fired)
        return result

    def has(self, status: TaskStatus) -> bool:
        return bool(self.tasks(status))

    def pick(self, data: st.DataObject, *statuses: TaskStatus) -> TaskRecord | None:
        found = self.tasks(*statuses)
        return data.draw(st.sampled_from(found)) if found else None

    # -- setup ---------------------------------------------------------------

    @initialize(nodes=pipelines(), policy=st.sampled_from(list(FailurePolicy)))
    def create(self, nodes: list[DagNode], policy: FailurePolicy) -> None:
        assert self.store.create_run(RUN, nodes, failure_policy=policy)
        start_run(self.store, RUN, callbacks=self.log.callbacks)

    # -- the one rule: pick an action that can act now ------------------------

    def enabled(self) -> list[str]:
        """Actions with something to act on; every step therefore does work."""
        status = self.status()
        options: list[str] = []
        if self.store.list_deliveries(RUN):
            options.append("claim")
        if self.has(TaskStatus.RUNNING):
            options += ["complete", "complete", "fail_or_crash", "wait", "recover"]
        if self.has(TaskStatus.WAITING):
            options.append("resume")
        if self.has(TaskStatus.CRASHED):
            options.append("retry_crashed_task")
        if status in RUN_RETRYABLE_STATUSES:
            options.append("retry_whole_run")
        if self.superseded:
            options.append("stale_callback")
        if self.replays:
            options.append("replay")
        return options

    @rule(data=st.data())
    def act(self, data: st.DataObject) -> None:
        options = self.enabled()
        # Cancellation ends everything; it is drawn rarely so runs get deep.
        if not options or data.draw(st.integers(0, 15)) == 11:
            options = ["cancel"]
        action = data.draw(st.sampled_from(options))
        event(f"action {action}")
        getattr(self, f"do_{action}")(data)

    # -- actions ------------------------------------------------------------------

    def do_claim(self, data: st.DataObject) -> None:
        rows = self.store.list_deliveries(RUN)
        if not rows:
            return
        row = data.draw(st.sampled_from(rows))
        won = self.step(
            lambda: claim_task(
                self.store,
                row.task_id,
                expected_attempt_id=row.attempt_id,
                expected_generation=row.generation,
            )
        )
        if won is None:
            record = self.store.get_task(row.task_id)
            assert record is not None
            # A lost claim never belongs to the QUEUED current attempt of a
            # RUNNING run.
            assert not (
                record.status is TaskStatus.QUEUED
                and record.attempt_id == row.attempt_id
                and self.status() is RunStatus.RUNNING
                and not record.invalidated
            )
            if record.status is not TaskStatus.QUEUED or record.attempt_id != row.attempt_id:
                self.store.ack_delivery(row.delivery_id)

    def do_complete(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(0, 2))
        record = self.pick(data, TaskStatus.RUNNING)
        if record is None:
            return
        outputs = tuple(
            EmittedOutput(id=self.fresh("o"), fields={"n": n, "title": f"t{n}"})
            for n in range(count)
        )
        self.step(
            lambda: on_task_complete(
                self.store,
                task_id=record.task_id,
                expected_attempt_id=record.attempt_id,
                outputs=outputs,
                callbacks=self.log.callbacks,
            )
        )

    def do_fail_or_crash(self, data: st.DataObject) -> None:
        crash = data.draw(st.booleans())
        record = self.pick(data, TaskStatus.RUNNING)
        if record is None:
            return
        handler = on_task_crashed if crash else on_task_failed
        self.step(
            lambda: handler(
                self.store,
                task_id=record.task_id,
                expected_attempt_id=record.attempt_id,
                error_message="boom",
                callbacks=self.log.callbacks,
            )
        )

    def do_wait(self, data: st.DataObject) -> None:
        record = self.pick(data, TaskStatus.RUNNING)
        if record is None:
            return
        args = (record.task_id, self.fresh("w"), record.attempt_id, record.generation)
        result = self.step(
            lambda: wait_task(
                self.store,
                args[0],
                args[1],
                expected_attempt_id=args[2],
                expected_generation=args[3],
            )
        )
        assert result is not None
        self.replays.append(("wait", args, result))

    def do_resume(self, data: st.DataObject) -> None:
        record = self.pick(data, TaskStatus.WAITING)
        if record is None:
            return
        assert record.active_wait_id is not None
        args = (record.task_id, record.active_wait_id, record.attempt_id, record.generation)
        result = self.step(
            lambda: resume_task(
                self.store,
                args[0],
                args[1],
                expected_attempt_id=args[2],
                expected_generation=args[3],
            )
        )
        assert result is not None
        self.replays.append(("resume", args, result))

    def do_recover(self, data: st.DataObject) -> None:
        record = self.pick(data, TaskStatus.RUNNING)
        if record is None:
            return
        args = (record.task_id, record.attempt_id, record.generation)
        result = self.step(
            lambda: recover_task(
                self.store, args[0], expected_attempt_id=args[1], expected_generation=args[2]
            )
        )
        assert result is not None
        self.replays.append(("recover", args, result))

    def do_retry_crashed_task(self, data: st.DataObject) -> None:
        record = self.pick(data, TaskStatus.CRASHED)
        if record is None:
            return
        running = self.status() is RunStatus.RUNNING
        attempt = self.step(
            lambda: retry_task(self.store, record.task_id, expected_attempt_id=record.attempt_id)
        )
        assert (attempt is not None) == running
        if attempt is not None:
            self.step(lambda: reconcile_run(self.store, RUN, callbacks=self.log.callbacks))

    # -- run rules -------------------------------------------------------------

    def do_retry_whole_run(self, data: st.DataObject) -> None:
        if self.status() not in RUN_RETRYABLE_STATUSES:
            return
        result = retry_run(self.store, RUN)
        record = self.store.get_run(RUN)
        assert record is not None
        assert record.status is RunStatus.RUNNING
        assert record.retry_count == result.retry_count
        self.step(lambda: reconcile_run(self.store, RUN, callbacks=self.log.callbacks))

    def do_cancel(self, data: st.DataObject) -> None:
        before = self.status()
        made = self.step(lambda: cancel_run(self.store, RUN, callbacks=self.log.callbacks))
        assert made == (before in (RunStatus.PENDING, RunStatus.RUNNING))
        assert self.status() in RUN_TERMINAL_STATUSES

    # -- stale callbacks and replays ------------------------------------------

    def do_stale_callback(self, data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(["complete", "fail", "crash", "claim", "wait", "recover"]))
        stale = sorted(
            (task_id, attempt)
            for task_id, attempts in self.superseded.items()
            for attempt in attempts
        )
        if not stale:
            return
        task_id, attempt = data.draw(st.sampled_from(stale))
        record = self.store.get_task(task_id)
        assert record is not None
        generation = record.generation
        store = self.store
        calls: dict[str, Callable[[], object]] = {
            "complete": lambda: store.try_complete_task(
                task_id, (EmittedOutput(id=self.fresh("late")),), expected_attempt_id=attempt
            ),
            "fail": lambda: store.mark_task_failed(task_id, "late", expected_attempt_id=attempt),
            "crash": lambda: store.mark_task_crashed(task_id, "late", expected_attempt_id=attempt),
            "claim": lambda: store.try_claim_task(
                task_id, expected_attempt_id=attempt, expected_generation=generation
            ),
            "wait": lambda: store.try_wait_task(
                task_id,
                self.fresh("sw"),
                expected_attempt_id=attempt,
                expected_generation=generation,
            ),
            "recover": lambda: (
                store.try_recover_task(
                    task_id, expected_attempt_id=attempt, expected_generation=generation
                )
                if not any(
                    k == "recover" and a[:2] == (task_id, attempt) for k, a, _ in self.replays
                )
                else None
            ),
        }
        event(f"stale {kind}")
        before = fingerprint(store, RUN)
        assert calls[kind]() is None
        assert fingerprint(store, RUN) == before

    def do_replay(self, data: st.DataObject) -> None:
        if not self.replays:
            return
        kind, args, first = data.draw(st.sampled_from(self.replays))
        event(f"replay {kind}")
        before = fingerprint(self.store, RUN)
        if kind == "wait":
            again: object = self.store.try_wait_task(
                args[0], args[1], expected_attempt_id=args[2], expected_generation=args[3]
            )
        elif kind == "resume":
            again = self.store.try_resume_task(
                args[0], args[1], expected_attempt_id=args[2], expected_generation=args[3]
            )
        else:
            again = self.store.try_recover_task(
                args[0], expected_attempt_id=args[1], expected_generation=args[2]
            )
        assert again == first
        assert fingerprint(self.store, RUN) == before

    # -- invariants --------------------------------------------------------------

    @invariant()
    def queued_tasks_have_deliveries(self) -> None:
        assert_queued_tasks_deliverable(self.store, RUN)

    @invariant()
    def one_current_attempt_per_task(self) -> None:
        records = self.store.list_tasks(RUN, include_invalidated=True)
        attempts = [r.attempt_id for r in records]
        assert len(attempts) == len(set(attempts))
        for record in records:
            previous = self.current.get(record.task_id)
            if previous is not None and previous != record.attempt_id:
                self.superseded.setdefault(record.task_id, set()).add(previous)
            self.current[record.task_id] = record.attempt_id
            assert record.attempt_id not in self.superseded.get(record.task_id, set())

    @invariant()
    def terminal_runs_have_no_unfinished_tasks(self) -> None:
        status = self.store.get_run_status(RUN)
        if status is None:
            return
        active = self.store.list_tasks(RUN)
        if status in RUN_TERMINAL_STATUSES:
            assert not [t for t in active if t.status in UNFINISHED]
            assert all(t.active_wait_id is None for t in active)
        if status is RunStatus.COMPLETED:
            assert all(t.status is TaskStatus.COMPLETED for t in active)
            launches = self.store.list_node_launches(RUN)
            nodes = self.store.get_run_nodes(RUN)
            assert nodes is not None
            assert sorted(launches) == list(range(len(nodes)))
            assert all(launch.complete for launch in launches.values())


LifecycleMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLifecycle = LifecycleMachine.TestCase
