"""Run the seed's example pipeline end to end, in this process.

load ──records──▶ transform (EACH) ──results──▶ publish (ALL) ◀──settings── settings

The loop below is what a dagwerk worker does for every delivery: claim the
attempt, resolve its inputs, run the plugin, report the outputs, acknowledge
the delivery. Until the worker runtime and ``Engine`` land, the example drives
that loop itself over the in-memory reference store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dagwerk.backends.memory import MemoryStore
from dagwerk.constants import InputMode, InputRole, RunStatus
from dagwerk.execution import claim_task
from dagwerk.models import DagNode, EdgeSource, EmittedOutput, InputEdge, TaskInputs
from dagwerk.orchestrator import OrchestratorCallbacks, on_task_complete, on_task_failed, start_run
from dagwerk.task_input import resolve_task_inputs

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
            InputEdge(name="settings", source="settings", role=InputRole.SIDE, required=False),
        ),
    ),
]

Plugin = Callable[[str, TaskInputs], tuple[EmittedOutput, ...]]


def load(task_id: str, inputs: TaskInputs) -> tuple[EmittedOutput, ...]:
    titles = inputs.parameters.get("titles", ())
    assert isinstance(titles, tuple)
    return tuple(
        EmittedOutput(id=f"record-{i}", fields={"title": str(title)})
        for i, title in enumerate(titles)
    )


def load_settings(task_id: str, inputs: TaskInputs) -> tuple[EmittedOutput, ...]:
    return (EmittedOutput(id="settings", fields={"separator": " | "}),)


def transform(task_id: str, inputs: TaskInputs) -> tuple[EmittedOutput, ...]:
    title = str(inputs.parameters["title"])
    return (
        EmittedOutput(
            id=f"{task_id}/upper", fields={"title": title.upper()}, data={"source": title}
        ),
    )


def publish(task_id: str, inputs: TaskInputs) -> tuple[EmittedOutput, ...]:
    titles = sorted(str(out.fields["title"]) for out in inputs.edges["results"])
    settings = inputs.edges["settings"]
    separator = str(settings[0].fields["separator"]) if settings else ", "
    return (EmittedOutput(id="page", fields={"text": separator.join(titles)}),)


PLUGINS: Mapping[str, Plugin] = {
    "load": load,
    "load_settings": load_settings,
    "transform": transform,
    "publish": publish,
}


def main() -> None:
    store = MemoryStore()
    finished: dict[str, str] = {}
    callbacks = OrchestratorCallbacks(
        on_run_completed=lambda run_id: finished.__setitem__(run_id, "completed"),
        on_run_failed=lambda run_id: finished.__setitem__(run_id, "failed"),
        on_run_crashed=lambda run_id: finished.__setitem__(run_id, "crashed"),
        on_run_cancelled=lambda run_id: finished.__setitem__(run_id, "cancelled"),
    )
    store.create_run("run-1", nodes, run_input={"titles": ["alpha", "beta", "gamma"]})
    start_run(store, "run-1", callbacks=callbacks)

    executed = 0
    while deliveries := store.list_deliveries("run-1"):
        for delivery in deliveries:
            store.ack_delivery(delivery.delivery_id)
            claimed = claim_task(
                store,
                delivery.task_id,
                expected_attempt_id=delivery.attempt_id,
                expected_generation=delivery.generation,
            )
            if claimed is None:
                continue
            record = store.get_task(claimed.task_id)
            assert record is not None
            plugin = PLUGINS[nodes[claimed.node_index].plugin]
            inputs = resolve_task_inputs(store, run_id="run-1", plan=record.plan)
            try:
                outputs = plugin(claimed.task_id, inputs)
            except Exception as exc:  # a plugin error fails the task, never the loop
                on_task_failed(
                    store,
                    task_id=claimed.task_id,
                    expected_attempt_id=claimed.attempt_id,
                    error_message=f"{type(exc).__name__}: {exc}",
                    callbacks=callbacks,
                )
            else:
                on_task_complete(
                    store,
                    task_id=claimed.task_id,
                    expected_attempt_id=claimed.attempt_id,
                    outputs=outputs,
                    callbacks=callbacks,
                )
            executed += 1

    run = store.get_run("run-1")
    assert run is not None
    page_ids = store.get_output_ids("run-1", 3)
    page = store.resolve_outputs("run-1", page_ids)
    print(f"run-1: {run.status.value} after {executed} tasks")
    for output_id in page_ids:
        print(f"  publish -> {page[output_id].fields['text']}")
    if run.status is not RunStatus.COMPLETED:
        raise SystemExit(f"run ended {run.status.value}: {run.error}")


if __name__ == "__main__":
    main()
