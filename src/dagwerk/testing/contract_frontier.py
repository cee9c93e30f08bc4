"""Contract tests: the run frontier and the targeted reconcile, on
every backend.

``RunFrontierStore.get_run_frontier`` answers, from one snapshot, what the
reconcile after a completion needs: the run's status, how many of its nodes
have a complete launch, whether anything failed, and the active launches of
the nodes asked for. It must agree with ``list_node_launches`` and the task
records, and :func:`dagwerk.frontier.reconcile_after_completion` driven by
it must leave a run exactly where ``reconcile_run`` leaves it (RF-05).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from dagwerk.constants import InputMode, NodeDisposition, RunStatus, TaskStatus
from dagwerk.execution import claim_task
from dagwerk.frontier import reconcile_after_completion
from dagwerk.models import DagNode, EmittedOutput
from dagwerk.orchestrator import reconcile_run
from dagwerk.store import LaunchProgress, RunFrontier, RunFrontierStore
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    chain,
    child,
    new_run,
    only_task,
    root,
)

__all__ = [
    "test_rf_01_unknown_run_has_no_frontier",
    "test_rf_02_frontier_agrees_with_the_launch_list",
    "test_rf_03_frontier_counts_complete_nodes_and_sees_failures",
    "test_rf_04_created_launch_equals_its_listed_view",
    "test_rf_05_targeted_reconcile_equals_full_reconcile_on_random_dags",
    "test_rf_06_targeted_reconcile_finalises_a_failure_left_unfinalised",
]


def _frontier_store(store: ContractStore) -> RunFrontierStore:
    assert isinstance(store, RunFrontierStore), "every shipped store offers the frontier"
    return store


def _frontier(
    store: ContractStore, run_id: str, nodes: list[int], *, count: bool = False
) -> RunFrontier:
    found = _frontier_store(store).get_run_frontier(run_id, nodes, count_complete=count)
    assert isinstance(found, RunFrontier)
    return found


def _complete_only_task(
    store: ContractStore, run_id: str, node_index: int, outputs: tuple[EmittedOutput, ...]
) -> bool:
    """Claim and complete the node's only task; returns ``launch_complete``."""
    record = only_task(store, run_id, node_index)
    won = claim_task(
        store,
        record.task_id,
        expected_attempt_id=record.attempt_id,
        expected_generation=record.generation,
    )
    assert won is not None
    result = store.try_complete_task(record.task_id, outputs, expected_attempt_id=won.attempt_id)
    assert result is not None
    return result.launch_complete


def _out(output_id: str) -> tuple[EmittedOutput, ...]:
    return (EmittedOutput(id=output_id, fields={"k": output_id}),)


def test_rf_01_unknown_run_has_no_frontier(store: ContractStore) -> None:
    """RF-01: a run that does not exist has no frontier."""
    assert _frontier_store(store).get_run_frontier("no-such-run", [0, 1]) is None


def test_rf_02_frontier_agrees_with_the_launch_list(store: ContractStore) -> None:
    """RF-02: the frontier holds exactly the requested nodes' active launches,
    field for field as ``list_node_launches`` reports them; other and
    out-of-range indices are ignored."""
    new_run(store, [root("a"), root("b"), child("c", "a", "b", mode=InputMode.ALL)])
    found = _frontier(store, "run-1", [0, 2, 7, -1])
    assert found.status is RunStatus.RUNNING
    assert found.node_count == 3
    assert found.complete_nodes is None  # not asked for
    assert _frontier(store, "run-1", [0], count=True).complete_nodes == 0
    assert found.has_failure is False
    listed = store.list_node_launches("run-1")
    assert sorted(found.launches) == [0]
    progress = found.launches[0]
    assert isinstance(progress, LaunchProgress)
    assert (
        progress.launch_id,
        progress.node_index,
        progress.generation,
        progress.disposition,
        progress.complete,
    ) == (
        listed[0].id,
        0,
        listed[0].generation,
        NodeDisposition.LAUNCHED,
        False,
    )
    assert sorted(_frontier(store, "run-1", [0, 1, 2]).launches) == [0, 1]
    assert _frontier(store, "run-1", []).launches == {}


def test_rf_03_frontier_counts_complete_nodes_and_sees_failures(store: ContractStore) -> None:
    """RF-03: ``complete_nodes`` counts complete launches when asked; a FAILED task left
    in a RUNNING run (a crash before finalisation) sets ``has_failure``."""
    new_run(store, chain(3))
    assert _complete_only_task(store, "run-1", 0, _out("o0")) is True
    found = _frontier(store, "run-1", [0, 1], count=True)
    assert found.complete_nodes == 1
    assert found.launches[0].complete is True
    assert 1 not in found.launches  # nobody reconciled yet
    reconcile_run(store, "run-1", callbacks=CallbackLog().callbacks)
    record = only_task(store, "run-1", 1)
    won = claim_task(
        store,
        record.task_id,
        expected_attempt_id=record.attempt_id,
        expected_generation=record.generation,
    )
    assert won is not None
    assert store.mark_task_failed(record.task_id, "boom", expected_attempt_id=won.attempt_id)
    after = _frontier(store, "run-1", [1])
    assert after.status is RunStatus.RUNNING
    assert after.has_failure is True
    assert after.launches[1].complete is False


def test_rf_04_created_launch_equals_its_listed_view(store: ContractStore) -> None:
    """RF-04: the launch a creation returns is the launch the store lists."""
    log = new_run(store, chain(2))
    assert _complete_only_task(store, "run-1", 0, _out("o0"))
    reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
    listed = store.list_node_launches("run-1")[1]
    assert listed.disposition is NodeDisposition.LAUNCHED
    assert len(listed.task_ids) == 1
    assert only_task(store, "run-1", 1).task_id == listed.task_ids[0]


# --- RF-05: equivalence with the full reconcile ------------------------------


def random_dag(rng: random.Random, size: int) -> list[DagNode]:
    """A random DAG of ``size`` nodes: each node takes 0-3 earlier nodes as
    sources, in ALL mode or in EACH mode (one main edge, the rest side edges)."""
    nodes: list[DagNode] = []
    for index in range(size):
        slug = f"n{index}"
        if index == 0 or rng.random() < 0.2:
            nodes.append(root(slug))
            continue
        count = rng.randint(1, min(3, index))
        sources = sorted(rng.sample(range(index), count))
        names = [f"n{s}" for s in sources]
        if rng.random() < 0.5:
            # EACH takes one main edge; further sources are optional side edges.
            nodes.append(child(slug, names[0], mode=InputMode.EACH, side=names[1:]))
        else:
            nodes.append(child(slug, *names, mode=InputMode.ALL))
    return nodes


def _state(store: ContractStore, run_id: str) -> tuple[object, ...]:
    launches = store.list_node_launches(run_id)
    tasks = store.list_tasks(run_id)
    return (
        store.get_run_status(run_id),
        tuple(
            (i, nl.disposition, nl.complete, len(nl.task_ids), nl.generation, nl.error)
            for i, nl in sorted(launches.items())
        ),
        tuple((t.node_index, t.status) for t in tasks),
    )


Reconcile = Callable[[ContractStore, str, int, CallbackLog], None]


def _full(store: ContractStore, run_id: str, node_index: int, log: CallbackLog) -> None:
    reconcile_run(store, run_id, callbacks=log.callbacks)


def _targeted(store: ContractStore, run_id: str, node_index: int, log: CallbackLog) -> None:
    reconcile_after_completion(store, run_id, [node_index], callbacks=log.callbacks)


def drive(
    store: ContractStore,
    run_id: str,
    nodes: list[DagNode],
    outputs: dict[int, int],
    reconcile: Reconcile,
    *,
    fail_node: int | None = None,
) -> list[tuple[object, ...]]:
    """Run ``nodes`` to the end, completing the oldest QUEUED task each step
    with ``outputs[node]`` outputs (``fail_node``'s first task fails without
    finalisation instead), reconciling with ``reconcile`` after every launch
    completion; returns the run's state after every step."""
    log = new_run(store, nodes, run_id)
    states = [_state(store, run_id)]
    for step in range(500):
        queued = [t for t in store.list_tasks(run_id) if t.status is TaskStatus.QUEUED]
        if not queued or store.get_run_status(run_id) is not RunStatus.RUNNING:
            break
        record = queued[0]
        won = claim_task(
            store,
            record.task_id,
            expected_attempt_id=record.attempt_id,
            expected_generation=record.generation,
        )
        assert won is not None
        if record.node_index == fail_node:
            fail_node = None
            store.mark_task_failed(record.task_id, "boom", expected_attempt_id=won.attempt_id)
            states.append(_state(store, run_id))
            continue
        emitted = tuple(
            EmittedOutput(id=f"s{step}-{n}", fields={"n": n})
            for n in range(outputs[record.node_index])
        )
        result = store.try_complete_task(
            record.task_id, emitted, expected_attempt_id=won.attempt_id
        )
        assert result is not None
        if result.launch_complete:
            reconcile(store, run_id, record.node_index, log)
        states.append(_state(store, run_id))
    states.append(tuple(log.kinds(run_id)))
    return states


def test_rf_05_targeted_reconcile_equals_full_reconcile_on_random_dags(
    store: ContractStore,
) -> None:
    """RF-05: on random DAGs (zero-output nodes give zero-task children, one
    run in four has a failure left unfinalised), reconciling each completion
    with ``reconcile_after_completion`` passes through exactly the states the
    full ``reconcile_run`` passes through, and ends the same way."""
    rng = random.Random(20240917)
    for case in range(12):
        size = rng.randint(1, 9)
        nodes = random_dag(rng, size)
        outputs = {i: rng.choice([0, 1, 1, 2]) for i in range(size)}
        fail_node = rng.randrange(size) if case % 4 == 3 else None
        full = drive(store, f"full-{case}", nodes, outputs, _full, fail_node=fail_node)
        targeted = drive(store, f"tgt-{case}", nodes, outputs, _targeted, fail_node=fail_node)
        assert targeted == full, f"case {case}: {[n.slug for n in nodes]}"


def test_rf_06_targeted_reconcile_finalises_a_failure_left_unfinalised(
    store: ContractStore,
) -> None:
    """RF-06: a FAILED task left in a RUNNING run (its finalisation lost) is
    finalised by the next targeted reconcile, as the full one would."""
    log = new_run(store, [root("a"), root("b"), child("c", "a")])
    record = only_task(store, "run-1", 1)
    won = claim_task(
        store,
        record.task_id,
        expected_attempt_id=record.attempt_id,
        expected_generation=record.generation,
    )
    assert won is not None
    assert store.mark_task_failed(record.task_id, "boom", expected_attempt_id=won.attempt_id)
    assert _complete_only_task(store, "run-1", 0, _out("o0"))
    reconcile_after_completion(store, "run-1", [0], callbacks=log.callbacks)
    assert store.get_run_status("run-1") is RunStatus.FAILED
    assert log.kinds("run-1") == ["failed"]
    assert 2 not in store.list_node_launches("run-1")
