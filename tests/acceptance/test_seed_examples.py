"""Seed 001's README code, run against MemoryStore with only the package renamed.

The snippets below are the code blocks of the seed's "Pipeline definition",
"Run lifecycle", "Waiting and re-entry" and "Task inputs" sections with
``dagabaaz`` replaced by ``dagwerk`` and nothing else changed. Each runs with
``exec`` in a namespace that supplies the names the README leaves to the
application (``store``, ``delivery``, ``task_id``, ...), so a change of a
public name or signature breaks this test.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.models import EmittedOutput
from dagwerk.orchestrator import on_task_complete
from dagwerk.store import Delivery

PIPELINE_DEFINITION = """
from dagwerk.constants import InputMode, InputRole
from dagwerk.models import DagNode, EdgeSource, InputEdge

nodes = [
    DagNode(slug="load", plugin="load"),
    DagNode(slug="settings", plugin="load_settings"),
    DagNode(
        slug="transform",
        plugin="transform",
        input_mode=InputMode.EACH,
        edges=(InputEdge(name="records", source="load"),),
        bindings={"title": EdgeSource(edge="records", field="title")},
    ),
    DagNode(
        slug="publish",
        plugin="publish",
        input_mode=InputMode.ALL,
        edges=(
            InputEdge(name="results", source="transform"),
            InputEdge(
                name="settings",
                source="settings",
                role=InputRole.SIDE,
                required=False,
            ),
        ),
    ),
]
"""

RUN_LIFECYCLE_START = """
from dagwerk.orchestrator import OrchestratorCallbacks, start_run

callbacks = OrchestratorCallbacks(
    on_run_completed=lambda run_id: print("completed", run_id),
    on_run_failed=lambda run_id: print("failed", run_id),
    on_run_crashed=lambda run_id: print("crashed", run_id),
    on_run_cancelled=lambda run_id: print("cancelled", run_id),
)

start_run(store, "run-1", callbacks=callbacks)
"""

RUN_LIFECYCLE_CLAIM = """
from dagwerk.execution import claim_task

claimed = claim_task(
    store,
    delivery.task_id,
    expected_attempt_id=delivery.attempt_id,
    expected_generation=delivery.generation,
)
if claimed is None:
    return
"""

WAITING_AND_REENTRY = """
from dagwerk.waiting import resume_task, wait_task

waited = wait_task(
    store,
    task_id,
    checkpoint_id,
    expected_attempt_id=attempt_id,
    expected_generation=generation,
)

# In the transaction that records the response:
resumed = resume_task(
    store,
    task_id,
    checkpoint_id,
    expected_attempt_id=attempt_id,
    expected_generation=generation,
)
"""

TASK_INPUTS = """
from dagwerk.task_input import resolve_task_inputs

inputs = resolve_task_inputs(output_store, run_id="run-1", plan=plan)
record = inputs.edges["records"][0]
print(record.fields, record.data, inputs.parameters)
"""


def _claim_function(namespace: dict[str, Any]) -> Any:
    """The claim snippet is a function body in the README (it ``return``s)."""
    source = "def handle(delivery):\n" + textwrap.indent(RUN_LIFECYCLE_CLAIM, "    ")
    source += "    return claimed\n"
    exec(source, namespace)
    return namespace["handle"]


OUTPUTS: dict[str, Callable[[str], tuple[EmittedOutput, ...]]] = {
    "load": lambda task_id: (
        EmittedOutput(id=f"{task_id}/r1", fields={"title": "First"}, data={"path": "/in/1.json"}),
        EmittedOutput(id=f"{task_id}/r2", fields={"title": "Second"}, data={"path": "/in/2.json"}),
    ),
    "load_settings": lambda task_id: (EmittedOutput(id=f"{task_id}/s", fields={"locale": "en"}),),
    "transform": lambda task_id: (EmittedOutput(id=f"{task_id}/t", fields={"ok": True}),),
    "publish": lambda task_id: (EmittedOutput(id=f"{task_id}/p", data={"url": "https://x"}),),
}


def test_seed_001_examples_run_against_the_memory_store(
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace: dict[str, Any] = {}
    exec(PIPELINE_DEFINITION, namespace)
    store = MemoryStore()
    # "The application stores the run and its node definitions before it
    # calls start_run."
    assert store.create_run("run-1", namespace["nodes"])
    namespace["store"] = store
    exec(RUN_LIFECYCLE_START, namespace)
    assert store.get_run_status("run-1") is RunStatus.RUNNING
    handle = _claim_function(namespace)

    waited_once = False
    printed_inputs = False
    for _ in range(50):
        deliveries: list[Delivery] = store.list_deliveries("run-1")
        if not deliveries:
            break
        for delivery in deliveries:
            claimed = handle(delivery)
            if claimed is None:
                # Another delivery owns the attempt, or the attempt is over.
                store.ack_delivery(delivery.delivery_id)
                continue
            task = store.get_task(claimed.task_id)
            assert task is not None
            plugin = namespace["nodes"][claimed.node_index].plugin
            if plugin == "transform" and not printed_inputs:
                exec(TASK_INPUTS, {**namespace, "output_store": store, "plan": task.plan})
                printed_inputs = True
            if plugin == "publish" and not waited_once:
                # Ask a human before publishing: the README's wait and resume.
                scope = {
                    **namespace,
                    "task_id": claimed.task_id,
                    "checkpoint_id": "approval-1",
                    "attempt_id": claimed.attempt_id,
                    "generation": claimed.generation,
                }
                exec(WAITING_AND_REENTRY, scope)
                assert scope["waited"] is not None
                assert scope["resumed"] is not None
                resumed_task = store.get_task(claimed.task_id)
                assert resumed_task is not None
                assert resumed_task.status is TaskStatus.QUEUED
                store.ack_delivery(delivery.delivery_id)
                waited_once = True
                continue
            if claimed.resumed_from_wait_id is not None:
                assert claimed.resumed_from_wait_id == "approval-1"
            on_task_complete(
                store,
                task_id=claimed.task_id,
                expected_attempt_id=claimed.attempt_id,
                outputs=OUTPUTS[plugin](claimed.task_id),
                callbacks=namespace["callbacks"],
            )
            store.ack_delivery(delivery.delivery_id)

    assert waited_once
    assert printed_inputs
    assert store.get_run_status("run-1") is RunStatus.COMPLETED
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "completed run-1"
    # The Task inputs print: routing fields, materialised data, parameters.
    assert "'title': 'First'" in out[0]
    assert "/in/1.json" in out[0]
    transform_tasks = [t for t in store.list_tasks("run-1") if t.node_index == 2]
    assert len(transform_tasks) == 2
    assert sorted(str(t.plan.parameters["title"]) for t in transform_tasks) == ["First", "Second"]
    (publish,) = [t for t in store.list_tasks("run-1") if t.node_index == 3]
    assert publish.resumed_from_wait_id == "approval-1"
    edges = {edge.edge: edge.output_ids for edge in publish.plan.edges}
    assert set(edges) == {"results", "settings"}
    assert len(edges["results"]) == 2
