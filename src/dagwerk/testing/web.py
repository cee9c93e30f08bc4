"""Building blocks for the dashboard's tests: a demo database with one run
in each interesting state, and a flag-controlled plugin set.

:func:`seed_demo` fills an engine's database with: a failed run (one task
of ``work`` fails while the ``fail_flag`` file exists), a run waiting on
``approval``, a completed run whose output holds a ``<script>`` tag, and a
dead letter. The plugins are registered on the engine given, so a worker of
that engine (or of another one set up the same way) can run them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dagwerk.constants import FailurePolicy, InputMode
from dagwerk.engine import Engine
from dagwerk.models import DagNode, InputEdge, TaskInputs
from dagwerk.runtime.context import TaskContext

__all__ = [
    "HOSTILE_TEXT",
    "Demo",
    "approval_nodes",
    "demo_nodes",
    "register_demo_plugins",
    "seed_demo",
]

HOSTILE_TEXT = "<script>window.__pwned = true</script>"


def demo_nodes() -> list[DagNode]:
    """``fan`` emits three items, ``work`` runs once per item, ``report``
    reads every result."""
    return [
        DagNode(slug="fan", plugin="demo_fan"),
        DagNode(
            slug="work",
            plugin="demo_work",
            input_mode=InputMode.EACH,
            edges=(InputEdge(name="items", source="fan"),),
            bindings={"n": {"source": "edge", "edge": "items", "field": "n"}},
        ),
        DagNode(
            slug="report",
            plugin="demo_report",
            input_mode=InputMode.ALL,
            edges=(InputEdge(name="done", source="work"),),
        ),
    ]


def approval_nodes() -> list[DagNode]:
    return [
        DagNode(slug="ask", plugin="demo_ask"),
        DagNode(
            slug="after",
            plugin="demo_report",
            input_mode=InputMode.ALL,
            edges=(InputEdge(name="answer", source="ask"),),
        ),
    ]


def register_demo_plugins(engine: Engine, fail_flag: Path) -> None:
    """The demo plugins on ``engine``: ``demo_work`` fails for item 1 while
    ``fail_flag`` exists."""

    @engine.plugin("demo_fan")
    def fan(inputs: TaskInputs, ctx: TaskContext) -> list[dict[str, object]]:
        return [{"n": n} for n in range(3)]

    @engine.plugin("demo_work")
    def work(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        if inputs.parameters.get("n") == 1 and fail_flag.exists():
            raise ValueError("item 1 failed <b>on purpose</b>")
        return {"n": inputs.parameters.get("n"), "note": HOSTILE_TEXT}

    @engine.plugin("demo_report")
    def report(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        return {"items": sum(len(v) for v in inputs.edges.values()), "html": HOSTILE_TEXT}

    @engine.plugin("demo_ask")
    def ask(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
        if ctx.resumed_from_wait_id is None:
            ctx.wait("approval")
        return {"answer": ctx.wait_response}


@dataclass(frozen=True, slots=True)
class Demo:
    failed_run: str
    waiting_run: str
    completed_run: str
    letter_run: str
    dead_letter_id: str


def seed_demo(engine: Engine, fail_flag: Path) -> Demo:
    """Create the demo runs (see the module docstring) with a worker of
    ``engine`` run until idle; ``fail_flag`` is created."""
    register_demo_plugins(engine, fail_flag)
    fail_flag.unlink(missing_ok=True)
    completed = engine.submit(demo_nodes(), run_id="run-completed")
    worker = engine.worker(concurrency=1, backstop_interval=None)
    worker.run_until_idle()
    fail_flag.touch()
    failed = engine.submit(
        demo_nodes(), run_id="run-failed", failure_policy=FailurePolicy.FAIL_FAST
    )
    waiting = engine.submit(approval_nodes(), {"topic": HOSTILE_TEXT}, run_id="run-waiting")
    worker.run_until_idle()
    letter_run = engine.submit([DagNode(slug="lost", plugin="demo_fan")], run_id="run-lettered")
    store = engine.store
    (leased,) = store.dequeue("lost-worker", limit=1, lease_seconds=30, prefer_run=letter_run)
    store.nack(leased.delivery_id, "lost-worker", poison=True, reason="its worker gave up")
    (letter,) = engine.list_dead_letters(letter_run)
    return Demo(failed, waiting, completed, letter_run, letter.dead_letter_id)
