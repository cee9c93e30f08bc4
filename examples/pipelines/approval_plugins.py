"""Plugins of examples/pipelines/approval.yaml: a task that waits for a person.

``request_approval`` is straight-line code. On its first attempt
``ctx.wait(...)`` parks the task in WAITING (it holds no worker while it
waits). ``dagwerk resume TASK WAIT_ID --response '{"approved": true}'``
queues a new attempt, which runs the plugin from the top: ``ctx.step``
returns the recorded result without asking the reviewer again, and
``ctx.wait`` returns the stored response.
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
    reviewer, title = str(inputs.parameters["reviewer"]), str(inputs.parameters["title"])

    # Runs once per task: a resumed (or retried) attempt gets the recorded result.
    @ctx.step("ask reviewer")
    def ask() -> str:
        ctx.logger.info("asking %s to review %r", reviewer, title)
        return reviewer

    asked = ask()
    # Parks the task on the first attempt; returns the response after the resume.
    response = ctx.wait(WAIT_PREFIX)
    approved = isinstance(response, dict) and response.get("approved") is True
    return {"title": title, "reviewer": asked, "approved": approved}


@dagwerk.plugin("publish_post")
def publish_post(inputs: TaskInputs, ctx: TaskContext) -> dict[str, Any]:
    return {"published": inputs.parameters["title"]}
