"""The dashboard's JSON API and pages over a real SQLite database, through
Starlette's test client (the browser suite in tests/browser drives the same
app in Chromium): reads, actions, typed errors, escaping, secrets, CSRF,
read-only, the token and the action log."""

from __future__ import annotations

import logging
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from dagwerk.cli import cli as dagwerk_cli
from dagwerk.constants import RunStatus, TaskStatus
from dagwerk.engine import Engine
from dagwerk.models import DagNode
from dagwerk.pipeline_file import load_pipeline
from dagwerk.testing.web import HOSTILE_TEXT, Demo, demo_nodes, seed_demo
from dagwerk.web import ServedPipelines, WebSettings, create_app
from dagwerk.web.security import CSRF_COOKIE, SESSION_COOKIE

TOKEN = "a-test-token-of-some-length"
LOOPBACK = "http://127.0.0.1"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    with Engine(f"sqlite:///{tmp_path / 'web.db'}", backstop_interval=None) as opened:
        yield opened


@pytest.fixture
def demo(engine: Engine, tmp_path: Path) -> Demo:
    return seed_demo(engine, tmp_path / "fail")


def client(engine: Engine, **settings: Any) -> TestClient:
    base = settings.pop("base_url", LOOPBACK)
    return TestClient(create_app(engine, WebSettings(**settings)), base_url=base)


def csrf_of(web: TestClient) -> str:
    web.get("/")
    token = web.cookies.get(CSRF_COOKIE)
    assert token
    return token


# --- reads ---------------------------------------------------------------------


def test_runs_are_paged_by_keyset_newest_first_with_filters(engine: Engine, demo: Demo) -> None:
    web = client(engine)
    first = web.get("/api/runs", params={"limit": 2}).json()
    assert [r["run_id"] for r in first["runs"]] == ["run-lettered", "run-waiting"]
    rest = web.get("/api/runs", params={"limit": 10, "after": first["next"]}).json()
    assert [r["run_id"] for r in rest["runs"]] == ["run-failed", "run-completed"]
    assert rest["next"] is None
    failed = web.get("/api/runs", params={"status": "failed"}).json()["runs"]
    assert [r["run_id"] for r in failed] == ["run-failed"]
    assert (
        failed[0]["tasks"] == {"completed": 3, "failed": 1, "cancelled": 1}
        or failed[0]["tasks"].get("failed") == 1
    )
    assert failed[0]["nodes_total"] == 3 and failed[0]["error"]
    later = web.get("/api/runs", params={"since": time.time() + 60}).json()
    assert later["runs"] == []
    earlier = web.get("/api/runs", params={"until": "2000-01-01"}).json()
    assert earlier["runs"] == []
    html = web.get("/runs", params={"status": "failed"}).text
    assert "run-failed" in html and "run-completed" not in html


def test_the_run_answer_has_counts_per_node_input_error_waits_and_why(
    engine: Engine, demo: Demo
) -> None:
    web = client(engine)
    run = web.get(f"/api/runs/{demo.failed_run}").json()
    assert run["run"]["status"] == "failed"
    assert "item 1 failed" in run["run"]["error"]
    nodes = {n["slug"]: n for n in run["nodes"]}
    assert nodes["work"]["state"] == "failed" and nodes["work"]["tasks"]["failed"] == 1
    assert nodes["fan"]["state"] == "done" and nodes["fan"]["tasks"] == {"completed": 1}
    assert run["failed_nodes"] == ["work"]
    waiting = web.get(f"/api/runs/{demo.waiting_run}").json()
    (wait,) = waiting["waits"]
    assert wait["wait_id"] == "approval" and wait["node"] == "ask"
    assert waiting["input"] == {"topic": HOSTILE_TEXT}
    why = web.get(f"/api/runs/{demo.waiting_run}/why").json()
    assert {n["node"]: n["state"] for n in why["nodes"]} == {"ask": "waiting", "after": "pending"}
    tasks = web.get(f"/api/runs/{demo.failed_run}/tasks", params={"node": "work"}).json()
    assert len(tasks["tasks"]) == 3 and {t["node"] for t in tasks["tasks"]} == {"work"}
    failed = web.get(
        f"/api/runs/{demo.failed_run}/tasks", params={"status": "failed", "limit": 1}
    ).json()
    assert [t["status"] for t in failed["tasks"]] == ["failed"] and failed["next"]
    page = web.get(f"/runs/{demo.failed_run}").text
    assert 'class="node state-failed" data-node="work"' in page
    assert 'data-node="fan" data-state="done"' in page
    assert web.get(f"/runs/{demo.failed_run}", params={"node": "work"}).status_code == 200


def test_the_task_answer_has_plan_outputs_attempts_and_waits(engine: Engine, demo: Demo) -> None:
    web = client(engine)
    tasks = web.get(f"/api/runs/{demo.completed_run}/tasks", params={"node": "work"}).json()
    task_id = tasks["tasks"][0]["task_id"]
    detail = web.get(f"/api/tasks/{task_id}").json()
    (edge,) = detail["plan"]["edges"]
    assert edge["edge"] == "items" and edge["source"] == "fan" and edge["output_count"] == 1
    assert detail["plan"]["parameters"] == {"n": 0}
    (output,) = detail["outputs"]
    assert output["id"] == f"{task_id}/0" and output["fields"]["note"] == HOSTILE_TEXT
    (attempt,) = detail["attempts"]
    assert attempt["outcome"] == "completed" and attempt["worker_id"]
    assert attempt["started_at"] <= attempt["finished_at"]
    assert web.get(f"/api/tasks/{task_id}/attempts").json()["attempts"] == detail["attempts"]
    waiting = web.get(f"/api/runs/{demo.waiting_run}/tasks").json()["tasks"][0]
    waits = web.get(f"/api/tasks/{waiting['task_id']}/waits").json()["waits"]
    assert [(w["wait_id"], w["state"]) for w in waits] == [("approval", "active")]
    page = web.get(f"/tasks/{task_id}").text
    assert 'id="logs"' in page and "completed" in page
    assert web.get("/api/tasks/no-such-task").status_code == 404


def test_the_overview_counts_runs_dead_letters_and_workers(engine: Engine, demo: Demo) -> None:
    web = client(engine)
    overview = web.get("/api/overview").json()
    assert overview["runs_by_status"]["failed"] == 1
    assert overview["runs_by_status"]["completed"] == 1
    assert overview["runs_by_status"]["running"] == 2
    assert [r["run_id"] for r in overview["running"]] == ["run-lettered", "run-waiting"]
    assert overview["dead_letters"] == {"total": 1, "waiting": 1}
    assert overview["workers"] and overview["workers"][0]["worker_id"]
    assert "Overview" in web.get("/").text


# --- output is escaped; secrets never shown --------------------------------------------


def test_a_script_in_outputs_and_input_renders_as_text(engine: Engine, demo: Demo) -> None:
    web = client(engine)
    task_id = web.get(f"/api/runs/{demo.completed_run}/tasks", params={"node": "work"}).json()[
        "tasks"
    ][0]["task_id"]
    for url in (
        f"/tasks/{task_id}",
        f"/runs/{demo.completed_run}",
        f"/runs/{demo.waiting_run}",
    ):
        page = web.get(url).text
        assert HOSTILE_TEXT not in page
        assert "&lt;script&gt;window.__pwned = true&lt;/script&gt;" in page
    # The failed task's error holds <b>: shown as text too.
    failed = web.get(f"/runs/{demo.failed_run}").text
    assert "<b>on purpose</b>" not in failed and "&lt;b&gt;on purpose&lt;/b&gt;" in failed


def test_secret_values_and_names_never_appear(engine: Engine, tmp_path: Path) -> None:
    @engine.plugin("uses_secret")
    def uses_secret(inputs: Any, ctx: Any) -> dict[str, object]:
        return {"ok": True}

    node = DagNode(
        slug="s",
        plugin="uses_secret",
        bindings={"password": {"source": "secret", "name": "db-password-name"}},
    )
    run_id = engine.submit([node], run_id="run-secret")
    web = client(engine)
    (task,) = web.get(f"/api/runs/{run_id}/tasks").json()["tasks"]
    detail = web.get(f"/api/tasks/{task['task_id']}")
    assert detail.json()["plan"]["secret_targets"] == ["password"]
    for text in (
        detail.text,
        web.get(f"/tasks/{task['task_id']}").text,
        web.get(f"/api/runs/{run_id}").text,
        web.get(f"/runs/{run_id}").text,
    ):
        assert "db-password-name" not in text


# --- task logs ---------------------------------------------------------------------


def logged_task(engine: Engine) -> str:
    """A completed task that logged three lines (a <script> message and a traceback)."""

    @engine.plugin("talks")
    def talks(inputs: Any, ctx: Any) -> dict[str, object]:
        ctx.logger.warning("first line")
        ctx.logger.warning(HOSTILE_TEXT)
        try:
            raise ValueError("<b>bad</b>")
        except ValueError:
            ctx.logger.exception("caught it")
        return {}

    run_id = engine.submit([DagNode(slug="talk", plugin="talks")], run_id="run-logs")
    engine.worker(concurrency=1, backstop_interval=None).run_until_idle()
    (task,) = engine.list_tasks(run_id)
    assert task.status is TaskStatus.COMPLETED
    return task.task_id


def test_the_task_page_lists_its_recorded_steps(engine: Engine) -> None:
    @engine.plugin("charges")
    def charges(inputs: Any, ctx: Any) -> dict[str, object]:
        receipt = ctx.step("charge", lambda: {"receipt": HOSTILE_TEXT})
        return {"paid": receipt["receipt"] == HOSTILE_TEXT}

    run_id = engine.submit([DagNode(slug="pay", plugin="charges")], run_id="run-steps")
    engine.worker(concurrency=1, backstop_interval=None).run_until_idle()
    (task,) = engine.list_tasks(run_id)
    web = client(engine)
    (step,) = web.get(f"/api/tasks/{task.task_id}").json()["steps"]
    assert (step["name"], step["result"]) == ("charge", {"receipt": HOSTILE_TEXT})
    assert step["attempt_id"] == task.attempt_id
    page = web.get(f"/tasks/{task.task_id}").text
    steps = page.split("<h2>Recorded steps</h2>", 1)[1].split("<h2>Waits</h2>", 1)[0]
    assert "<code>charge</code>" in steps and HOSTILE_TEXT not in page


def test_task_logs_come_back_in_pages_after_a_line(engine: Engine) -> None:
    task_id = logged_task(engine)
    web = client(engine)
    every = web.get(f"/api/tasks/{task_id}/logs").json()
    assert [line["message"] for line in every["lines"]] == ["first line", HOSTILE_TEXT, "caught it"]
    first, hostile, caught = every["lines"]
    assert set(first) == {"line_id", "attempt", "at", "level", "logger", "message", "traceback"}
    assert hostile["level"] == "WARNING" and hostile["attempt"] == 1 and hostile["at"] > 0
    assert caught["level"] == "ERROR" and "ValueError: <b>bad</b>" in caught["traceback"]
    assert every["next"] == caught["line_id"] and every["running"] is False
    one = web.get(f"/api/tasks/{task_id}/logs", params={"limit": 1}).json()
    assert [line["line_id"] for line in one["lines"]] == [first["line_id"]]
    rest = web.get(f"/api/tasks/{task_id}/logs", params={"after": one["next"]}).json()
    assert [line["message"] for line in rest["lines"]] == [HOSTILE_TEXT, "caught it"]
    done = web.get(f"/api/tasks/{task_id}/logs", params={"after": rest["next"]}).json()
    assert done == {"lines": [], "next": rest["next"], "running": False}
    other = web.get(f"/api/tasks/{task_id}/logs", params={"attempt": 2}).json()
    assert other["lines"] == []


def test_a_queued_task_has_no_lines_yet_and_is_running(engine: Engine) -> None:
    run_id = engine.submit([DagNode(slug="later", plugin="nobody")], run_id="run-queued")
    (task,) = engine.list_tasks(run_id)
    web = client(engine)
    answer = web.get(f"/api/tasks/{task.task_id}/logs").json()
    assert answer == {"lines": [], "next": 0, "running": True}
    page = web.get(f"/tasks/{task.task_id}").text
    assert 'data-logs-running="true"' in page and "The task logged nothing yet." in page


def test_the_task_page_shows_its_log_lines_as_text(engine: Engine) -> None:
    task_id = logged_task(engine)
    page = client(engine).get(f"/tasks/{task_id}").text
    logs = page.split('<section id="logs">', 1)[1]
    assert HOSTILE_TEXT not in page
    assert "&lt;script&gt;window.__pwned = true&lt;/script&gt;" in logs
    assert "first line" in logs and "WARNING" in logs and "talk" in logs
    assert '<pre class="traceback">' in logs and "ValueError: &lt;b&gt;bad&lt;/b&gt;" in logs
    assert 'data-logs-running="false"' in logs
    assert "This store records no task logs." not in page


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"after": "x"}, "after"),
        ({"after": "-1"}, "after"),
        ({"attempt": "0"}, "attempt"),
        ({"attempt": "one"}, "attempt"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1000000"}, "limit"),
    ],
)
def test_bad_log_parameters_are_typed_errors(
    engine: Engine, query: dict[str, str], field: str
) -> None:
    task_id = logged_task(engine)
    answer = client(engine).get(f"/api/tasks/{task_id}/logs", params=query)
    assert answer.status_code == 400
    assert answer.json()["error"]["field"] == field


def test_the_logs_of_an_unknown_task_are_404_and_need_the_token(engine: Engine) -> None:
    task_id = logged_task(engine)
    web = client(engine)
    missing = web.get("/api/tasks/no-such-task/logs")
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "task_id"
    guarded = client(engine, token=TOKEN, loopback=False, base_url="http://10.0.0.5")
    assert guarded.get(f"/api/tasks/{task_id}/logs").status_code == 401
    allowed = guarded.get(
        f"/api/tasks/{task_id}/logs", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert allowed.status_code == 200 and len(allowed.json()["lines"]) == 3


# --- actions -----------------------------------------------------------------------


def test_retry_from_the_failed_node_then_it_completes(
    engine: Engine, demo: Demo, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    web = client(engine)
    (tmp_path / "fail").unlink()
    with caplog.at_level(logging.INFO, logger="dagwerk.web.actions"):
        answer = web.post(f"/api/runs/{demo.failed_run}/retry", json={"nodes": ["work"]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["affected_nodes"] == ["work", "report"]
    assert any(
        f"retry {demo.failed_run} by testclient (loopback): from work" in r.getMessage()
        for r in caplog.records
    )
    engine.worker(concurrency=1, backstop_interval=None).run_until_idle()
    run = web.get(f"/api/runs/{demo.failed_run}").json()
    assert run["run"]["status"] == "completed" and run["run"]["retry_count"] == 1
    assert {n["state"] for n in run["nodes"]} == {"done"}
    # Retrying a completed run is refused with the CLI's message.
    again = web.post(f"/api/runs/{demo.failed_run}/retry", json={})
    assert again.status_code == 409 and again.json()["error"]["code"] == "retry_rejected"
    rerun = web.post(f"/api/runs/{demo.failed_run}/rerun", json={"nodes": ["report"]})
    assert rerun.status_code == 200 and rerun.json()["affected_nodes"] == ["report"]


def test_resume_from_the_form_and_the_api(engine: Engine, demo: Demo) -> None:
    web = client(engine)
    (task,) = web.get(f"/api/runs/{demo.waiting_run}/tasks").json()["tasks"][:1]
    bad = web.post(
        f"/tasks/{task['task_id']}/resume",
        data={"csrf": csrf_of(web), "wait_id": "approval", "response": "{not json"},
        headers={"Accept": "application/json"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "response"
    wrong = web.post(
        f"/api/tasks/{task['task_id']}/resume", json={"wait_id": "other", "response": None}
    )
    assert wrong.status_code == 409 and wrong.json()["error"]["field"] == "wait_id"
    form = web.post(
        f"/tasks/{task['task_id']}/resume",
        data={"csrf": csrf_of(web), "wait_id": "approval", "response": '{"approved": true}'},
        follow_redirects=False,
    )
    assert form.status_code == 303
    assert form.headers["location"] == f"/tasks/{quote(task['task_id'])}"
    engine.worker(concurrency=1, backstop_interval=None).run_until_idle()
    assert engine.get_run(demo.waiting_run).status is RunStatus.COMPLETED  # type: ignore[union-attr]
    waits = web.get(f"/api/tasks/{task['task_id']}/waits").json()["waits"]
    assert waits[0]["state"] == "resolved" and waits[0]["response"] == {"approved": True}
    # An exact repeat returns the first result.
    repeat = web.post(f"/api/tasks/{task['task_id']}/resume", json={"wait_id": "approval"})
    assert repeat.status_code == 200


def test_reinject_a_dead_letter_once(engine: Engine, demo: Demo) -> None:
    web = client(engine)
    (letter,) = web.get("/api/dead-letters").json()["dead_letters"]
    assert letter["reason"] == "its worker gave up" and letter["node"] == "lost"
    assert demo.dead_letter_id in web.get("/dead-letters").text
    assert web.get(f"/dead-letters/{demo.dead_letter_id}").status_code == 200
    first = web.post(f"/api/dead-letters/{demo.dead_letter_id}/reinject", json={})
    assert first.status_code == 200 and first.json()["attempt_id"]
    second = web.post(f"/api/dead-letters/{demo.dead_letter_id}/reinject", json={})
    assert second.status_code == 400 and second.json()["error"]["code"] == "reinject_refused"
    engine.worker(concurrency=1, backstop_interval=None).run_until_idle()
    assert engine.get_run(demo.letter_run).status is RunStatus.COMPLETED  # type: ignore[union-attr]


def test_cancel_from_the_form(engine: Engine, demo: Demo) -> None:
    web = client(engine)
    done = web.post(
        f"/runs/{demo.waiting_run}/cancel", data={"csrf": csrf_of(web)}, follow_redirects=False
    )
    assert done.status_code == 303
    assert engine.get_run(demo.waiting_run).status is RunStatus.CANCELLED  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("url", "body", "expected"),
    [
        ("/api/runs/run-failed/retry", {"nodes": ["nope"]}, (400, "nodes")),
        ("/api/runs/run-failed/retry", {"nodes": "work"}, (400, "nodes")),
        ("/api/runs/run-failed/rerun", {"nodes": []}, (400, "nodes")),
        ("/api/runs/no-such-run/cancel", {}, (404, "run_id")),
        ("/api/tasks/t/resume", {"wait_id": ""}, (400, "wait_id")),
        ("/api/tasks/t/resume", {"wait_id": 5}, (400, "wait_id")),
        ("/api/runs/run-failed/cancel", {"reason": 5}, (400, "reason")),
        ("/api/runs", {"pipeline": 5}, (400, "pipeline")),
    ],
)
def test_bad_action_input_is_a_typed_error_naming_the_field(
    engine: Engine, demo: Demo, url: str, body: object, expected: tuple[int, str]
) -> None:
    answer = client(engine).post(url, json=body)
    assert (answer.status_code, answer.json()["error"]["field"]) == expected, answer.text


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"status": "bogus"}, "status"),
        ({"since": "yesterday"}, "since"),
        ({"limit": "0"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"after": "garbage"}, "after"),
    ],
)
def test_bad_filters_are_typed_errors(engine: Engine, query: dict[str, str], field: str) -> None:
    answer = client(engine).get("/api/runs", params=query)
    assert answer.status_code == 400 and answer.json()["error"]["field"] == field


def test_a_malformed_body_is_refused(engine: Engine, demo: Demo) -> None:
    web = client(engine)
    broken = web.post(
        "/api/runs/run-failed/retry", content=b"{", headers={"Content-Type": "application/json"}
    )
    assert broken.status_code == 400 and broken.json()["error"]["field"] == "body"


# --- POST /api/runs (the HTTP trigger) ----------------------------------------------------

PIPELINE = textwrap.dedent(
    """
    name: triggered
    nodes:
      - slug: greet
        plugin: demo_fan
        bindings:
          who: {source: runtime, key: who, required: true}
    """
)


def _trigger(engine: Engine, tmp_path: Path, **settings: Any) -> tuple[TestClient, Path]:
    path = tmp_path / "triggered.yaml"
    path.write_text(PIPELINE, encoding="utf-8")
    registry = ServedPipelines()
    registry.add(load_pipeline(path))
    return client(engine, pipelines=registry, **settings), path


def test_post_runs_starts_a_run_of_a_served_pipeline(engine: Engine, tmp_path: Path) -> None:
    web, path = _trigger(engine, tmp_path)
    made = web.post("/api/runs", json={"pipeline": "triggered", "input": {"who": "ada"}})
    assert made.status_code == 201, made.text
    run_id = made.json()["run_id"]
    record = engine.get_run(run_id)
    assert record is not None and record.pipeline == "triggered"
    assert engine.run_input(run_id) == {"who": "ada"}
    by_path = web.post("/api/runs", json={"pipeline": str(path), "input": {"who": "bob"}})
    assert by_path.status_code == 201
    keyed = web.post(
        "/api/runs",
        json={"pipeline": "triggered", "input": {"who": "cy"}},
        headers={"Idempotency-Key": "order-123"},
    )
    assert keyed.status_code == 201


def test_post_runs_with_an_idempotency_key_creates_one_run(engine: Engine, tmp_path: Path) -> None:
    web, _ = _trigger(engine, tmp_path)
    body = {"pipeline": "triggered", "input": {"who": "ada"}}
    headers = {"Idempotency-Key": "order-7"}
    first = web.post("/api/runs", json=body, headers=headers)
    again = web.post("/api/runs", json=body, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200), again.text
    assert first.json()["run_id"] == again.json()["run_id"]
    assert not again.json()["created"]
    other = web.post(
        "/api/runs", json={"pipeline": "triggered", "input": {"who": "bob"}}, headers=headers
    )
    assert other.status_code == 409, other.text
    assert other.json()["error"]["field"] == "idempotency_key"
    assert [run.run_id for run in engine.list_runs()] == [first.json()["run_id"]]


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        ({"pipeline": "triggered", "input": {}}, {}, (400, "who")),
        ({"pipeline": "triggered", "input": {"who": ""}}, {}, (400, "who")),
        ({"pipeline": "triggered", "input": []}, {}, (400, "input")),
        ({"pipeline": "other"}, {}, (404, "pipeline")),
        ({"pipeline": "/etc/passwd"}, {}, (404, "pipeline")),
        ({"pipeline": "triggered", "extra": 1}, {}, (400, "extra")),
        ([1, 2], {}, (400, "body")),
        (
            {"pipeline": "triggered", "input": {"who": "a"}},
            {"Idempotency-Key": "x" * 201},
            (400, "Idempotency-Key"),
        ),
    ],
)
def test_post_runs_validates_like_the_cli(
    engine: Engine,
    tmp_path: Path,
    body: object,
    headers: dict[str, str],
    expected: tuple[int, str],
) -> None:
    web, _ = _trigger(engine, tmp_path)
    answer = web.post("/api/runs", json=body, headers=headers)
    assert (answer.status_code, answer.json()["error"]["field"]) == expected, answer.text
    assert engine.list_runs() == []


def test_post_runs_needs_the_token_beyond_loopback(engine: Engine, tmp_path: Path) -> None:
    web, _ = _trigger(engine, tmp_path, token=TOKEN, loopback=False, base_url="http://10.0.0.5")
    body = {"pipeline": "triggered", "input": {"who": "ada"}}
    assert web.post("/api/runs", json=body).status_code == 401
    made = web.post("/api/runs", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert made.status_code == 201


# --- safety ------------------------------------------------------------------------


def test_read_only_hides_the_buttons_and_refuses_every_action(engine: Engine, demo: Demo) -> None:
    web = client(engine, read_only=True)
    page = web.get(f"/runs/{demo.failed_run}").text
    assert "read-only" in page
    assert (
        "Retry" not in page and 'type="checkbox"' not in page and '<form method="post"' not in page
    )
    assert "Resume" not in web.get(f"/runs/{demo.waiting_run}").text
    assert "Re-inject" not in web.get("/dead-letters").text
    refused = web.post(f"/api/runs/{demo.failed_run}/retry", json={})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "read_only"
    form = web.post(f"/runs/{demo.waiting_run}/cancel", data={"csrf": csrf_of(web)})
    assert form.status_code == 403
    assert engine.get_run(demo.waiting_run).status is RunStatus.RUNNING  # type: ignore[union-attr]
    assert engine.get_run(demo.failed_run).status is RunStatus.FAILED  # type: ignore[union-attr]


def test_form_posts_need_the_csrf_token_and_api_posts_json(engine: Engine, demo: Demo) -> None:
    web = client(engine)
    csrf_of(web)
    assert web.post(f"/runs/{demo.waiting_run}/cancel", data={}).status_code == 403
    assert web.post(f"/runs/{demo.waiting_run}/cancel", data={"csrf": "forged"}).status_code == 403
    plain = web.post(
        f"/api/runs/{demo.waiting_run}/cancel",
        content=b"{}",
        headers={"Content-Type": "text/plain"},
    )
    assert plain.status_code == 415
    cross = web.post(
        f"/api/runs/{demo.waiting_run}/cancel", json={}, headers={"Origin": "http://evil.example"}
    )
    assert cross.status_code == 403 and cross.json()["error"]["field"] == "Origin"
    assert web.get(f"/runs/{demo.waiting_run}/cancel").status_code in (404, 405)
    assert engine.get_run(demo.waiting_run).status is RunStatus.RUNNING  # type: ignore[union-attr]


def test_a_loopback_server_answers_only_loopback_host_names(engine: Engine) -> None:
    assert client(engine, base_url="http://evil.example").get("/api/runs").status_code == 421
    assert client(engine, base_url="http://localhost:8080").get("/api/runs").status_code == 200


def test_the_token_is_demanded_as_bearer_or_login_cookie(engine: Engine, demo: Demo) -> None:
    web = client(engine, token=TOKEN, loopback=False, base_url="http://10.0.0.5")
    assert web.get("/api/runs").status_code == 401
    assert web.get("/metrics").status_code == 401
    bounced = web.get("/runs", follow_redirects=False)
    assert bounced.status_code == 303 and bounced.headers["location"].startswith("/login")
    assert web.get("/healthz").status_code == 404  # open (this app has no health object)
    wrong = web.get("/api/runs", headers={"Authorization": "Bearer wrong-token-of-length"})
    assert wrong.status_code == 401
    ok = web.get("/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    failed = web.post("/login", data={"token": "nope", "next": "/runs"})
    assert failed.status_code == 401 and web.cookies.get(SESSION_COOKIE) is None
    logged = web.post("/login", data={"token": TOKEN, "next": "/runs"}, follow_redirects=False)
    assert logged.status_code == 303 and logged.headers["location"] == "/runs"
    cookie = logged.headers["set-cookie"]
    assert "httponly" in cookie.lower() and TOKEN not in cookie
    assert web.get("/runs").status_code == 200
    # Off-site "next" targets are not followed.
    elsewhere = web.post(
        "/login", data={"token": TOKEN, "next": "//evil.example/"}, follow_redirects=False
    )
    assert elsewhere.headers["location"] == "/"


def test_serve_refuses_another_host_without_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DAGWERK_UI_TOKEN", raising=False)
    runner = CliRunner()
    db = f"sqlite:///{tmp_path / 'x.db'}"
    result = runner.invoke(dagwerk_cli, ["serve", "--db", db, "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "DAGWERK_UI_TOKEN" in result.output
    monkeypatch.setenv("DAGWERK_UI_TOKEN", "short")
    weak = runner.invoke(dagwerk_cli, ["serve", "--db", db])
    assert weak.exit_code == 2 and "at least 16 characters" in weak.output


def test_demo_tasks_are_where_the_tests_expect(engine: Engine, demo: Demo) -> None:
    statuses = {t.status for t in engine.list_tasks(demo.failed_run)}
    assert TaskStatus.FAILED in statuses
    assert [n.slug for n in demo_nodes()] == ["fan", "work", "report"]


# --- attempt tracebacks -------------------------------------------------------------


def test_a_failed_attempts_traceback_is_in_the_api_and_folded_on_the_page(
    engine: Engine,
) -> None:
    @engine.plugin("raises")
    def raises(inputs: Any, ctx: Any) -> dict[str, object]:
        raise ValueError(HOSTILE_TEXT)

    run_id = engine.submit([DagNode(slug="r", plugin="raises")], run_id="run-traceback")
    engine.worker(concurrency=1, backstop_interval=None).run_until_idle()
    (task,) = engine.list_tasks(run_id)
    assert task.status is TaskStatus.FAILED
    web = client(engine)
    (attempt,) = web.get(f"/api/tasks/{task.task_id}").json()["attempts"]
    assert attempt["traceback"].startswith("Traceback (most recent call last):")
    assert "in raises" in attempt["traceback"]
    assert attempt["traceback"].endswith(f"ValueError: {HOSTILE_TEXT}")
    page = web.get(f"/tasks/{task.task_id}").text
    attempts = page.split("<h2>Attempts</h2>", 1)[1].split("<h2>Recorded steps</h2>", 1)[0]
    assert '<details class="attempt-traceback"><summary>traceback</summary>' in attempts
    assert "Traceback (most recent call last):" in attempts
    assert HOSTILE_TEXT not in page
    assert "&lt;script&gt;window.__pwned = true&lt;/script&gt;" in attempts
