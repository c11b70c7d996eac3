"""The dashboard ASGI app: admin API, HTML pages, static files, ``/metrics``.

Use :func:`create_dashboard` to get the app, served by ``durq dash`` or mounted inside your own
Starlette/FastAPI app under a prefix::

    from starlette.routing import Mount
    routes = [Mount("/admin/durq", app=create_dashboard(durq_app, token=os.environ["TOKEN"]))]

Every link and redirect is relative to the mount point (the ASGI ``root_path``)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Match, Mount, Route
from starlette.staticfiles import StaticFiles

from durq.dashboard import bodies, security
from durq.dashboard.api import AdminAPI
from durq.dashboard.history import History
from durq.dashboard.views import Views
from durq.errors import (
    BrokerUnavailableError,
    DurqError,
    GroupNotFoundError,
    InvalidStateError,
    QueueNotFoundError,
    ScheduleConflictError,
    ScheduleNotFoundError,
    SchemaError,
    TaskNotFoundError,
    ValidationError,
    WorkflowNotFoundError,
)

if TYPE_CHECKING:
    from durq.appview import AdminView

log = logging.getLogger("durq.dashboard")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

HERE = Path(__file__).parent


@dataclass(frozen=True)
class DashboardSettings:
    """How the dashboard behaves; see :func:`create_dashboard`."""

    read_only: bool = False
    title: str = "durq"
    #: ``None``: mark cookies Secure when the request came over https.
    cookie_secure: bool | None = None
    refresh_seconds: float = 5.0
    #: Host names the dashboard answers to besides its own address, IP addresses and
    #: ``localhost`` (``.example.com``: the domain and its subdomains; ``*``: any).
    allowed_hosts: tuple[str, ...] = ()
    #: How long a browser session lasts (logout ends it sooner).
    session_seconds: float = 3600.0
    #: Failed authentications a client may make per ``auth_failure_window`` seconds.
    auth_failure_limit: int = 10
    auth_failure_window: float = 60.0
    #: Bytes of a request body sent without authentication (the login form) ...
    public_body_max: int = bodies.PUBLIC_BODY_MAX
    #: ... and with it (API calls, forms of a session); larger bodies get 413.
    body_max: int = bodies.BODY_MAX
    #: Seconds a request's body may take to arrive after its headers (else 408).
    body_timeout: float = bodies.BODY_TIMEOUT


def route_path(scope: Scope) -> str:
    """The request path below the mount point."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        rest = path[len(root) :]
        if rest == "" or rest.startswith("/"):
            return rest or "/"
    return path


def is_public(path: str) -> bool:
    """Paths served without authentication."""
    return path == "/login" or path.startswith("/static/")


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


#: How each durq error appears over HTTP.
ERROR_STATUS: list[tuple[type[DurqError], int, str]] = [
    (TaskNotFoundError, 404, "not_found"),
    (QueueNotFoundError, 404, "not_found"),
    (GroupNotFoundError, 404, "not_found"),
    (ScheduleNotFoundError, 404, "not_found"),
    (WorkflowNotFoundError, 404, "not_found"),
    (ScheduleConflictError, 409, "conflict"),
    (InvalidStateError, 409, "invalid_state"),
    (ValidationError, 400, "bad_request"),
    (BrokerUnavailableError, 503, "broker_unavailable"),
    (SchemaError, 503, "broker_schema"),
    (security.CSRFError, 403, "forbidden"),
]


def status_for(exc: DurqError) -> tuple[int, str]:
    for kind, status, code in ERROR_STATUS:
        if isinstance(exc, kind):
            return status, code
    return 500, "broker_error"


class Dashboard:
    """Holds what the endpoints share: the durq app, auth, settings, history, metrics."""

    def __init__(self, app: AdminView, auth: security.Auth, settings: DashboardSettings) -> None:
        self.app = app
        self.auth = auth
        self.settings = settings
        self.history = History(app)
        self.limiter = security.FailureLimiter(
            settings.auth_failure_limit, settings.auth_failure_window
        )
        #: The routes of the app (set by :func:`create_dashboard`), for truthful ``Allow``.
        self.routes: list[Any] = []
        self.api = AdminAPI(self)
        self.views = Views(self)
        self._metrics: Any = None

    # -- request bodies ---------------------------------------------------------------------

    def body_limit(self, scope: Scope) -> int:
        """The body size allowed to this request, known once the guard authenticated it."""
        auth = scope.get("state", {}).get("durq_auth")
        if auth is None or is_public(route_path(scope)):
            return self.settings.public_body_max
        return self.settings.body_max

    # -- errors -----------------------------------------------------------------------------

    def is_api(self, request: Request) -> bool:
        path = route_path(request.scope)
        return path.startswith("/api/") or path == "/api" or path == "/metrics"

    async def on_durq_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, DurqError)
        status, code = status_for(exc)
        if status >= 500:
            log.error("dashboard: %s", exc)
        headers = {"retry-after": "5"} if status == 503 else None
        if self.is_api(request):
            return JSONResponse(error_body(code, exc.message), status, headers=headers)
        return self.views.error_page(request, status, exc.message, headers=headers)

    def allowed_methods(self, scope: Scope) -> str:
        """The methods of the path as routing reads it: those of the first route template
        that matches (several routes may share a template, one per method)."""
        template: str | None = None
        methods: set[str] = set()
        for route in self.routes:
            match, _ = route.matches(scope)
            path = getattr(route, "path", None)
            if match is Match.NONE or (template is not None and path != template):
                continue
            template = path
            methods |= set(getattr(route, "methods", None) or ())
        return ", ".join(sorted(methods))

    async def on_http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = exc.detail or "error"
        headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
        if exc.status_code == 405:
            headers["allow"] = self.allowed_methods(request.scope)
        if self.is_api(request):
            code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
            return JSONResponse(error_body(code, message), exc.status_code, headers=headers)
        return self.views.error_page(request, exc.status_code, message, headers=headers)

    async def on_invalid_request(self, request: Request, exc: Exception) -> Response:
        # A parameter the API's document restricts (name pattern, state, paging).
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        return JSONResponse(error_body("bad_request", problems[:500] or "invalid request"), 400)

    async def on_value_error(self, request: Request, exc: Exception) -> Response:
        # Malformed input that reached a parser (a bad form body, a broken cookie).
        if self.is_api(request):
            return JSONResponse(error_body("bad_request", str(exc)), 400)
        return self.views.error_page(request, 400, str(exc))

    # -- metrics ----------------------------------------------------------------------------

    async def metrics(self, request: Request) -> Response:
        """Prometheus exposition of queue gauges read through the inspector."""
        try:
            from durq.observability.metrics import QueueCollector, exposition
        except ImportError:
            return JSONResponse(
                error_body("unavailable", "install durq[metrics] for /metrics"), 404
            )
        if self._metrics is None:
            self._metrics = QueueCollector(self.app)
        await self._metrics.refresh()
        body, content_type = exposition(self._metrics.registry)
        return Response(body, media_type=content_type)


class Guard:
    """ASGI middleware: body limits, security headers, authentication, CSRF cookie,
    read-only mode."""

    def __init__(self, inner: ASGIApp, dash: Dashboard) -> None:
        self.inner = inner
        #: The shared state, reachable for tests and the CLI (``guard.dash.history``).
        self.dash = dash
        # Outermost, so the guard's own early answers (401, 429) close a connection whose
        # body was not read, too.
        self.bounded = bodies.BodyLimit(
            self.checked,
            dash.body_limit,
            dash.settings.body_timeout,
            headers=security.SECURITY_HEADERS,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        await self.bounded(scope, receive, send)

    async def checked(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.guarded(scope, receive, tracking)
        except bodies.BodyRefused:
            raise  # answered already (413/408) by the body limit around us
        except Exception:
            if started:  # Starlette's own error page went out (with our headers): re-raise
                raise
            # A fault before Starlette ran (the guard itself): answer like any other page.
            log.exception("dashboard: internal error")
            headers = {**security.SECURITY_HEADERS, "content-type": "text/plain; charset=utf-8"}
            await Response("Internal Server Error", 500, headers=headers)(scope, receive, send)

    async def guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Authenticate, check CSRF and read-only mode, then call the app."""
        dash = self.dash
        request = Request(scope, receive)
        path = route_path(scope)
        method = scope["method"]
        is_api = dash.is_api(request)
        set_cookies: list[str] = []
        secure = dash.settings.cookie_secure
        if secure is None:
            secure = scope.get("scheme") == "https"
        cookie_path = scope.get("root_path") or "/"

        csrf_cookie = request.cookies.get(security.CSRF_COOKIE)
        if not csrf_cookie or len(csrf_cookie) > 64:
            csrf_cookie = security.new_csrf_cookie()
            set_cookies.append(
                cookie_header(security.CSRF_COOKIE, csrf_cookie, cookie_path, secure)
            )
        state = scope.setdefault("state", {})
        # Until a session is found below, forms carry the pre-session token.
        state["durq_csrf"] = state["durq_csrf_login"] = dash.auth.csrf_token(None, csrf_cookie)
        state["durq_cookie_path"] = cookie_path
        state["durq_cookie_secure"] = secure

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.decode().lower() for k, _ in headers}
                for name, value in security.SECURITY_HEADERS.items():
                    if name not in present:
                        headers.append((name.encode(), value.encode()))
                for cookie in set_cookies:
                    headers.append((b"set-cookie", cookie.encode()))
                message["headers"] = headers
            await send(message)

        if not security.host_allowed(
            request.headers.get("host", ""), scope.get("server"), dash.settings.allowed_hosts
        ):
            # DNS rebinding: a page of another site whose name now points at this address.
            message = "this dashboard does not answer to that Host (see allowed_hosts)"
            response: Response = JSONResponse(error_body("bad_host", message), 400)
            await response(scope, receive, send_with_headers)
            return
        public = is_public(path)
        client = security.client_of(scope)
        attempts = "authorization" in request.headers or (path == "/login" and method == "POST")
        wait = dash.limiter.retry_after(client, time.monotonic()) if attempts else None
        if wait is not None:
            response = JSONResponse(
                error_body("too_many_failures", "too many failed authentications: wait"),
                429,
                headers={"retry-after": str(int(wait) + 1)},
            )
            await response(scope, receive, send_with_headers)
            return
        kind: str | None = "insecure"
        if dash.auth.enabled:
            session_id = dash.auth.session_id(request, dash.app.clock.now())
            if session_id is not None:
                state["durq_csrf"] = dash.auth.csrf_token(session_id, csrf_cookie)
            if dash.auth.bearer(request):
                kind = "bearer"
            elif session_id is not None:
                kind = "session"
            else:
                kind = None
                if "authorization" in request.headers:
                    dash.limiter.failed(client, time.monotonic())
        state["durq_auth"] = kind
        if kind is None and not public:
            response = self.refuse(request, path, method, is_api)
            await response(scope, receive, send_with_headers)
            return

        mutation = method not in security.SAFE_METHODS
        if mutation and not public and path != "/logout":
            if dash.settings.read_only:
                response = self.forbidden(request, is_api, "the dashboard is read-only")
                await response(scope, receive, send_with_headers)
                return
            # API calls from the browser send the token in a header; forms are checked by
            # their view (the field is in the body).
            if is_api and kind != "bearer":
                submitted = request.headers.get(security.CSRF_HEADER)
                if not security.csrf_ok(request, submitted):
                    response = self.forbidden(request, is_api, "CSRF check failed")
                    await response(scope, receive, send_with_headers)
                    return
        await self.inner(scope, receive, send_with_headers)

    def refuse(self, request: Request, path: str, method: str, is_api: bool) -> Response:
        if is_api:
            return JSONResponse(
                error_body("unauthorized", "authentication required: Authorization: Bearer"),
                401,
                headers={"www-authenticate": 'Bearer realm="durq"'},
            )
        if method in ("GET", "HEAD"):
            root = request.scope.get("root_path", "")
            target = path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"{root}/login?next={quote(target)}", 303)
        return self.dash.views.error_page(request, 401, "please log in first")

    def forbidden(self, request: Request, is_api: bool, message: str) -> Response:
        if is_api:
            return JSONResponse(error_body("forbidden", message), 403)
        return self.dash.views.error_page(request, 403, message)


def cookie_header(
    name: str, value: str, path: str, secure: bool, max_age: int | None = None
) -> str:
    parts = [f"{name}={value}", f"Path={path}", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def create_dashboard(
    app: AdminView,
    *,
    token: str | None = None,
    insecure_no_auth: bool = False,
    read_only: bool = False,
    secret_key: str | bytes | None = None,
    settings: DashboardSettings | None = None,
) -> Guard:
    """The dashboard and admin API for ``app`` as an ASGI app.

    ``token`` is required unless ``insecure_no_auth=True``. ``read_only`` hides and
    refuses every action. Request bodies are bounded in size and time
    (``settings.public_body_max``, ``body_max``, ``body_timeout``) under any server. ``secret_key`` signs session cookies (default: derived from the
    token). Mount it anywhere; it needs no lifespan events (its chart reads the broker's
    per-minute counters, so it keeps no state of its own)."""
    if token is None and not insecure_no_auth:
        raise ValueError("create_dashboard needs a token, or insecure_no_auth=True")
    if token is not None and insecure_no_auth:
        raise ValueError("give a token or insecure_no_auth=True, not both")
    if token is not None and len(token) < 8:
        raise ValueError("the dashboard token must have at least 8 characters")
    if settings is None:
        settings = DashboardSettings(read_only=read_only)
    elif read_only:
        settings = DashboardSettings(**{**settings.__dict__, "read_only": True})
    auth = security.Auth.create(token, secret_key, settings.session_seconds)
    dash = Dashboard(app, auth, settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await app.close()

    routes = [
        *dash.api.routes(),
        *dash.views.routes(),
        Route("/metrics", dash.metrics, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    dash.routes = routes
    # FastAPI (a Starlette app) because the API's routes are FastAPI routes; its own
    # document and docs pages are off: the API's document is served by the API itself.
    starlette = FastAPI(
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            DurqError: dash.on_durq_error,
            HTTPException: dash.on_http_error,
            RequestValidationError: dash.on_invalid_request,
            ValueError: dash.on_value_error,
        },
    )

    return Guard(starlette, dash)
