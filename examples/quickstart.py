"""Run the seed's example pipeline end to end with the Engine API.

load ──records──▶ transform (EACH) ──results──▶ publish (ALL) ◀──settings── settings

``engine.run`` stores the run in a SQLite file, works it with two worker
threads in this process and returns the result. The database lives in a
temporary directory, so every run of this script starts afresh; point
``Engine`` at ``sqlite:///dagwerk.db`` to keep runs for ``dagwerk show``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from dagwerk import (
    DagNode,
    EdgeSource,
    EmittedOutput,
    Engine,
    InputEdge,
    InputMode,
    RunStatus,
    TaskContext,
    TaskInputs,
)
from dagwerk.constants import InputRole

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


def register_plugins(engine: Engine) -> None:
    """A plugin takes the task's inputs and context and returns its outputs."""

    @engine.plugin("load")
    def load(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, str]]:
        # A root node sees the run input as its parameters.
        return [{"title": str(title)} for title in inputs.parameters.get("titles", ())]

    @engine.plugin("load_settings")
    def load_settings(inputs: TaskInputs, ctx: TaskContext) -> dict[str, str]:
        return {"separator": " | "}

    @engine.plugin("transform")
    def transform(inputs: TaskInputs, ctx: TaskContext) -> EmittedOutput:
        title = str(inputs.parameters["title"])
        # ``fields`` route to downstream nodes; ``data`` is carried along unrouted.
        return EmittedOutput(
            id=f"{ctx.task_id}/upper", fields={"title": title.upper()}, data={"source": title}
        )

    @engine.plugin("publish")
    def publish(inputs: TaskInputs, ctx: TaskContext) -> dict[str, str]:
        titles = sorted(str(out.fields["title"]) for out in inputs.edges["results"])
        settings = inputs.edges["settings"]
        separator = str(settings[0].fields["separator"]) if settings else ", "
        return {"text": separator.join(titles)}


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        database = Path(directory) / "quickstart.db"
        with Engine(f"sqlite:///{database}") as engine:
            register_plugins(engine)
            result = engine.run(
                nodes,
                input={"titles": ["alpha", "beta", "gamma"]},
                run_id="run-1",
                workers=2,
                timeout=60,
            )
            executed = len(engine.list_tasks(result.run_id))
    print(f"{result.run_id}: {result.status.value} after {executed} tasks")
    for page in result.outputs["publish"]:
        print(f"  publish -> {page.fields['text']}")
    if result.status is not RunStatus.COMPLETED:
        raise SystemExit(f"run ended {result.status.value}: {result.error}")


if __name__ == "__main__":
    main()
