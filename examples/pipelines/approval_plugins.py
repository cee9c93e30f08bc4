"""Plugins of examples/pipelines/approval.yaml: a task that waits for a person.

``request_approval`` parks its task in WAITING with ``ctx.wait(...)``; the
task holds no worker while it waits. ``dagwerk resume TASK WAIT_ID
--response '{"approved": true}'`` queues a new attempt, which sees
``ctx.resumed_from_wait_id`` and the stored response.
"""

from __future__ import annotations

from typing import Any

import dagwerk
from dagwerk import TaskContext, TaskInputs

WAIT_PREFIX = "approval"


@dagwerk.plugin("draft_post")
def draft_post(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    topic = str(inputs.parameters["topic"])
    return {"title": f"Announcing {topic}", "words": 120}


@dagwerk.plugin("request_approval")
def request_approval(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    if ctx.resumed_from_wait_id is None:
        ctx.logger.info(
            "asking %s to review %r", inputs.parameters["reviewer"], inputs.parameters["title"]
        )
        ctx.wait(WAIT_PREFIX)  # raises: the worker commits the wait
    # The response `dagwerk resume ... --response JSON` stored with the wait.
    response = ctx.wait_response
    approved = isinstance(response, dict) and response.get("approved") is True
    return {
        "title": inputs.parameters["title"],
        "reviewer": inputs.parameters["reviewer"],
        "approved": approved,
    }


@dagwerk.plugin("publish_post")
def publish_post(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    return {"published": inputs.parameters["title"]}
