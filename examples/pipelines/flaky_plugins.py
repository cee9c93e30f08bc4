"""Plugins of examples/pipelines/flaky.yaml: automatic retries and a manual retry.

``fetch_page`` fails twice with a ``ConnectionError`` before it succeeds; its
retry policy allows three attempts with a short exponential backoff, so the
run completes on its own. ``store_page`` fails without retry while the
environment variable ``FLAKY_STORE_DOWN`` is set: run the pipeline with it,
then ``dagwerk retry RUN`` and serve the run with a worker that does not set
it.
"""

from __future__ import annotations

import os
from typing import Any

import dagwerk
from dagwerk import NonRetryableError, RetryPolicy, TaskContext, TaskInputs


@dagwerk.plugin(
    "fetch_page",
    retry=RetryPolicy(
        max_attempts=3, backoff_base=0.05, backoff_max=0.2, retry_on=(ConnectionError,)
    ),
)
def fetch_page(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    if ctx.attempt < 3:
        raise ConnectionError(
            f"{inputs.parameters['url']}: connection reset (attempt {ctx.attempt})"
        )
    return {"url": inputs.parameters["url"], "bytes": 2048, "attempts": ctx.attempt}


@dagwerk.plugin("store_page")
def store_page(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    if os.environ.get("FLAKY_STORE_DOWN"):
        raise NonRetryableError("page store is down (FLAKY_STORE_DOWN is set)")
    (page,) = inputs.edges["pages"]
    return {"stored": page.fields["url"]}
