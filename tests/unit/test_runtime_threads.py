"""The worker's reusable attempt threads keep the semantics of a new
daemon thread per job: started on return, never blocked by a hung job, an
empty context per job, the job's name while it runs."""

from __future__ import annotations

import contextvars
import threading

from dagwerk.runtime._threads import spawn

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("_VAR")


def test_spawn_returns_after_the_job_started_and_join_waits_for_it() -> None:
    started = threading.Event()
    release = threading.Event()

    def job() -> None:
        started.set()
        release.wait(10)

    handle = spawn(job, name="dagwerk-test-started")
    assert started.is_set()  # no wait needed: spawn returned after the start
    assert handle.is_alive() and not handle.join(0.01)
    release.set()
    assert handle.join(10) and not handle.is_alive()


def test_a_hung_job_never_blocks_the_next_one_and_finished_threads_are_reused() -> None:
    hang = threading.Event()
    hung = spawn(lambda: hang.wait(10), name="dagwerk-test-hung")
    seen: list[tuple[int, str, bool]] = []

    def record() -> None:
        thread = threading.current_thread()
        seen.append((threading.get_ident(), thread.name, thread.daemon))

    assert spawn(record, name="dagwerk-test-a").join(10)
    assert spawn(record, name="dagwerk-test-b").join(10)
    assert hung.is_alive()
    (first, name_a, daemon_a), (second, name_b, daemon_b) = seen
    assert (name_a, name_b) == ("dagwerk-test-a", "dagwerk-test-b")
    assert daemon_a and daemon_b
    assert first == second  # the second job ran on the first job's idle thread
    hang.set()
    assert hung.join(10)


def test_each_job_runs_in_an_empty_context() -> None:
    values: list[str] = []

    def setter() -> None:
        _VAR.set("leaked")

    def reader() -> None:
        values.append(_VAR.get("unset"))

    assert spawn(setter, name="dagwerk-test-set").join(10)
    assert spawn(reader, name="dagwerk-test-read").join(10)
    assert values == ["unset"]
