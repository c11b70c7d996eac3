"""A small, real partner simulator: the insurance partner and the warehouses, over HTTP.

The insurance partner works like a real one that answers later: it *accepts* a coverage request ("we are
checking, ask again later"), answers ``pending`` to the next ``pending_polls`` status calls,
then ``confirmed`` with a policy number. Knobs (``PUT /_sim/config``): latency, pending
answers before success, error rate, an outage switch, warehouses that are down, SKUs that are
rejected. It publishes its OpenAPI document at ``/openapi.json``; the service's client
(``partners.py``) is typed against it, and ``tests/insurance/test_partner_contract.py`` keeps
the two in step.

Run alone: ``uvicorn examples.insurance.partner_sim:create_app --factory --port 8100``.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

# -- the published contract (what the partner's OpenAPI document describes) ----------------


class CoverageItem(BaseModel):
    """One insured line."""

    sku: str
    qty: int


class CoverageRequest(BaseModel):
    """Ask the partner to cover an order; idempotent by ``order_id``."""

    order_id: str
    items: list[CoverageItem]


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
    seed: int | None = None


class SimStats(BaseModel):
    """What the simulator saw: calls, failures, concurrency (for bulkhead checks)."""

    calls: int
    failed: int
    in_flight: int
    max_in_flight: int
    requests: int


@dataclass
class _Request:
    id: str
    items: list[CoverageItem]
    polls: int = 0


@dataclass
class _State:
    config: SimConfig = field(default_factory=lambda: SimConfig())
    requests: dict[str, _Request] = field(default_factory=dict)
    by_order: dict[str, str] = field(default_factory=dict)
    calls: int = 0
    failed: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    rng: random.Random = field(default_factory=random.Random)


WAREHOUSES = ("north", "south", "east")


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

    @api.post(
        "/v1/coverage",
        status_code=202,
        response_model=CoverageTicket,
        responses={**errors, 422: {"model": PartnerError}},
        tags=["insurance"],
    )
    async def request_coverage(body: CoverageRequest, request: Request) -> CoverageTicket:
        """Accept a coverage request; the same ``order_id`` gives the same ticket."""
        await partner_call(request)
        request_id = state.by_order.get(body.order_id)
        if request_id is None:
            request_id = "cov_" + hashlib.sha256(body.order_id.encode()).hexdigest()[:16]
            state.by_order[body.order_id] = request_id
            state.requests[request_id] = _Request(request_id, body.items)
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
        if req.polls <= state.config.pending_polls:
            return CoverageStatus(request_id=request_id, status="pending")
        rejected = [i.sku for i in req.items if i.sku in state.config.reject_skus]
        if rejected:
            return CoverageStatus(
                request_id=request_id,
                status="rejected",
                reason=f"not insurable: {', '.join(rejected)}",
            )
        policy = "POL-" + hashlib.sha256(request_id.encode()).hexdigest()[:10].upper()
        return CoverageStatus(request_id=request_id, status="confirmed", policy_number=policy)

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
        )

    @api.post("/_sim/reset", response_model=SimStats, tags=["simulator"])
    async def reset(forget: bool = False) -> SimStats:
        """Zero the counters; with ``forget=true`` also restore the start-up knobs and drop
        every coverage request."""
        state.calls = state.failed = state.max_in_flight = 0
        if forget:
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
