"""The worker runtime: plugins, executors, the advancement actor and the worker.

This layer does I/O and uses threads and processes; the core it drives
(``dagwerk.orchestrator``, ``execution``, ``waiting``, ``retry``) does not.
"""

from __future__ import annotations

from dagwerk.runtime.actor import ActorState, AdvancementActor
from dagwerk.runtime.clock import Clock, FakeClock, SystemClock
from dagwerk.runtime.context import TaskContext
from dagwerk.runtime.errors import (
    AdvancementWaitError,
    ExecutionRootError,
    NonRetryableError,
    PluginOutputError,
    RunAdvancementStoppedError,
    TaskCancelled,
    TaskTimedOut,
    UnknownPluginError,
    WaitRequested,
    WorkerStoppedError,
)
from dagwerk.runtime.executors import AsyncExecutor, ProcessExecutor, ThreadExecutor
from dagwerk.runtime.plugins import PluginRegistry, PluginSpec, normalize_outputs
from dagwerk.runtime.retry_policy import RetryPolicy
from dagwerk.runtime.settings import WorkerSettings
from dagwerk.runtime.worker import DeliveryReport, Worker

__all__ = [
    "ActorState",
    "AdvancementActor",
    "AdvancementWaitError",
    "AsyncExecutor",
    "Clock",
    "DeliveryReport",
    "ExecutionRootError",
    "FakeClock",
    "NonRetryableError",
    "PluginOutputError",
    "PluginRegistry",
    "PluginSpec",
    "ProcessExecutor",
    "RetryPolicy",
    "RunAdvancementStoppedError",
    "SystemClock",
    "TaskCancelled",
    "TaskContext",
    "TaskTimedOut",
    "ThreadExecutor",
    "UnknownPluginError",
    "WaitRequested",
    "Worker",
    "WorkerSettings",
    "WorkerStoppedError",
    "normalize_outputs",
]
