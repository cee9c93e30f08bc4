"""Contract tests: every node's outputs of a run in one read
(:class:`~dagwerk.store_results.RunOutputsStore`), the same as reading
them node by node."""

from __future__ import annotations

from collections.abc import Mapping

from dagwerk.models import ResolvedOutput
from dagwerk.orchestrator import on_task_complete, on_task_failed
from dagwerk.retry import retry_run
from dagwerk.store import TaskRecord
from dagwerk.store_results import RunOutputsStore
from dagwerk.testing.helpers import (
    CallbackLog,
    ContractStore,
    child,
    claim,
    emit,
    new_run,
    only_task,
    root,
    tasks_of,
)

__all__ = [
    "test_ro_01_every_nodes_outputs_come_in_publication_order",
    "test_ro_02_invalidated_outputs_are_left_out",
]


def _run_outputs(store: object) -> RunOutputsStore:
    assert isinstance(store, RunOutputsStore), "the store reads no run's outputs at once"
    return store


def _node_by_node(store: ContractStore, run_id: str, nodes: int) -> dict[int, list[object]]:
    found: dict[int, list[object]] = {}
    for index in range(nodes):
        ids = tuple(store.get_output_ids(run_id, index))
        resolved = store.resolve_outputs(run_id, ids) if ids else {}
        if ids:
            found[index] = [resolved[i].model_dump() for i in ids if i in resolved]
    return found


def _dumped(outputs: Mapping[int, tuple[ResolvedOutput, ...]]) -> dict[int, list[object]]:
    return {index: [o.model_dump() for o in found] for index, found in outputs.items()}


def _complete(store: ContractStore, log: CallbackLog, record: TaskRecord, *ids: str) -> None:
    """Claim and complete the task's current attempt with outputs ``ids``."""
    claim(store, record)
    on_task_complete(
        store,
        task_id=record.task_id,
        expected_attempt_id=record.attempt_id,
        outputs=emit(*ids, k="v"),
        callbacks=log.callbacks,
    )


def test_ro_01_every_nodes_outputs_come_in_publication_order(store: ContractStore) -> None:
    reader = _run_outputs(store)
    log = new_run(store, [root("r"), child("m", "r")])
    _complete(store, log, only_task(store, "run-1", 0), "r-2", "r-1", "r-3")
    first, *_ = tasks_of(store, "run-1", 1)
    _complete(store, log, first, "m-1")
    found = reader.get_run_outputs("run-1")
    assert [o.id for o in found[0]] == ["r-2", "r-1", "r-3"]
    assert [o.id for o in found[1]] == ["m-1"]
    assert dict(found[0][0].fields) == {"k": "v"}
    assert _dumped(found) == _node_by_node(store, "run-1", 2)
    assert reader.get_run_outputs("no-such-run") == {}


def test_ro_02_invalidated_outputs_are_left_out(store: ContractStore) -> None:
    reader = _run_outputs(store)
    log = new_run(store, [root("r"), child("m", "r")])
    _complete(store, log, only_task(store, "run-1", 0), "r1", "r2")
    good, bad = tasks_of(store, "run-1", 1)
    _complete(store, log, good, "m1")
    claim(store, bad)
    on_task_failed(
        store,
        task_id=bad.task_id,
        expected_attempt_id=bad.attempt_id,
        error_message="boom",
        callbacks=log.callbacks,
    )
    assert [o.id for o in reader.get_run_outputs("run-1")[1]] == ["m1"]
    retry_run(store, "run-1")
    # The retried node's outputs are invalidated with it; the root's stay.
    found = reader.get_run_outputs("run-1")
    assert list(found) == [0]
    assert [o.id for o in found[0]] == ["r1", "r2"]
    assert _dumped(found) == _node_by_node(store, "run-1", 2)
