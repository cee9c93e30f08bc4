"""Per-attempt Events are made only when a thread waits on them,
and a lazily made Event never misses what happened before it existed."""

from __future__ import annotations

import threading

from dagwerk.runtime.attempts import Running
from dagwerk.runtime.executors import AttemptSignal


def test_done_made_after_finish_is_already_set() -> None:
    entry = Running(AttemptSignal())
    assert not entry.finished
    entry.finish()
    assert entry.finished
    assert entry.done.is_set()


def test_finish_sets_a_done_made_before() -> None:
    entry = Running(AttemptSignal())
    done = entry.done
    assert not done.is_set()
    entry.finish()
    assert done.is_set()
    assert entry.done is done


def test_a_waiter_on_done_is_woken_by_finish() -> None:
    entry = Running(AttemptSignal())
    woke = threading.Event()

    def wait() -> None:
        if entry.done.wait(10):
            woke.set()

    thread = threading.Thread(target=wait)
    thread.start()
    entry.finish()
    thread.join(10)
    assert woke.is_set()


def test_wake_made_after_fire_is_already_set() -> None:
    signal = AttemptSignal()
    signal.fire("stop")
    assert signal.abort.is_set()
    assert signal.wake.is_set()


def test_fire_sets_a_wake_made_before() -> None:
    signal = AttemptSignal()
    wake = signal.wake
    assert not wake.is_set()
    signal.fire("stop")
    assert wake.is_set()
    assert signal.reason == "stop"


def _first_use(signal: AttemptSignal, seen: list[threading.Event]) -> threading.Thread:
    reader = threading.Thread(target=lambda: seen.append(signal.wake))
    reader.start()
    return reader


def test_racing_fire_and_first_use_never_lose_the_wake() -> None:
    for _ in range(200):
        signal = AttemptSignal()
        seen: list[threading.Event] = []
        reader = _first_use(signal, seen)
        signal.fire("stop")
        reader.join(10)
        assert seen[0].is_set()
