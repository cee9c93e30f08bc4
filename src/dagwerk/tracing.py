"""OpenTelemetry traces of runs and attempts (the ``otel`` extra).

A process traces when it has imported OpenTelemetry and set an SDK tracer
provider (``opentelemetry.trace.set_tracer_provider``, or
``opentelemetry-instrument`` from the standard ``OTEL_*`` variables)
before it submits runs or creates workers. Otherwise nothing here imports
OpenTelemetry and tracing costs one dictionary look-up per worker.

The spans, all in the trace of the code that submitted the run:

- ``dagwerk.submit``: the submit, a child of the submitter's current span;
  its context (a W3C ``traceparent``) is stored with the run;
- ``dagwerk.run``: from the run's creation to its terminal state, emitted by
  the worker that settles it (or by ``Engine.cancel`` that cancels it), a
  child of ``dagwerk.submit``;
- ``dagwerk.attempt``: one task attempt, from the time its delivery became
  available in the queue to the end of its settlement in a worker, a child
  of ``dagwerk.submit``, with the child spans ``dagwerk.wait`` (the queue
  wait: available to claimed), ``dagwerk.prepare`` (claimed to plugin
  start: the attempt's inputs and the worker's own queue),
  ``dagwerk.execute`` (the plugin) and ``dagwerk.settle`` (the settlement);
- ``dagwerk.store.batch``: one store transaction that completes a batch of
  attempts, a child of the first attempt's ``dagwerk.submit``.

Attributes: ``dagwerk.run_id``, ``dagwerk.node``, ``dagwerk.task_id``,
``dagwerk.attempt``, ``dagwerk.outcome`` and ``dagwerk.error`` (with an
error status).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dagwerk.reconcile import OrchestratorCallbacks
from dagwerk.store import RunRecord
from dagwerk.store_logs import RunTraceStore

__all__ = [
    "WorkerTracing",
    "now_ns",
    "record_run_end",
    "record_submit",
    "traced_callbacks",
    "tracing_active",
]

_TRACER_NAME = "dagwerk"
_LOG = logging.getLogger("dagwerk.tracing")


def _trace_module() -> Any | None:
    """``opentelemetry.trace`` if this process imported it and set an SDK
    provider; ``None`` otherwise (and nothing is imported)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return trace


def tracing_active() -> bool:
    """Whether this process traces (see the module)."""
    return _trace_module() is not None


def now_ns() -> int:
    """Epoch time in nanoseconds, as spans take it."""
    return time.time_ns()


def _parent(trace: Any, traceparent: str | None) -> Any | None:
    if traceparent is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def record_submit(store: RunTraceStore | None, run_id: str, started_ns: int) -> None:
    """Emit the ``dagwerk.submit`` span of a run just stored and store its
    trace context with the run (when this process traces and the store can
    keep it)."""
    trace = _trace_module()
    if trace is None or store is None:
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    tracer = trace.get_tracer(_TRACER_NAME)
    span = tracer.start_span(
        "dagwerk.submit", start_time=started_ns, attributes={"dagwerk.run_id": run_id}
    )
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    try:
        traceparent = carrier.get("traceparent")
        if traceparent is not None:
            store.set_run_traceparent(run_id, traceparent)
    except Exception:
        # The run is stored and is started next: without its trace context
        # its workers' spans start traces of their own.
        _LOG.exception("storing the trace context of run %s failed", run_id)
    finally:
        span.end()


@dataclass(slots=True)
class _Open:
    run_id: str
    task_id: str
    attempt: int
    node: str
    offered_ns: int
    claimed_ns: int
    started_ns: int
    settling_ns: int = 0
    outcome: str = ""
    error: str | None = None


class _RunReader(Protocol):
    def get_run(self, run_id: str) -> RunRecord | None: ...


class WorkerTracing:
    """A worker's spans (see the module); made by :meth:`create` only when
    the process traces, so a worker without tracing holds ``None``."""

    def __init__(self, trace: Any, traces: RunTraceStore | None, runs: _RunReader | None) -> None:
        self._trace = trace
        self._tracer = trace.get_tracer(_TRACER_NAME)
        self._traces = traces
        self._runs = runs
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}
        self._parents: dict[str, Any] = {}
        self._ended_runs: list[tuple[str, str, int]] = []

    @classmethod
    def create(cls, traces: RunTraceStore | None, runs: _RunReader | None) -> WorkerTracing | None:
        trace = _trace_module()
        return None if trace is None else cls(trace, traces, runs)

    def _context(self, run_id: str) -> Any | None:
        """The run's stored trace context (read once per run, kept for the
        most recent runs)."""
        with self._lock:
            if run_id in self._parents:
                return self._parents[run_id]
        stored = None if self._traces is None else self._traces.get_run_traceparent(run_id)
        context = _parent(self._trace, stored)
        with self._lock:
            if len(self._parents) >= 1024:
                self._parents.pop(next(iter(self._parents)))
            self._parents[run_id] = context
        return context

    # --- attempts ----------------------------------------------------------------------

    def started(
        self,
        key: str,
        *,
        run_id: str,
        task_id: str,
        attempt: int,
        node: str,
        offered_at: float | None,
        claimed_at: float | None,
    ) -> None:
        """The attempt ``key``'s plugin starts now; ``offered_at`` is the
        epoch time its delivery became available, ``claimed_at`` its claim's
        (``None``: unknown, taken as the next known time)."""
        now = now_ns()
        claimed = now if claimed_at is None else min(now, int(claimed_at * 1e9))
        offered = claimed if offered_at is None else min(claimed, int(offered_at * 1e9))
        with self._lock:
            self._open[key] = _Open(run_id, task_id, attempt, node, offered, claimed, now)

    def settling(self, key: str, outcome: str, error: BaseException | None) -> None:
        """The attempt's plugin is over with ``outcome``; its settlement starts now."""
        with self._lock:
            entry = self._open.get(key)
            if entry is None or entry.settling_ns:
                return
            entry.settling_ns = now_ns()
            entry.outcome = outcome
            entry.error = None if error is None else f"{type(error).__name__}: {error}"

    def settled(self, key: str) -> None:
        """The attempt is settled: emit its spans (and those of runs that ended)."""
        with self._lock:
            entry = self._open.pop(key, None)
        # Tracing never fails an attempt: a span that cannot be made is lost.
        try:
            if entry is not None:
                self._emit_attempt(entry, now_ns())
            self._emit_runs()
        except Exception:
            _LOG.exception("emitting the spans of attempt %s failed", key)

    def _emit_attempt(self, entry: _Open, end_ns: int) -> None:
        trace = self._trace
        settling = entry.settling_ns or end_ns
        attributes: dict[str, Any] = {
            "dagwerk.run_id": entry.run_id,
            "dagwerk.node": entry.node,
            "dagwerk.task_id": entry.task_id,
            "dagwerk.attempt": entry.attempt,
            "dagwerk.outcome": entry.outcome,
        }
        if entry.error is not None:
            attributes["dagwerk.error"] = entry.error
        span = self._tracer.start_span(
            "dagwerk.attempt",
            context=self._context(entry.run_id),
            start_time=entry.offered_ns,
            attributes=attributes,
        )
        inner = trace.set_span_in_context(span)
        for name, start, end in (
            ("dagwerk.wait", entry.offered_ns, entry.claimed_ns),
            ("dagwerk.prepare", entry.claimed_ns, entry.started_ns),
            ("dagwerk.execute", entry.started_ns, settling),
            ("dagwerk.settle", settling, end_ns),
        ):
            child = self._tracer.start_span(name, context=inner, start_time=start)
            child.end(end_time=max(start, end))
        if entry.error is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, entry.error))
        span.end(end_time=end_ns)

    def store_batch(self, run_ids: Sequence[str], operation: str, started_ns: int) -> None:
        """One store transaction for ``run_ids``' attempts ran from ``started_ns`` to now."""
        if not run_ids:
            return
        try:
            context = self._context(run_ids[0])
        except Exception:
            _LOG.exception("reading the trace context of run %s failed", run_ids[0])
            return
        span = self._tracer.start_span(
            "dagwerk.store.batch",
            context=context,
            start_time=started_ns,
            attributes={
                "dagwerk.operation": operation,
                "dagwerk.batch_size": len(run_ids),
                "dagwerk.run_ids": sorted(set(run_ids)),
            },
        )
        span.end()

    # --- runs ----------------------------------------------------------------------------

    def run_ended(self, status: str, run_id: str) -> None:
        """A run became terminal in this worker (its span is emitted after
        the settlement that ended it, outside any transaction)."""
        with self._lock:
            self._ended_runs.append((run_id, status, now_ns()))

    def _emit_runs(self) -> None:
        with self._lock:
            if not self._ended_runs:
                return
            ended, self._ended_runs = self._ended_runs, []
        for run_id, status, end_ns in ended:
            record = None if self._runs is None else self._runs.get_run(run_id)
            _emit_run(
                self._trace, self._context(run_id), record, run_id, status=status, end_ns=end_ns
            )


def _emit_run(
    trace: Any,
    context: Any | None,
    record: RunRecord | None,
    run_id: str,
    *,
    status: str,
    end_ns: int,
) -> None:
    """The ``dagwerk.run`` span of a run that became ``status`` at ``end_ns``."""
    created = (record.created_at if record is not None else 0.0) or end_ns / 1e9
    attributes: dict[str, Any] = {"dagwerk.run_id": run_id, "dagwerk.outcome": status}
    error = None if record is None else record.error
    if error:
        attributes["dagwerk.error"] = error
    span = trace.get_tracer(_TRACER_NAME).start_span(
        "dagwerk.run",
        context=context,
        start_time=min(end_ns, int(created * 1e9)),
        attributes=attributes,
    )
    if error:
        span.set_status(trace.Status(trace.StatusCode.ERROR, error))
    span.end(end_time=end_ns)


def record_run_end(
    traces: RunTraceStore | None, runs: _RunReader, run_id: str, status: str
) -> None:
    """Emit the ``dagwerk.run`` span of a run that this process just made
    terminal outside any worker (``Engine.cancel``), when the process traces.
    Tracing never fails the caller: a span that cannot be made is lost."""
    trace = _trace_module()
    if trace is None:
        return
    end_ns = now_ns()
    try:
        stored = None if traces is None else traces.get_run_traceparent(run_id)
        record = runs.get_run(run_id)
        _emit_run(trace, _parent(trace, stored), record, run_id, status=status, end_ns=end_ns)
    except Exception:
        _LOG.exception("emitting the span of run %s failed", run_id)


def traced_callbacks(
    callbacks: OrchestratorCallbacks, tracing: WorkerTracing
) -> OrchestratorCallbacks:
    """``callbacks``, each also telling ``tracing`` that its run ended."""

    def wrap(status: str, inner: Any) -> Any:
        def fire(run_id: str) -> None:
            try:
                inner(run_id)
            finally:
                tracing.run_ended(status, run_id)

        return fire

    return OrchestratorCallbacks(
        wrap("completed", callbacks.on_run_completed),
        wrap("failed", callbacks.on_run_failed),
        wrap("crashed", callbacks.on_run_crashed),
        wrap("cancelled", callbacks.on_run_cancelled),
    )
