"""Typed clients for the partner systems: the insurance partner and the warehouses.

* The models below are the client's binding of the partner's OpenAPI document (the
  simulator publishes it at ``/openapi.json``); ``tests/insurance/test_partner_contract.py``
  checks every model here against the published schema, so a drift fails a test.
* One ``httpx.AsyncClient`` per partner system (per-system isolation), each with its own
  circuit breaker and bulkhead; every call has its own deadline.
* The warehouse fan-out runs under one overall deadline and its error names the systems that
  did not answer.
* The partner's callback (its decision, POSTed to the URL a coverage request carried) is
  bound here too, with the check of its signature.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ValidationError

from .resilience import (
    Bulkhead,
    CircuitBreaker,
    SystemUnavailableError,
)

log = logging.getLogger("insurance.partners")

# -- the partner's contract, as the client binds it ----------------------------------------


class CoverageItem(BaseModel):
    sku: str
    qty: int


class CoverageRequest(BaseModel):
    order_id: str
    items: list[CoverageItem]
    callback_url: str | None = None


class CoverageTicket(BaseModel):
    request_id: str
    status: Literal["pending"]


class CoverageStatus(BaseModel):
    request_id: str
    status: Literal["pending", "confirmed", "rejected"]
    policy_number: str | None = None
    reason: str | None = None


class CoverageCallback(BaseModel):
    order_id: str
    request_id: str
    status: Literal["confirmed", "rejected"]
    policy_number: str | None = None
    reason: str | None = None


class StockLevel(BaseModel):
    warehouse: str
    sku: str
    available: int


#: Model name -> (method, path, role): what ``test_partner_contract`` compares.
CONTRACT: dict[str, type[BaseModel]] = {
    "CoverageItem": CoverageItem,
    "CoverageRequest": CoverageRequest,
    "CoverageTicket": CoverageTicket,
    "CoverageStatus": CoverageStatus,
    "CoverageCallback": CoverageCallback,
    "StockLevel": StockLevel,
}
#: Operations the client calls: (method, path) -> (request model, response model, status).
OPERATIONS: dict[tuple[str, str], tuple[str | None, str, int]] = {
    ("post", "/v1/coverage"): ("CoverageRequest", "CoverageTicket", 202),
    ("get", "/v1/coverage/{request_id}"): (None, "CoverageStatus", 200),
    ("get", "/v1/warehouses/{warehouse}/stock"): (None, "StockLevel", 200),
}


#: The header that carries the callback's signature.
SIGNATURE_HEADER = "X-Partner-Signature"


def signed_by_partner(secret: str, body: bytes, signature: str | None) -> bool:
    """Whether ``signature`` is ``sha256=`` and the hex HMAC-SHA256 of ``body`` under the
    secret shared with the partner (compared in constant time). No secret: nothing is."""
    if not secret or not signature:
        return False
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), signature.strip().encode())


class PartnerProtocolError(Exception):
    """The partner answered something outside its contract (a 4xx or a malformed body):
    retrying the same request will not help."""


# -- one system ------------------------------------------------------------------------------


class PartnerSystem:
    """One external system: its own HTTP client, breaker and bulkhead."""

    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        call_timeout: float,
        breaker: CircuitBreaker,
        bulkhead: Bulkhead,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.name = name
        self.call_timeout = call_timeout
        self.breaker = breaker
        self.bulkhead = bulkhead
        # Connect gets its own shorter bound: a dead host should fail well before the read.
        timeout = httpx.Timeout(call_timeout, connect=min(call_timeout, 2.0))
        self.client = httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout,
            transport=transport,
            headers={"User-Agent": "insurance-service/1.0"},
            limits=httpx.Limits(max_connections=bulkhead.limit),
        )

    async def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call under breaker, bulkhead and the per-call deadline.

        5xx, timeouts and transport errors count as failures of the system; a 4xx does not
        (the system answered, the request was wrong)."""
        self.breaker.before_call()
        verdict = False
        try:
            # The deadline covers waiting for a bulkhead slot too.
            async with asyncio.timeout(self.call_timeout), self.bulkhead:
                response = await self.client.request(method, path, **kwargs)
        except TimeoutError:
            self.breaker.failure()
            verdict = True
            raise SystemUnavailableError(
                self.name, f"no answer within {self.call_timeout:g}s"
            ) from None
        except httpx.TransportError as exc:
            self.breaker.failure()
            verdict = True
            raise SystemUnavailableError(self.name, f"{type(exc).__name__}: {exc}") from exc
        finally:
            if not verdict:
                self.breaker.release_probe()
        if response.status_code >= 500:
            self.breaker.failure()
            raise SystemUnavailableError(self.name, f"HTTP {response.status_code}")
        self.breaker.success()
        return response

    async def aclose(self) -> None:
        await self.client.aclose()


def parse(model: type[BaseModel], response: httpx.Response, system: str) -> Any:
    """The body as ``model``; a 4xx or a body outside the contract is a protocol error."""
    if response.status_code >= 400:
        raise PartnerProtocolError(f"{system}: HTTP {response.status_code}: {response.text[:200]}")
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise PartnerProtocolError(f"{system}: answer outside the contract: {exc}") from exc


class InsurancePartner:
    """The insurance partner's API: request coverage, then poll its status."""

    def __init__(self, system: PartnerSystem) -> None:
        self.system = system

    async def request_coverage(
        self, order_id: str, items: Sequence[CoverageItem], callback_url: str | None = None
    ) -> str:
        """Submit (idempotent by ``order_id`` at the partner); returns the request id. With a
        ``callback_url`` the partner also POSTs its decision there."""
        body = CoverageRequest(order_id=order_id, items=list(items), callback_url=callback_url)
        payload = body.model_dump(exclude_none=True)
        response = await self.system.call("POST", "/v1/coverage", json=payload)
        ticket: CoverageTicket = parse(CoverageTicket, response, self.system.name)
        return ticket.request_id

    async def coverage_status(self, request_id: str) -> CoverageStatus:
        """One status call (pending / confirmed / rejected)."""
        response = await self.system.call("GET", f"/v1/coverage/{request_id}")
        status: CoverageStatus = parse(CoverageStatus, response, self.system.name)
        return status


class Warehouses:
    """The warehouse systems, each its own :class:`PartnerSystem`."""

    def __init__(self, systems: Mapping[str, PartnerSystem], *, fanout_timeout: float) -> None:
        self.systems = dict(systems)
        self.fanout_timeout = fanout_timeout

    async def _stock(self, name: str, sku: str) -> StockLevel:
        system = self.systems[name]
        path = f"/v1/warehouses/{name}/stock"
        response = await system.call("GET", path, params={"sku": sku})
        level: StockLevel = parse(StockLevel, response, system.name)
        return level

    async def availability(self, skus: Sequence[str]) -> dict[str, int]:
        """Units per SKU across every warehouse, asked concurrently under one deadline.

        Raises :class:`SystemUnavailableError` naming the warehouse(s) that failed or did
        not answer in time; no call outlives the deadline."""
        if not self.systems:
            return {}
        pending: dict[asyncio.Task[StockLevel], str] = {}
        try:
            async with asyncio.timeout(self.fanout_timeout), asyncio.TaskGroup() as group:
                for name in self.systems:
                    for sku in dict.fromkeys(skus):
                        task = group.create_task(self._stock(name, sku))
                        pending[task] = self.systems[name].name
        except TimeoutError:
            slow = {s for t, s in pending.items() if not t.done() or t.cancelled()}
            raise SystemUnavailableError(
                sorted(slow), f"no answer within the {self.fanout_timeout:g}s fan-out deadline"
            ) from None
        except ExceptionGroup as group_error:
            raise _merge(group_error) from None
        totals: dict[str, int] = {}
        for task in pending:
            level = task.result()
            totals[level.sku] = totals.get(level.sku, 0) + level.available
        return totals

    async def aclose(self) -> None:
        for system in self.systems.values():
            await system.aclose()


def _merge(group_error: BaseExceptionGroup[Any]) -> Exception:
    """One error from a failed fan-out: the unavailable systems, all named."""
    errors = [e for e in _flatten(group_error) if isinstance(e, Exception)]
    unavailable = [e for e in errors if isinstance(e, SystemUnavailableError)]
    if not unavailable:
        return errors[0] if errors else RuntimeError("fan-out failed")
    systems = sorted({s for e in unavailable for s in e.systems})
    return SystemUnavailableError(systems, unavailable[0].reason)


def _flatten(group_error: BaseExceptionGroup[Any]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group_error.exceptions:
        out.extend(_flatten(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out
