"""The HTTP API: ``POST /orders``, ``GET /orders/{id}``, ``GET /health``, the insurance
partner's callback ``POST /partner/callbacks/coverage`` (and ``GET /``, a pointer to these and
to the docs).

Run as a monolith (the worker inside this process, ``INSURANCE_MONOLITH=1``, the default)::

    uvicorn examples.insurance.api:create_app --factory --port 8000

or split (``INSURANCE_MONOLITH=0``) next to ``durq worker examples.insurance.worker:app``.
Only how the process is assembled changes; the handlers are the same.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import hmac
import html
import json
import logging
import re
import secrets
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

import pydantic_core
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import durq
from durq.web import already_accepted, signal_answer, unavailable
from durq.web.asgi import durq_lifespan, get_durq, to_response

from .config import Settings
from .health import HealthProbe
from .logs import setup_logging
from .partners import SIGNATURE_HEADER, CoverageCallback, PartnerProtocolError, signed_by_partner
from .store import NewOrder, Order
from .tasks import (
    COVERAGE_QUEUE,
    PARTNER_ANSWER,
    Runtime,
    build,
    coverage_task_id,
    enqueue_coverage,
    partner_answer,
)

log = logging.getLogger("insurance.api")

_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")  # printable ASCII, no spaces
_ORDER_ID = re.compile(r"^ord_[0-9a-f]{24}$")
#: The order command, as a client sends it.
ITEMS_EXAMPLE = '{"items": [{"sku": "A-1", "qty": 2}]}'


# -- the request and response bodies ---------------------------------------------------------


def _integral(value: Any) -> Any:
    """JSON Schema's integer includes ``137.0``; strings and booleans stay refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class Item(BaseModel):
    """One line of the order."""

    model_config = ConfigDict(extra="forbid", strict=True)

    sku: str = Field(pattern=r"^[A-Z0-9][A-Z0-9-]{0,31}$", examples=["A-1"])
    qty: Annotated[int, BeforeValidator(_integral)] = Field(ge=1, le=1000)


class OrderIn(BaseModel):
    """``{"items": [{"sku": "A-1", "qty": 2}]}``, as a client sends it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    items: list[Item] = Field(min_length=1, max_length=100)


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: list[dict[str, Any]] | None = None


class ErrorOut(BaseModel):
    """Every error answer: ``{"error": {"code", "message"[, "details"]}}``."""

    error: ErrorDetail


class QueuedOut(BaseModel):
    """202: the order is saved and its coverage task queued."""

    status: str
    task_id: str
    queue: str | None = None
    order_id: str
    process_at: str | None = None


class AcceptedOut(BaseModel):
    """200: this Idempotency-Key was already accepted; the same order."""

    status: str
    task_id: str
    order_id: str
    state: str | None = None


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorOut, "description": description}


class OrderOut(BaseModel):
    """An order as its owner sees it."""

    order_id: str
    status: str
    items: list[dict[str, Any]]
    policy_number: str | None
    attempts: int
    last_error: str | None
    task_id: str
    task_state: str | None
    created_at: float
    updated_at: float


# -- errors: always JSON -------------------------------------------------------------------


class ApiError(HTTPException):
    """An error answer ``{"error": {"code", "message"}}``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        details: Any = None,
    ) -> None:
        super().__init__(status, message, headers=headers)
        self.code = code
        self.details = details


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        error["details"] = details
    return {"error": error}


def _validation_details(exc: ValidationError | RequestValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in exc.errors()
    ]


# -- identity and ids -------------------------------------------------------------------------


def order_ids(customer: str, key: str | None) -> tuple[str, str]:
    """``(order_id, task_id)``. With an Idempotency-Key both derive from (customer, key), so a
    retried request names the same order and the same durq task (E3)."""
    if key is None:
        digest = uuid.uuid4().hex[:24]
    else:
        digest = hashlib.sha256(f"{customer}\0{key}".encode()).hexdigest()[:24]
    order_id = f"ord_{digest}"
    return order_id, coverage_task_id(order_id)


def request_hash(order: OrderIn) -> str:
    canonical = json.dumps(order.model_dump(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def order_out(order: Order, task_state: str | None) -> dict[str, Any]:
    return OrderOut(
        order_id=order.id,
        status=order.status,
        items=order.items,
        policy_number=order.policy_number,
        attempts=order.attempts,
        last_error=order.last_error,
        task_id=order.task_id,
        task_state=task_state,
        created_at=order.created_at,
        updated_at=order.updated_at,
    ).model_dump()


# -- the index page ----------------------------------------------------------------------------


def service_index() -> dict[str, Any]:
    """What ``GET /`` lists: the endpoints, the schema and the docs."""
    return {
        "service": "Insurance coverage service (durq's reference service)",
        "endpoints": {
            "POST /orders": "create an order (Bearer token; optional Idempotency-Key): "
            "202 queued with Location, 200 already accepted, 503 broker down",
            "GET /orders/{order_id}": "the order's status, for its owner",
            "GET /health": "the broker probe and the partners' circuit breakers",
            "POST /partner/callbacks/coverage": "the insurance partner's decision, signed "
            "with the shared secret (X-Partner-Signature)",
            "GET /openapi.json": "the OpenAPI schema of this API",
        },
        "docs": {
            "service": "examples/insurance/README.md in durq's source tree",
            "durq": "README.md and docs/ in durq's source tree; `durq --help`",
            "dashboard": "run `durq dash` in another terminal (same broker)",
        },
    }


def index_html(body: dict[str, Any]) -> str:
    """``service_index()`` as a small page without scripts or remote assets."""
    esc = html.escape

    def items(section: dict[str, str]) -> str:
        return "".join(f"<li><code>{esc(k)}</code>: {esc(v)}</li>" for k, v in section.items())

    return (
        "<!doctype html><html lang=en><meta charset=utf-8>"
        f"<title>{esc(body['service'])}</title>"
        f"<h1>{esc(body['service'])}</h1>"
        f"<h2>Endpoints</h2><ul>{items(body['endpoints'])}</ul>"
        '<p>Schema: <a href="/openapi.json">/openapi.json</a> · '
        'Health: <a href="/health">/health</a></p>'
        f"<h2>Docs</h2><ul>{items(body['docs'])}</ul></html>"
    )


# -- security headers ----------------------------------------------------------------------

#: On every answer. The only page (``GET /``) has no script, style or image, so the policy
#: allows nothing; no page may be framed (clickjacking) or sniffed into another type.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class SecurityHeaders:
    """ASGI middleware adding :data:`SECURITY_HEADERS` to every HTTP answer (a plain ASGI
    wrapper: no per-request task or body copy, unlike ``@app.middleware("http")``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


# -- dependencies --------------------------------------------------------------------------


# The dependencies are ``async def``: FastAPI runs a plain ``def`` dependency in its thread
# pool, a thread round trip per request for a dictionary lookup.


async def current_customer(request: Request) -> str:
    """The customer behind the bearer token (the enqueue endpoint is a write)."""
    tokens: dict[str, str] = request.app.state.tokens
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "unauthorized",
            "a bearer token is required",
            headers={"WWW-Authenticate": "Bearer"},
        )
    given = token.strip().encode()
    for known, who in tokens.items():
        if hmac.compare_digest(known.encode(), given):
            return who
    raise ApiError(
        401,
        "unauthorized",
        "the bearer token is not valid",
        headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
    )


async def current_runtime(request: Request) -> Runtime:
    """The process's store and partner clients (installed by the lifespan)."""
    rt: Runtime = request.app.state.runtime
    return rt


Customer = Annotated[str, Depends(current_customer)]


async def durq_client(request: Request) -> durq.App:
    """The durq client (:func:`durq.web.asgi.get_durq`, without the thread-pool hop)."""
    return get_durq(request)


Client = Annotated[durq.App, Depends(durq_client)]
Rt = Annotated[Runtime, Depends(current_runtime)]


# -- the app -------------------------------------------------------------------------------------


def create_app(settings: Settings | None = None, *, configure_logging: bool = True) -> FastAPI:
    """The API, with the worker inside when ``settings.monolith``."""
    settings = settings or Settings.from_env()
    if configure_logging:
        setup_logging(settings.log_format, settings.log_level)
    app, runtimes = build(settings)
    tokens = dict(settings.tokens)
    if not tokens:
        token = secrets.token_urlsafe(16)
        tokens[token] = "demo"
        log.warning("INSURANCE_TOKENS is not set: customer 'demo' has token %s", token)
    probe = HealthProbe(app, ttl=settings.health_ttl)
    enqueue = functools.partial(enqueue_coverage, app)

    @contextlib.asynccontextmanager
    async def resources(api: FastAPI) -> AsyncIterator[None]:
        runtime = await runtimes.create()
        runtimes.install(runtime)
        api.state.runtime = runtime
        # What exists now (modules, the app, pools) lives as long as the process: keep it out
        # of the collector's full passes, which otherwise walk ~85,000 objects every few
        # hundred requests, a pause of 15 ms or more in the middle of answering.
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
            await runtimes.close()

    worker_options: dict[str, Any] | bool = False
    if settings.monolith:
        worker_options = {
            "queues": [COVERAGE_QUEUE],
            "concurrency": settings.concurrency,
            "shutdown_timeout": settings.shutdown_timeout,
            "poll_interval": settings.worker_poll,
            "promote_interval": settings.worker_poll,
        }
    api = FastAPI(
        title="Insurance coverage service",
        version="1.0.0",
        description="Orders whose insurance coverage is obtained by a durable background task.",
        lifespan=durq_lifespan(app, worker=worker_options, inner=resources),
        redirect_slashes=False,
        # A JSON API: no HTML pages (Swagger UI would load CDN scripts without a CSP);
        # the schema stays at /openapi.json.
        docs_url=None,
        redoc_url=None,
    )
    api.add_middleware(SecurityHeaders)
    api.state.settings = settings
    api.state.runtimes = runtimes
    api.state.probe = probe
    api.state.tokens = tokens

    async def read_body(request: Request) -> bytes:
        """The raw body, 413 past ``max_body`` (read no further)."""
        length = request.headers.get("content-length")
        if length is not None and (
            not (length.isascii() and length.isdigit()) or int(length) > settings.max_body
        ):
            raise ApiError(413, "body_too_large", f"the body exceeds {settings.max_body} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > settings.max_body:
                raise ApiError(413, "body_too_large", f"the body exceeds {settings.max_body} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def read_order(request: Request) -> OrderIn:
        """The body, bounded in size, parsed and validated; 4xx before anything is saved."""
        raw = await read_body(request)
        try:
            # pydantic-core's parser refuses nesting past a fixed depth (200); the standard
            # library's stops at the interpreter's recursion limit, which other code in the
            # process may have raised.
            data = pydantic_core.from_json(raw)
        except ValueError:
            raise ApiError(400, "malformed_json", "the body is not valid JSON") from None
        try:
            return OrderIn.model_validate(data)
        except ValidationError as exc:
            raise ApiError(
                422, "invalid_order", "the order is not valid", details=_validation_details(exc)
            ) from None

    # -- routes ------------------------------------------------------------------------------

    @api.post(
        "/orders",
        status_code=202,
        response_model=QueuedOut,
        responses={
            200: {"model": AcceptedOut, "description": "already accepted (same Idempotency-Key)"},
            400: _error("malformed JSON, or a malformed Idempotency-Key"),
            401: _error("no or bad token"),
            409: _error("Idempotency-Key reused with another body"),
            413: _error("the body is larger than the limit"),
            422: _error("the order is not valid (details say where)"),
            503: _error("the task broker is unavailable; nothing saved"),
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/OrderIn"}}
                },
            }
        },
    )
    async def create_order(request: Request, who: Customer, rt: Rt) -> Any:
        """Save the order and queue its coverage task; answer 202 with ``Location``."""
        key = request.headers.get("idempotency-key")
        if key is not None and not _IDEMPOTENCY_KEY.fullmatch(key):
            raise ApiError(
                400, "invalid_idempotency_key", "Idempotency-Key: 1-200 printable characters"
            )
        body = await read_order(request)
        order_id, task_id = order_ids(who, key)
        new = NewOrder(
            id=order_id,
            customer=who,
            idempotency_key=key,
            request_hash=request_hash(body),
            items=[i.model_dump() for i in body.items],
            task_id=task_id,
        )
        # The three-answer contract (H1-H3) comes from the enqueue; concurrent requests'
        # orders share one transaction and one enqueue_many (store.group_commit).
        created = await rt.store.create(new, enqueue)
        fields = {"order_id": order_id, "customer": who, "task_id": task_id}
        if created.existing is not None:
            existing = created.existing
            if existing.request_hash != new.request_hash:
                raise ApiError(
                    409,
                    "idempotency_key_reused",
                    "this Idempotency-Key was used for a different order",
                )
            log.info("order already accepted", extra=fields)
            answer = already_accepted(
                existing.task_id,
                location=f"/orders/{existing.id}",
                extra={"order_id": existing.id},
            )
            return to_response(answer)
        assert created.answer is not None
        status = created.answer.status_code
        level = logging.ERROR if status >= 500 else logging.INFO
        log.log(level, "order %s", created.answer.body.get("status", status), extra=fields)
        return to_response(created.answer)

    @api.get(
        "/orders/{order_id}",
        response_model=OrderOut,
        responses={
            401: _error("no or bad token"),
            404: _error("no such order (or not yours)"),
            422: _error("the request is not valid"),
        },
    )
    async def get_order(order_id: str, who: Customer, durq_app: Client, rt: Rt) -> Any:
        """The order, for its owner only; anyone else gets 404 (an id is not a password)."""
        order = (
            await rt.store.get_for_customer(order_id, who) if _ORDER_ID.match(order_id) else None
        )
        if order is None:
            raise ApiError(404, "not_found", "no such order")
        task_state = None
        with contextlib.suppress(durq.DurqError, TimeoutError):
            info = await durq_app.inspector.get_task_info(COVERAGE_QUEUE, order.task_id)
            task_state = info.state.value
        return order_out(order, task_state)

    @api.post(
        "/partner/callbacks/coverage",
        responses={
            200: {"description": "taken (delivered, or already delivered: sent twice)"},
            403: _error("no or a wrong signature, or callbacks not configured; nothing taken"),
            404: _error("no such order"),
            409: _error("the order's coverage task has ended: the callback changes nothing"),
            413: _error("the body is larger than the limit"),
            422: _error("not a decision the partner's contract allows"),
            503: _error("the task broker is unavailable; nothing taken, send again"),
        },
    )
    async def partner_callback(request: Request, durq_app: Client) -> Any:
        """The insurance partner's decision on an order, POSTed to the ``callback_url`` its
        coverage request carried: with a valid signature it becomes the signal the order's
        coverage task waits for (``durq.web.signal_answer``), so the order ends without
        waiting for the next poll. The partner may send it twice (one outcome) or never
        (the task polls); a callback after the task ended is answered 409."""
        raw = await read_body(request)
        # The signature first: nothing of an unauthenticated body is read or acted on.
        if not signed_by_partner(
            settings.partner_secret, raw, request.headers.get(SIGNATURE_HEADER)
        ):
            raise ApiError(403, "invalid_signature", f"{SIGNATURE_HEADER} is missing or wrong")
        try:
            callback = CoverageCallback.model_validate_json(raw)
            answer = partner_answer(callback)
        except (ValidationError, PartnerProtocolError) as exc:
            raise ApiError(422, "invalid_callback", f"not a coverage decision: {exc}") from None
        if not _ORDER_ID.fullmatch(callback.order_id):
            raise ApiError(404, "not_found", "no such order")
        task_id = coverage_task_id(callback.order_id)
        signalled = await signal_answer(
            durq_app, task_id, PARTNER_ANSWER, answer, queue=COVERAGE_QUEUE
        )
        outcome = signalled.body.get("status") or signalled.body["error"]["code"]
        fields = {
            "order_id": callback.order_id,
            "task_id": task_id,
            "status": signalled.status_code,
        }
        log.info("partner callback %s", outcome, extra=fields)
        return to_response(signalled)

    @api.get("/", include_in_schema=False)
    async def index(request: Request) -> Any:
        """Where to go from here: HTML for a browser, JSON for an API client."""
        body = service_index()
        if "text/html" in request.headers.get("accept", ""):
            return HTMLResponse(index_html(body))
        return JSONResponse(body)

    @api.get("/health", responses={503: {"description": "the broker is unavailable"}})
    async def health(request: Request) -> JSONResponse:
        """Cached broker probe (never a business call) and the partners' breaker states."""
        verdict, cached = await probe.check()
        runtime_: Runtime | None = getattr(request.app.state, "runtime", None)
        partners = {}
        if runtime_ is not None:
            partners = {
                s.name: {
                    "breaker": s.breaker.state,
                    "opened": s.breaker.opened,
                    "in_flight": s.bulkhead.in_use,
                }
                for s in runtime_.systems()
            }
        body = {
            "status": "ok" if verdict.ok else "unavailable",
            "broker": {"ok": verdict.ok, "error": verdict.error, "cached": cached},
            "mode": "monolith" if settings.monolith else "split",
            "partners": partners,
        }
        return JSONResponse(body, status_code=200 if verdict.ok else 503)

    # -- error answers -------------------------------------------------------------------------

    @api.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if isinstance(exc, ApiError):
            body = error_body(exc.code, str(exc.detail), exc.details)
        else:
            code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
            body = error_body(code, str(exc.detail))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @api.exception_handler(durq.BrokerUnavailableError)
    async def broker_unavailable(request: Request, exc: durq.BrokerUnavailableError) -> Any:
        # The orders database (or the broker) stayed busy beyond its budget: nothing was
        # saved, the client may retry (H3), never a 500 or a dropped connection.
        log.warning("answered 503: %s", exc, extra={"operation": exc.operation})
        return to_response(unavailable())

    @api.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        body = error_body("invalid_request", "the request is not valid", _validation_details(exc))
        return JSONResponse(body, status_code=422)

    def openapi() -> dict[str, Any]:
        """FastAPI's document, plus the order body's schemas (the body is read by hand,
        for its size limit, so FastAPI does not see the model)."""
        if api.openapi_schema is None:
            doc = get_openapi(
                title=api.title,
                version=api.version,
                description=api.description,
                routes=api.routes,
            )
            body = OrderIn.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(body.pop("$defs", {}))
            schemas["OrderIn"] = body
            api.openapi_schema = doc
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]
    return api
