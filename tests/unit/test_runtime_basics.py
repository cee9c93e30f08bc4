"""Clock, plugin registry and output conventions, retry policy, task context."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dagwerk
from dagwerk.engine import Engine
from dagwerk.engine import _plugins as engine_plugins
from dagwerk.errors import DagwerkError
from dagwerk.models import EmittedOutput, TaskInputs
from dagwerk.runtime.clock import FakeClock, SystemClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.errors import (
    NonRetryableError,
    PluginOutputError,
    TaskCancelled,
    UnknownPluginError,
    WaitRequested,
)
from dagwerk.runtime.plugins import PluginRegistry, normalize_outputs
from dagwerk.runtime.retry_policy import RetryPolicy, RetryPolicyError
from dagwerk.store import InvalidStoreValueError

# --- clock -------------------------------------------------------------------


def test_fake_clock_advance_wakes_a_waiter_past_its_deadline() -> None:
    clock = FakeClock(start=100.0)
    event = threading.Event()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(clock.wait(event, 5.0)))
    waiter.start()
    assert clock.wait_for_waiters(1)
    clock.advance(4.0)
    assert waiter.is_alive() or result == []  # 4 s is short of the 5 s deadline
    clock.advance(1.0)
    waiter.join(5)
    assert result == [False]
    assert clock.time() == clock.monotonic() == 105.0


def test_fake_clock_wait_returns_when_the_event_is_set() -> None:
    clock = FakeClock()
    event = threading.Event()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(clock.wait(event, None)))
    waiter.start()
    assert clock.wait_for_waiters(1)
    event.set()
    waiter.join(5)
    assert result == [True]


def test_fake_clock_rejects_going_backwards_and_zero_timeout_only_checks() -> None:
    clock = FakeClock()
    with pytest.raises(ValueError):
        clock.advance(-1)
    assert clock.wait(threading.Event(), 0) is False
    assert SystemClock().wait(threading.Event(), 0) is False
    assert SystemClock().monotonic() > 0


# --- plugins -----------------------------------------------------------------


def test_output_conventions_none_dict_list_and_emitted() -> None:
    assert normalize_outputs(None, "t") == ()
    (one,) = normalize_outputs({"a": 1}, "t")
    assert one.id == "t/0" and dict(one.fields) == {"a": 1}
    many = normalize_outputs([{"a": 1}, EmittedOutput(id="x", fields={}), {"b": 2}], "t")
    assert [o.id for o in many] == ["t/0", "x", "t/2"]
    (explicit,) = normalize_outputs(EmittedOutput(id="e", fields={"k": "v"}), "t")
    assert explicit.id == "e"


def test_default_output_ids_are_stable_across_attempts() -> None:
    first = normalize_outputs([{"a": 1}, {"a": 2}], "task-7")
    second = normalize_outputs([{"a": 1}, {"a": 2}], "task-7")
    assert [o.id for o in first] == [o.id for o in second] == ["task-7/0", "task-7/1"]


@pytest.mark.parametrize("bad", [42, "text", {1, 2}, [1], [{"a": 1}, object()]])
def test_plugin_output_invalid_is_a_typed_error(bad: object) -> None:
    with pytest.raises(PluginOutputError) as info:
        normalize_outputs(bad, "task-1")
    assert info.value.code == "plugin_output_invalid"
    assert "task-1" in str(info.value)


def test_non_json_dict_output_is_plugin_output_invalid() -> None:
    with pytest.raises(PluginOutputError):
        normalize_outputs({"a": float("nan")}, "t")


def test_registry_registers_looks_up_and_rejects_unknown() -> None:
    registry = PluginRegistry({"a": lambda inputs, ctx: None})
    policy = RetryPolicy(max_attempts=3)

    @registry.plugin("b", retry=policy, timeout_seconds=2.0)
    def b(inputs: TaskInputs, ctx: TaskContext) -> None:
        return None

    assert "a" in registry and len(registry) == 2 and sorted(registry) == ["a", "b"]
    assert registry.get("b").retry is policy and registry.get("b").timeout_seconds == 2.0
    assert registry.get("a").retry == RetryPolicy()
    with pytest.raises(UnknownPluginError) as info:
        registry.get("missing")
    assert info.value.code == "plugin_unknown"
    with pytest.raises(DagwerkError):
        registry.register("c", lambda i, c: None, timeout_seconds=0)


def test_the_plugins_a_worker_serves_follow_every_registration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker asks for its served plugins at every claim; a plugin
    # registered later (on the engine, or with dagwerk.plugin in the default
    # registry) is served from then on.
    monkeypatch.setattr(engine_plugins, "DEFAULT_REGISTRY", PluginRegistry())
    with Engine("memory://", execution_root=tmp_path) as engine:
        worker = engine.worker()
        assert worker.served_plugins() == frozenset()
        engine.plugin("later")(lambda inputs, ctx: None)
        assert worker.served_plugins() == {"later"}
        dagwerk.plugin("from_default")(lambda inputs, ctx: None)
        assert worker.served_plugins() == {"later", "from_default"}
        engine.plugin("last")(lambda inputs, ctx: None)
        assert worker.served_plugins() == {"later", "from_default", "last"}


# --- retry policy ------------------------------------------------------------


def test_retry_policy_defaults_to_one_attempt_without_retry() -> None:
    assert RetryPolicy().should_retry(RuntimeError("x"), 1) is False


def test_retry_policy_respects_attempts_types_and_non_retryable() -> None:
    policy = RetryPolicy(max_attempts=3, retry_on=(OSError,), give_up_on=(FileNotFoundError,))
    assert policy.should_retry(OSError("x"), 1)
    assert policy.should_retry(OSError("x"), 2)
    assert not policy.should_retry(OSError("x"), 3)
    assert not policy.should_retry(ValueError("x"), 1)
    assert not policy.should_retry(FileNotFoundError("x"), 1)
    assert not RetryPolicy(max_attempts=5).should_retry(NonRetryableError("stop"), 1)


def test_retry_policy_validates_settings() -> None:
    for kwargs in ({"max_attempts": 0}, {"backoff_base": -1}, {"backoff_max": 0.5}):
        with pytest.raises(RetryPolicyError):
            RetryPolicy(**kwargs)
    with pytest.raises(RetryPolicyError):
        RetryPolicy().next_delay(0)


def test_backoff_without_jitter_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_base=0.5, backoff_max=3.0, jitter=False)
    assert [policy.next_delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert policy.next_delay(10_000) == 3.0


@settings(max_examples=150, deadline=None)
@given(
    attempt=st.integers(min_value=1, max_value=2000),
    base=st.floats(min_value=0, max_value=10),
    seed=st.integers(),
)
def test_full_jitter_stays_within_zero_and_the_exponential_ceiling(
    attempt: int, base: float, seed: int
) -> None:
    policy = RetryPolicy(max_attempts=5, backoff_base=base, backoff_max=base * 8 + 1)
    ceiling = min(policy.backoff_max, base * 2.0 ** min(attempt - 1, 64))
    delay = policy.next_delay(attempt, random.Random(seed))
    assert 0.0 <= delay <= ceiling
    assert delay == policy.next_delay(attempt, random.Random(seed))


# --- context -----------------------------------------------------------------


def _ctx(**overrides: object) -> TaskContext:
    values: dict[str, object] = {
        "run_id": "r",
        "task_id": "t",
        "node_index": 0,
        "generation": 0,
        "attempt_id": "a",
        "attempt": 1,
        "plugin": "p",
        "execution_root": Path("/tmp"),
        "cancelled": threading.Event(),
    }
    values.update(overrides)
    return TaskContext(**values)  # type: ignore[arg-type]


def test_context_check_cancelled_raises_once_the_signal_fires() -> None:
    ctx = _ctx()
    ctx.check_cancelled()
    ctx.cancelled.set()
    with pytest.raises(TaskCancelled):
        ctx.check_cancelled()


def test_context_wait_raises_the_control_signal_and_validates_the_id() -> None:
    ctx = _ctx()
    with pytest.raises(WaitRequested) as info:
        ctx.wait("approval-1")
    assert info.value.wait_id == "approval-1"
    assert not isinstance(info.value, Exception)  # `except Exception` cannot swallow it
    with pytest.raises(InvalidStoreValueError):
        ctx.wait("")


def test_context_heartbeat_calls_the_worker_hook() -> None:
    beats: list[int] = []
    _ctx(heartbeat_fn=lambda: beats.append(1)).heartbeat()
    assert beats == [1]
