"""Plugins for the task log tests (importable by plugin processes)."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from pathlib import Path

from dagwerk.models import TaskInputs
from dagwerk.runtime.context import TaskContext


def chatty(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    """Logs to ctx.logger and another stdlib logger, with the secret and a traceback."""
    ctx.logger.info("hello from attempt %d with %s", ctx.attempt, ctx.secrets.get("token", "-"))
    logging.getLogger("thirdparty.lib").warning("a library speaks")
    try:
        raise ValueError("bad value " + ctx.secrets.get("token", "-"))
    except ValueError:
        ctx.logger.exception("caught it")
    return {}


def printer(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    """Prints to stdout and stderr, and logs."""
    print("to stdout")
    print("to stderr", file=sys.stderr)
    sys.stdout.write("no newline at the end")
    ctx.logger.warning("a record")
    return {}


def silent(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    return {}


def many(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    for index in range(int(str(inputs.parameters.get("lines", 50)))):
        ctx.logger.warning("line %d", index)
    return {}


def failing(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    ctx.logger.info("about to fail (attempt %d)", ctx.attempt)
    raise RuntimeError("it broke")


def flaky(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    ctx.logger.info("attempt %d starts", ctx.attempt)
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return {}


async def async_chatty(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    async def helper() -> None:
        logging.getLogger("thirdparty.async").warning("from a task the plugin started")

    await asyncio.create_task(helper())
    ctx.logger.info("async plugin done")
    return {}


def slow(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    """Logs, then waits for a file in the execution root before it returns."""
    ctx.logger.warning("started, waiting")
    release = Path(ctx.execution_root) / "release"
    while not release.exists():
        if ctx.cancelled.wait(0.02):
            break
    ctx.logger.warning("released")
    return {}


def other_thread_logs(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    """Logs from a thread it starts itself (not the plugin's thread)."""
    thread = threading.Thread(target=lambda: logging.getLogger("bg").warning("not mine"))
    thread.start()
    thread.join()
    ctx.logger.warning("mine")
    return {}


def informs(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    """Logs to ctx.logger at INFO (with a traceback and a stack) and WARNING."""
    ctx.logger.info("an info line with %s", ctx.secrets.get("token", "-"))
    try:
        raise KeyError("kept")
    except KeyError:
        ctx.logger.info("an info line with its exception", exc_info=True)
    ctx.logger.info("an info line with its stack", stack_info=True)
    ctx.logger.debug("a debug line")
    ctx.logger.warning("a warning line")
    assert ctx.logger.isEnabledFor(logging.INFO)
    return {}


def _deep_raise(token: str) -> None:
    found: dict[str, str] = {}
    try:
        found["missing"]
    except KeyError as exc:
        raise ValueError(f"bad value {token}") from exc


def raises_chained(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    """Raises a ValueError (holding the secret) caused by a KeyError."""
    _deep_raise(ctx.secrets.get("token", "-"))
    return {}


def raises_huge(inputs: TaskInputs, ctx: TaskContext) -> dict[str, object]:
    """Raises an exception whose message alone is far over the traceback bound."""
    raise RuntimeError("x" * 200_000 + " the end")
