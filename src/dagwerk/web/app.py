"""The dashboard as an ASGI application: HTML pages, the JSON API under
``/api/``, ``/metrics`` and ``/healthz``, over one :class:`~dagwerk.Engine`.

:func:`create_app` builds it; ``dagwerk serve`` hosts it with uvicorn.
Pages are rendered on the server (Jinja2, autoescaped); ``static/app.js``
refreshes the live parts of a running run's page and submits action forms
without a reload. :mod:`dagwerk.web.security` says who may call what.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from dagwerk.constants import RunStatus
from dagwerk.engine import Engine, IdempotencyConflictError
from dagwerk.errors import DagwerkError
from dagwerk.web import actions, reads
from dagwerk.web.actions import (
    ActionInputError,
    NotFoundError,
    ServedPipelines,
    parse_json_text,
)
from dagwerk.web.security import (
    CSRF_COOKIE,
    LOOPBACK_NAMES,
    SESSION_COOKIE,
    Caller,
    new_csrf_token,
    session_value,
    tokens_match,
)

__all__ = ["MAX_BODY_BYTES", "WebSettings", "create_app"]

MAX_BODY_BYTES = 2 * 1024 * 1024
"""The largest request body an action accepts."""
_PUBLIC = ("/healthz", "/login", "/static/")
_STATIC = Path(__file__).with_name("static")


@dataclass(slots=True)
class WebSettings:
    """How the app serves: ``token`` (``None``: no token; only on loopback),
    ``read_only`` (no actions), ``loopback`` (the server listens on a
    loopback address: requests must name a loopback host), the pipelines
    ``POST /api/runs`` may start, and the metrics/health objects of
    ``/metrics`` and ``/healthz`` (``None``: those answer 404)."""

    token: str | None = None
    read_only: bool = False
    loopback: bool = True
    pipelines: ServedPipelines = field(default_factory=ServedPipelines)
    metrics: Any = None
    health: Any = None
    poll_seconds: float = 1.0


class ReadOnlyError(DagwerkError, PermissionError):
    code = "read_only"


def _status_for(error: Exception) -> int:
    if isinstance(error, IdempotencyConflictError):
        return 409
    if isinstance(error, ReadOnlyError):
        return 403
    if isinstance(error, LookupError):
        return 404
    if isinstance(error, ValueError):
        return 400
    if isinstance(error, RuntimeError):
        return 409
    return 400


def _error_json(error: DagwerkError) -> dict[str, Any]:
    return {
        "error": {
            "code": error.code,
            "message": error.message,
            "field": error.field,
            "limit": error.limit,
        }
    }


def _time(value: object) -> str:
    if not isinstance(value, (int, float)) or not value:
        return "-"
    return datetime.fromtimestamp(value, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _duration(value: object) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _pretty(value: object) -> str:
    # Plain text: the template's autoescaping makes it safe in HTML.
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _parse_time(text: str | None, name: str) -> float | None:
    """An ISO 8601 date or date-time (UTC unless it has an offset), or epoch seconds."""
    if text is None or text == "":
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ActionInputError(
            f"{name} must be an ISO 8601 date or date-time (2026-01-31, 2026-01-31T12:00) "
            "or epoch seconds",
            field=name,
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _int_param(
    request: Request,
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ActionInputError(f"{name} must be an integer", field=name) from None
    if minimum is not None and value < minimum:
        raise ActionInputError(f"{name} must be >= {minimum}", field=name, limit=minimum)
    if maximum is not None and value > maximum:
        raise ActionInputError(f"{name} must be <= {maximum}", field=name, limit=maximum)
    return value


def _run_filters(request: Request) -> dict[str, Any]:
    query = request.query_params
    status = query.get("status") or None
    if status is not None and status not in {s.value for s in RunStatus}:
        names = ", ".join(s.value for s in RunStatus)
        raise ActionInputError(f"status must be one of {names}", field="status")
    return {
        "status": status,
        "pipeline": query.get("pipeline") or None,
        "created_after": _parse_time(query.get("since"), "since"),
        "created_before": _parse_time(query.get("until"), "until"),
        "after": query.get("after") or None,
        "limit": _int_param(request, "limit", 50),
    }


class _Guard(BaseHTTPMiddleware):
    """Host check, token check, read-only and CSRF, before any endpoint."""

    def __init__(self, app: Any, settings: WebSettings) -> None:
        super().__init__(app)
        self.settings = settings

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        settings = self.settings
        path = request.url.path
        is_api = path.startswith("/api/")
        host = _host_name(request.headers.get("host", ""))
        if settings.loopback and host.lower() not in LOOPBACK_NAMES:
            return PlainTextResponse("this server answers only to a loopback host name\n", 421)
        client = request.client.host if request.client else "?"
        via = "loopback"
        if settings.token is not None and not path.startswith(_PUBLIC):
            bearer = request.headers.get("authorization", "")
            if bearer.lower().startswith("bearer ") and tokens_match(
                bearer[7:].strip(), settings.token
            ):
                via = "bearer"
            elif tokens_match(request.cookies.get(SESSION_COOKIE), session_value(settings.token)):
                via = "session"
            elif is_api or path == "/metrics" or request.method != "GET":
                return JSONResponse(
                    {
                        "error": {
                            "code": "unauthorized",
                            "message": "a token is required",
                            "field": "Authorization",
                            "limit": None,
                        }
                    },
                    401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            else:
                return RedirectResponse(f"/login?next={quote(str(request.url.path))}", 303)
        request.state.caller = Caller(client, via)
        if request.method == "POST" and path != "/login":
            if settings.read_only:
                error = ReadOnlyError("this server is read-only (--read-only)", field="method")
                if is_api:
                    return JSONResponse(_error_json(error), 403)
                return HTMLResponse("read-only: actions are disabled\n", 403)
            refused = await _csrf_refusal(request, via, is_api)
            if refused is not None:
                return refused
        response = await call_next(request)
        issued = getattr(request.state, "csrf", None)
        if CSRF_COOKIE not in request.cookies and not is_api and issued is not None:
            response.set_cookie(
                CSRF_COOKIE,
                issued,
                httponly=True,
                samesite="strict",
                path="/",
            )
        return response


async def _csrf_refusal(request: Request, via: str, is_api: bool) -> Response | None:
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin.rstrip("/") != own:
            return JSONResponse(
                {
                    "error": {
                        "code": "csrf",
                        "message": f"cross-origin POST from {origin}",
                        "field": "Origin",
                        "limit": None,
                    }
                },
                403,
            )
    if is_api:
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/json" and via != "bearer":
            return JSONResponse(
                {
                    "error": {
                        "code": "csrf",
                        "message": "API POSTs must be application/json",
                        "field": "Content-Type",
                        "limit": None,
                    }
                },
                415,
            )
        return None
    # The body is read (and cached for the endpoint), never parsed as a
    # stream here: the endpoint parses the form again.
    raw = await request.body()
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    fields = parse_qs(raw.decode("latin-1")) if kind == "application/x-www-form-urlencoded" else {}
    given = fields.get("csrf", [None])[0]
    expected = request.cookies.get(CSRF_COOKIE)
    if expected is None or given is None or not tokens_match(given, expected):
        message = "the form's CSRF token does not match: reload the page and try again"
        if request.headers.get("accept", "").startswith("application/json"):
            return JSONResponse(
                {"error": {"code": "csrf", "message": message, "field": "csrf", "limit": None}},
                403,
            )
        return HTMLResponse(message + "\n", 403)
    return None


def create_app(engine: Engine, settings: WebSettings | None = None) -> Starlette:
    """The dashboard app over ``engine`` (which the caller keeps open and closes)."""
    settings = settings if settings is not None else WebSettings()
    templates = Environment(
        loader=PackageLoader("dagwerk.web", "templates"),
        autoescape=select_autoescape(["html"], default_for_string=True, default=True),
    )
    templates.filters.update(time=_time, duration=_duration, pretty=_pretty)

    async def call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # Engine calls block on the database: off the event loop.
        return await run_in_threadpool(function, *args, **kwargs)

    def csrf(request: Request) -> str:
        token = request.cookies.get(CSRF_COOKIE) or getattr(request.state, "csrf", None)
        if token is None:
            token = new_csrf_token()
        request.state.csrf = token
        return token

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.update(
            request=request,
            csrf=csrf(request),
            read_only=settings.read_only,
            poll_ms=int(settings.poll_seconds * 1000),
            path=request.url.path,
            login=settings.token is not None,
        )
        return HTMLResponse(templates.get_template(name).render(**context), status)

    def failure(request: Request, error: DagwerkError) -> Response:
        status = _status_for(error)
        wants_json = request.headers.get("accept", "").startswith("application/json")
        if request.url.path.startswith("/api/") or wants_json:
            return JSONResponse(_error_json(error), status)
        return page(request, "error.html", status, error=error)

    def handles(
        endpoint: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            csrf(request)
            try:
                return await endpoint(request)
            except DagwerkError as error:
                return failure(request, error)

        return wrapped

    async def body_json(request: Request) -> object:
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            raise ActionInputError(
                f"the request body exceeds {MAX_BODY_BYTES} bytes",
                field="body",
                limit=MAX_BODY_BYTES,
            )
        if not raw.strip():
            return {}
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ActionInputError("the request body is not UTF-8", field="body") from None
        return parse_json_text(text, "body")

    def caller(request: Request) -> Caller:
        found: Caller = request.state.caller
        return found

    # --- pages ---------------------------------------------------------------

    async def overview_page(request: Request) -> Response:
        data = await call(reads.overview, engine, settings.health)
        return page(request, "overview.html", overview=data)

    async def runs_list_page(request: Request) -> Response:
        filters = _run_filters(request)
        data = await call(reads.runs_page, engine, **filters)
        return page(request, "runs.html", data=data, query=request.query_params)

    async def run_page(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        detail = await call(reads.run_detail, engine, run_id)
        node = request.query_params.get("node") or None
        tasks = None
        if node is not None:
            found = await call(
                engine.list_tasks_page,
                run_id,
                node=node,
                status=request.query_params.get("status") or None,
                after=request.query_params.get("after") or None,
                limit=_int_param(request, "limit", 50),
            )
            tasks = reads.tasks_json(engine, run_id, found)
        return page(request, "run.html", d=detail, node=node, tasks=tasks)

    async def run_live(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        detail = await call(reads.run_detail, engine, run_id)
        return page(request, "run_live.html", d=detail)

    async def task_page(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        detail = await call(reads.task_detail, engine, task_id)
        if detail is None:
            raise NotFoundError(f"task {task_id!r} does not exist", field="task_id") from None
        logs = await call(reads.task_page_logs, engine, task_id)
        return page(request, "task.html", d=detail, logs=logs)

    async def letters_page(request: Request) -> Response:
        run_id = request.query_params.get("run") or None
        letters = await call(reads.dead_letters, engine, run_id)
        return page(request, "dead_letters.html", letters=letters, run_id=run_id)

    async def letter_page(request: Request) -> Response:
        letter_id = request.path_params["letter_id"]
        letters = await call(reads.dead_letters, engine, None)
        found = [d for d in letters if d["dead_letter_id"] == letter_id]
        if not found:
            return page(
                request,
                "error.html",
                404,
                error=NotFoundError(
                    f"dead letter {letter_id!r} does not exist", field="dead_letter_id"
                ),
            )
        return page(request, "dead_letter.html", letter=found[0])

    async def login_page(request: Request) -> Response:
        if request.method == "GET":
            return page(request, "login.html", next=request.query_params.get("next", "/"))
        form = await request.form()
        target = _safe_next(form.get("next"))
        token = settings.token
        given = form.get("token")
        if token is None or not isinstance(given, str) or not tokens_match(given, token):
            return page(request, "login.html", 401, next=target, failed=True)
        response = RedirectResponse(target, 303)
        response.set_cookie(
            SESSION_COOKIE, session_value(token), httponly=True, samesite="strict", path="/"
        )
        return response

    # --- form actions (pages) -------------------------------------------------

    def done(request: Request, target: str, answer: dict[str, Any]) -> Response:
        if request.headers.get("accept", "").startswith("application/json"):
            return JSONResponse(answer)
        return RedirectResponse(target, 303)

    async def form_of(request: Request) -> FormData:
        return await request.form()

    async def form_cancel(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        answer = await call(actions.cancel, engine, run_id, caller(request))
        return done(request, f"/runs/{quote(run_id)}", answer)

    async def form_retry(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        form = await form_of(request)
        nodes = actions.nodes_from_form([str(v) for v in form.getlist("nodes")])
        answer = await call(actions.retry, engine, run_id, nodes or None, caller(request))
        return done(request, f"/runs/{quote(run_id)}", answer)

    async def form_rerun(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        form = await form_of(request)
        nodes = actions.nodes_from_form([str(v) for v in form.getlist("nodes")])
        answer = await call(actions.rerun, engine, run_id, nodes, caller(request))
        return done(request, f"/runs/{quote(run_id)}", answer)

    async def form_resume(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        form = await form_of(request)
        text = str(form.get("response") or "").strip()
        response = None if not text else parse_json_text(text, "response")
        answer = await call(
            actions.resume, engine, task_id, form.get("wait_id"), response, caller(request)
        )
        back = _safe_next(form.get("next")) if form.get("next") else f"/tasks/{quote(task_id)}"
        return done(request, back, answer)

    async def form_reinject(request: Request) -> Response:
        letter_id = request.path_params["letter_id"]
        form = await form_of(request)
        answer = await call(actions.reinject, engine, letter_id, caller(request))
        back = _safe_next(form.get("next")) if form.get("next") else "/dead-letters"
        return done(request, back, answer)

    # --- JSON API --------------------------------------------------------------

    async def api_overview(request: Request) -> Response:
        return JSONResponse(await call(reads.overview, engine, settings.health))

    async def api_runs(request: Request) -> Response:
        if request.method == "POST":
            body = await body_json(request)
            answer = await call(
                actions.start_run,
                engine,
                settings.pipelines,
                body,
                request.headers.get("idempotency-key"),
                caller(request),
            )
            return JSONResponse(answer, 201 if answer["created"] else 200)
        return JSONResponse(await call(reads.runs_page, engine, **_run_filters(request)))

    async def api_run(request: Request) -> Response:
        detail = await call(reads.run_detail, engine, request.path_params["run_id"])
        detail.pop("svg")
        detail.pop("gantt")
        return JSONResponse(detail)

    async def api_why(request: Request) -> Response:
        return JSONResponse(await call(reads.why, engine, request.path_params["run_id"]))

    async def api_tasks(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        limit = _int_param(request, "limit", 50)
        found = await call(
            engine.list_tasks_page,
            run_id,
            node=request.query_params.get("node") or None,
            status=request.query_params.get("status") or None,
            after=request.query_params.get("after") or None,
            limit=limit,
        )
        tasks = reads.tasks_json(engine, run_id, found)
        more = len(found) == limit
        return JSONResponse({"tasks": tasks, "next": found[-1].task_id if more else None})

    async def api_task(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        detail = await call(reads.task_detail, engine, task_id)
        if detail is None:
            raise NotFoundError(f"task {task_id!r} does not exist", field="task_id")
        return JSONResponse(detail)

    def api_task_part(part: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            task_id = request.path_params["task_id"]
            detail = await call(reads.task_detail, engine, task_id)
            if detail is None:
                raise NotFoundError(f"task {task_id!r} does not exist", field="task_id")
            return JSONResponse({part: detail[part]})

        return endpoint

    async def api_task_logs(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        after = _int_param(request, "after", 0, minimum=0)
        attempt = _int_param(request, "attempt", 0, minimum=1) or None
        limit = _int_param(
            request,
            "limit",
            reads.MAX_TASK_PAGE_LOG_LINES,
            minimum=1,
            maximum=reads.MAX_TASK_PAGE_LOG_LINES,
        )
        found = await call(
            reads.task_logs, engine, task_id, after=after, attempt=attempt, limit=limit
        )
        if found is None:
            raise NotFoundError(f"task {task_id!r} does not exist", field="task_id")
        return JSONResponse(found)

    async def api_letters(request: Request) -> Response:
        run_id = request.query_params.get("run_id") or None
        return JSONResponse({"dead_letters": await call(reads.dead_letters, engine, run_id)})

    async def api_cancel(request: Request) -> Response:
        body = await body_json(request)
        reason = body.get("reason") if isinstance(body, dict) else None
        return JSONResponse(
            await call(
                actions.cancel, engine, request.path_params["run_id"], caller(request), reason
            )
        )

    async def api_retry(request: Request) -> Response:
        body = await body_json(request)
        nodes = body.get("nodes") if isinstance(body, dict) else None
        return JSONResponse(
            await call(actions.retry, engine, request.path_params["run_id"], nodes, caller(request))
        )

    async def api_rerun(request: Request) -> Response:
        body = await body_json(request)
        nodes = body.get("nodes") if isinstance(body, dict) else None
        return JSONResponse(
            await call(actions.rerun, engine, request.path_params["run_id"], nodes, caller(request))
        )

    async def api_resume(request: Request) -> Response:
        body = await body_json(request)
        if not isinstance(body, dict):
            raise ActionInputError("the request body must be a JSON object", field="body")
        return JSONResponse(
            await call(
                actions.resume,
                engine,
                request.path_params["task_id"],
                body.get("wait_id"),
                body.get("response"),
                caller(request),
            )
        )

    async def api_reinject(request: Request) -> Response:
        return JSONResponse(
            await call(actions.reinject, engine, request.path_params["letter_id"], caller(request))
        )

    # --- metrics and health ------------------------------------------------------

    async def metrics(request: Request) -> Response:
        if settings.metrics is None:
            return PlainTextResponse("not found\n", 404)
        from dagwerk.metrics import CONTENT_TYPE

        try:
            body = await call(settings.metrics.render)
        except Exception as exc:
            return PlainTextResponse(f"{exc}\n", 500)
        return Response(body, 200, media_type=CONTENT_TYPE)

    async def healthz(request: Request) -> Response:
        if settings.health is None:
            return PlainTextResponse("not found\n", 404)
        healthy, document = await call(settings.health.check)
        return Response(
            (json.dumps(document, sort_keys=True) + "\n").encode(),
            200 if healthy else 503,
            media_type="application/json",
        )

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        if request.url.path.startswith("/api/"):
            return JSONResponse(
                {
                    "error": {
                        "code": "not_found",
                        "message": "no such endpoint",
                        "field": None,
                        "limit": None,
                    }
                },
                status,
            )
        return PlainTextResponse("not found\n" if status == 404 else f"{status}\n", status)

    h = handles
    routes = [
        Route("/", h(overview_page)),
        Route("/runs", h(runs_list_page)),
        Route("/runs/{run_id:path}/live", h(run_live)),
        Route("/runs/{run_id:path}/cancel", h(form_cancel), methods=["POST"]),
        Route("/runs/{run_id:path}/retry", h(form_retry), methods=["POST"]),
        Route("/runs/{run_id:path}/rerun", h(form_rerun), methods=["POST"]),
        Route("/runs/{run_id:path}", h(run_page)),
        Route("/tasks/{task_id:path}/resume", h(form_resume), methods=["POST"]),
        Route("/tasks/{task_id:path}", h(task_page)),
        Route("/dead-letters", h(letters_page)),
        Route("/dead-letters/{letter_id:path}/reinject", h(form_reinject), methods=["POST"]),
        Route("/dead-letters/{letter_id:path}", h(letter_page)),
        Route("/login", h(login_page), methods=["GET", "POST"]),
        Route("/api/overview", h(api_overview)),
        Route("/api/runs", h(api_runs), methods=["GET", "POST"]),
        Route("/api/runs/{run_id:path}/why", h(api_why)),
        Route("/api/runs/{run_id:path}/tasks", h(api_tasks)),
        Route("/api/runs/{run_id:path}/cancel", h(api_cancel), methods=["POST"]),
        Route("/api/runs/{run_id:path}/retry", h(api_retry), methods=["POST"]),
        Route("/api/runs/{run_id:path}/rerun", h(api_rerun), methods=["POST"]),
        Route("/api/runs/{run_id:path}", h(api_run)),
        Route("/api/tasks/{task_id:path}/resume", h(api_resume), methods=["POST"]),
        *(
            Route(f"/api/tasks/{{task_id:path}}/{part}", h(api_task_part(part)))
            for part in ("attempts", "waits", "outputs", "plan")
        ),
        Route("/api/tasks/{task_id:path}/logs", h(api_task_logs)),
        Route("/api/tasks/{task_id:path}", h(api_task)),
        Route("/api/dead-letters", h(api_letters)),
        Route("/api/dead-letters/{letter_id:path}/reinject", h(api_reinject), methods=["POST"]),
        Route("/metrics", metrics),
        Route("/healthz", healthz),
        Mount("/static", StaticFiles(directory=_STATIC), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(_Guard, settings=settings)],
        exception_handlers={404: not_found, 405: not_found},
    )


def _safe_next(value: object) -> str:
    """A same-site path to go back to; anything else is ``/``."""
    if not isinstance(value, str) or not value.startswith("/") or value.startswith("//"):
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or "\\" in value:
        return "/"
    return value


def _host_name(header: str) -> str:
    """The host name of a ``Host`` header, without the port (``[::1]`` kept bracketed)."""
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header
