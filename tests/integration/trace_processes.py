"""A submitter or a worker process with an OpenTelemetry SDK, for the tracing
tests: ``python trace_processes.py submit DB SPANS`` submits a run of
``NODES`` independent nodes inside an application span and prints its run
ID; ``python trace_processes.py work DB SPANS RUN_ID`` serves the queue until
the run is terminal. Each writes the spans it finished, from the SDK's
in-memory exporter, to SPANS as JSON lines."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

NODES = 6


def traced_plugin(inputs: object, ctx: object) -> dict[str, object]:
    time.sleep(0.2)  # long enough that both workers get some of the run
    return {}


def _provider() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def _span_json(span: ReadableSpan) -> dict[str, object]:
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "attributes": dict(span.attributes or {}),
        "start": span.start_time,
        "end": span.end_time,
        "error": span.status.status_code.name == "ERROR",
    }


def _dump(exporter: InMemorySpanExporter, path: str) -> None:
    lines = [json.dumps(_span_json(span), default=list) for span in exporter.get_finished_spans()]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str]) -> None:
    mode, db, spans = argv[:3]
    exporter = _provider()
    from dagwerk.engine import Engine
    from dagwerk.models import DagNode

    with Engine(f"sqlite:///{db}", execution_root=Path(db).parent) as engine:
        engine.plugin("traced")(traced_plugin)
        if mode == "submit":
            tracer = trace.get_tracer("app")
            with tracer.start_as_current_span("app.request"):
                nodes = [DagNode(slug=f"n{i}", plugin="traced") for i in range(NODES)]
                print(engine.submit(nodes), flush=True)
        else:
            worker = engine.worker(concurrency=1)
            worker.start()
            try:
                engine.wait(argv[3], timeout=120)
            finally:
                worker.stop()
    _dump(exporter, spans)


if __name__ == "__main__":
    main(sys.argv[1:])
