"""A small, real partner simulator: the insurance partner and the warehouses, over HTTP.

The insurance partner works like a real one that answers later: it *accepts* a coverage request ("we are
checking, ask again later"), answers ``pending`` to the next ``pending_polls`` status calls,
then ``confirmed`` with a policy number. A request that carries a ``callback_url`` also gets
the decision POSTed there ``callback_delay`` seconds later, signed with the shared secret, as
insurers with callbacks do, including their faults: a callback may never come
(``callback_copies=0``) or come twice (``2``); one the service does not take (no answer, a
5xx) is sent again twice. Polling keeps working either way. Knobs (``PUT /_sim/config``):
latency, pending answers before success, error rate, an outage switch, warehouses that are
down, SKUs that are rejected, the callbacks'. It publishes its OpenAPI document at
``/openapi.json``, the callback included; the service's client (``partners.py``) is typed
against it, and ``tests/insurance/test_partner_contract.py`` keeps the two in step.

Run alone: ``uvicorn examples.insurance.partner_sim:create_app --factory --port 8100``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import json
import random
import ssl
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from fastapi import APIRouter, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

# -- the published contract (what the partner's OpenAPI document describes) ----------------


class CoverageItem(BaseModel):
    """One insured line."""

    sku: str
    qty: int


class CoverageRequest(BaseModel):
    """Ask the partner to cover an order; idempotent by ``order_id``. With a
    ``callback_url``, the decision is also POSTed there (:class:`CoverageCallback`)."""

    order_id: str
    items: list[CoverageItem]
    callback_url: str | None = None


class CoverageTicket(BaseModel):
    """The partner accepted the request and is checking it."""

    request_id: str
    status: Literal["pending"]


class CoverageStatus(BaseModel):
    """Where a coverage request stands."""

    request_id: str
    status: Literal["pending", "confirmed", "rejected"]
    policy_number: str | None = None
    reason: str | None = None


class CoverageCallback(BaseModel):
    """The decision on a request that carried a ``callback_url``, POSTed there with the
    header ``X-Partner-Signature: sha256=<hex HMAC-SHA256 of the body under the shared
    secret>``. It may come twice, or not at all: the status call stays the reference."""

    order_id: str
    request_id: str
    status: Literal["confirmed", "rejected"]
    policy_number: str | None = None
    reason: str | None = None


#: The callback's signature header.
SIGNATURE_HEADER = "X-Partner-Signature"


def sign(secret: str, body: bytes) -> str:
    """The signature header's value for ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class StockLevel(BaseModel):
    """How many units of a SKU one warehouse holds."""

    warehouse: str
    sku: str
    available: int


class PartnerError(BaseModel):
    """An error answer."""

    detail: str


# -- the knobs ----------------------------------------------------------------------------


class SimConfig(BaseModel):
    """The simulator's behaviour; change it at run time with ``PUT /_sim/config``."""

    model_config = ConfigDict(extra="forbid")

    latency: float = Field(
        default=0.0, ge=0, le=30, description="seconds added to every partner call"
    )
    pending_polls: int = Field(default=2, ge=0, description="status calls answered 'pending' first")
    error_rate: float = Field(default=0.0, ge=0, le=1, description="share of calls answered 500")
    outage: bool = Field(default=False, description="every insurance call answers 503")
    down_warehouses: list[str] = Field(default_factory=list)
    warehouse_latency: float = Field(default=0.0, ge=0, le=30)
    stock: int = Field(default=100, ge=0, description="units of every SKU in every warehouse")
    reject_skus: list[str] = Field(default_factory=list)
    callback_delay: float = Field(
        default=0.5,
        ge=0,
        le=60,
        description="seconds from accepting a request with a callback_url to POSTing the "
        "decision there; 0: before answering the request",
    )
    callback_copies: int = Field(
        default=1, ge=0, le=5, description="how often the decision is POSTed: 0 never, 2 twice"
    )
    callback_secret: str = Field(default="", description="the secret callbacks are signed with")
    seed: int | None = None


class SimStats(BaseModel):
    """What the simulator saw: calls, failures, concurrency (for bulkhead checks)."""

    calls: int
    failed: int
    in_flight: int
    max_in_flight: int
    requests: int
    #: The status code of every callback POST, in order (0: no answer).
    callbacks: list[int]


@dataclass
class _Request:
    id: str
    order_id: str
    items: list[CoverageItem]
    polls: int = 0
    #: The decision was called back: the status call gives it too, however few the polls.
    decided: bool = False


@dataclass
class _State:
    config: SimConfig = field(default_factory=lambda: SimConfig())
    requests: dict[str, _Request] = field(default_factory=dict)
    by_order: dict[str, str] = field(default_factory=dict)
    calls: int = 0
    failed: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    callbacks: list[int] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)
    #: Callbacks on their way (a reference each, so none is collected mid-flight).
    sending: set[asyncio.Task[None]] = field(default_factory=set)


WAREHOUSES = ("north", "south", "east")


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every callback: a new client would build its own, loading the CA
    bundle (25-35 ms of CPU on the event loop the service's requests share in `durq demo`)."""
    return httpx.create_ssl_context()


def create_app(config: SimConfig | None = None) -> FastAPI:
    """The simulator as an ASGI app (one state per app)."""
    initial = config or SimConfig()
    state = _State(config=initial)
    if state.config.seed is not None:
        state.rng.seed(state.config.seed)
    api = FastAPI(
        title="Insurance partner simulator",
        version="1.0.0",
        description="Coverage requests that stay pending for a while, and warehouse stock.",
    )
    api.state.sim = state

    async def partner_call(request: Request, *, warehouse: str | None = None) -> None:
        """Latency, outage and random errors, counted for the stats."""
        cfg = state.config
        state.calls += 1
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            delay = cfg.warehouse_latency if warehouse else cfg.latency
            if delay:
                await asyncio.sleep(delay)
            if warehouse is None and cfg.outage:
                state.failed += 1
                raise HTTPException(503, "insurance partner outage")
            if warehouse is not None and warehouse in cfg.down_warehouses:
                state.failed += 1
                raise HTTPException(503, f"warehouse {warehouse} is down")
            if cfg.error_rate and state.rng.random() < cfg.error_rate:
                state.failed += 1
                raise HTTPException(500, "random partner failure")
        finally:
            state.in_flight -= 1

    errors: dict[int | str, dict[str, Any]] = {
        500: {"model": PartnerError},
        503: {"model": PartnerError},
    }

    def decision(req: _Request) -> CoverageStatus:
        """Rejected if an item's SKU is in ``reject_skus``, else confirmed."""
        rejected = [i.sku for i in req.items if i.sku in state.config.reject_skus]
        if rejected:
            return CoverageStatus(
                request_id=req.id,
                status="rejected",
                reason=f"not insurable: {', '.join(rejected)}",
            )
        policy = "POL-" + hashlib.sha256(req.id.encode()).hexdigest()[:10].upper()
        return CoverageStatus(request_id=req.id, status="confirmed", policy_number=policy)

    async def call_back(req: _Request, url: str) -> None:
        """POST the decision to ``url`` ``callback_copies`` times; a copy the service does not
        take (no answer, 5xx) is tried twice more. The decision is made now, for good."""
        cfg = state.config
        req.decided = True
        made = decision(req)
        body = json.dumps(
            CoverageCallback(order_id=req.order_id, **made.model_dump()).model_dump()
        ).encode()
        headers = {"Content-Type": "application/json"}
        if cfg.callback_secret:
            headers[SIGNATURE_HEADER] = sign(cfg.callback_secret, body)
        async with httpx.AsyncClient(timeout=5.0, verify=_tls()) as client:
            for _ in range(cfg.callback_copies):
                for retry in range(3):
                    try:
                        status = (await client.post(url, content=body, headers=headers)).status_code
                    except httpx.HTTPError:
                        status = 0
                    state.callbacks.append(status)
                    if 0 < status < 500:
                        break
                    await asyncio.sleep(0.1 * 2**retry)

    async def call_back_later(req: _Request, url: str) -> None:
        await asyncio.sleep(state.config.callback_delay)
        await call_back(req, url)

    #: What the partner POSTs to a request's ``callback_url`` (published in the OpenAPI
    #: document with the request operation).
    callback = APIRouter()

    @callback.post("{$request.body#/callback_url}", status_code=200)
    def coverage_decided(
        body: CoverageCallback,
        x_partner_signature: str = Header(description="sha256=<hex HMAC-SHA256 of the body>"),
    ) -> None:
        """The decision on the request. Answer 2xx to take it; no answer or a 5xx is sent
        again; any other answer is final."""

    @api.post(
        "/v1/coverage",
        status_code=202,
        response_model=CoverageTicket,
        responses={**errors, 422: {"model": PartnerError}},
        callbacks=callback.routes,
        tags=["insurance"],
    )
    async def request_coverage(body: CoverageRequest, request: Request) -> CoverageTicket:
        """Accept a coverage request; the same ``order_id`` gives the same ticket. With a
        ``callback_url``, the decision is POSTed there too, once decided."""
        await partner_call(request)
        request_id = state.by_order.get(body.order_id)
        if request_id is None:
            request_id = "cov_" + hashlib.sha256(body.order_id.encode()).hexdigest()[:16]
            state.by_order[body.order_id] = request_id
            req = state.requests[request_id] = _Request(request_id, body.order_id, body.items)
            if body.callback_url and state.config.callback_delay == 0:
                await call_back(req, body.callback_url)  # decided at once, before the ticket
            elif body.callback_url:
                sending = asyncio.create_task(call_back_later(req, body.callback_url))
                state.sending.add(sending)
                sending.add_done_callback(state.sending.discard)
        return CoverageTicket(request_id=request_id, status="pending")

    @api.get(
        "/v1/coverage/{request_id}",
        response_model=CoverageStatus,
        responses={**errors, 404: {"model": PartnerError}},
        tags=["insurance"],
    )
    async def coverage_status(request_id: str, request: Request) -> CoverageStatus:
        """``pending`` for the first ``pending_polls`` calls, then the decision."""
        await partner_call(request)
        req = state.requests.get(request_id)
        if req is None:
            raise HTTPException(404, "unknown coverage request")
        req.polls += 1
        if req.polls <= state.config.pending_polls and not req.decided:
            return CoverageStatus(request_id=request_id, status="pending")
        return decision(req)

    @api.get(
        "/v1/warehouses/{warehouse}/stock",
        response_model=StockLevel,
        responses={**errors, 404: {"model": PartnerError}},
        tags=["warehouses"],
    )
    async def stock(
        warehouse: str, request: Request, sku: str = Query(..., max_length=64)
    ) -> StockLevel:
        """Units of ``sku`` in one warehouse."""
        if warehouse not in WAREHOUSES:
            raise HTTPException(404, "unknown warehouse")
        await partner_call(request, warehouse=warehouse)
        return StockLevel(warehouse=warehouse, sku=sku, available=state.config.stock)

    @api.get("/_sim/config", response_model=SimConfig, tags=["simulator"])
    async def get_config() -> SimConfig:
        """The current knobs."""
        return state.config

    @api.put("/_sim/config", response_model=SimConfig, tags=["simulator"])
    async def put_config(config: SimConfig) -> SimConfig:
        """Replace the knobs (takes effect for the next call)."""
        state.config = config
        if config.seed is not None:
            state.rng.seed(config.seed)
        return config

    @api.get("/_sim/stats", response_model=SimStats, tags=["simulator"])
    async def stats() -> SimStats:
        """Counters since start (or the last reset)."""
        return SimStats(
            calls=state.calls,
            failed=state.failed,
            in_flight=state.in_flight,
            max_in_flight=state.max_in_flight,
            requests=len(state.requests),
            callbacks=list(state.callbacks),
        )

    @api.post("/_sim/reset", response_model=SimStats, tags=["simulator"])
    async def reset(forget: bool = False) -> SimStats:
        """Zero the counters; with ``forget=true`` also restore the start-up knobs and drop
        every coverage request."""
        state.calls = state.failed = state.max_in_flight = 0
        state.callbacks.clear()
        if forget:
            for sending in list(state.sending):  # an earlier test's callbacks stay untold
                sending.cancel()
            state.config = initial
            state.requests.clear()
            state.by_order.clear()
            if initial.seed is not None:
                state.rng.seed(initial.seed)
        return await stats()

    @api.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    return api
