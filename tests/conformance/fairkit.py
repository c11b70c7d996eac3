"""The backlog scenario of fair limits (W22): tenant A enqueues a long backlog, then tenants
B..K one task each; claims then run and each tenant's start is measured in claims (its place
in the order tasks started) and in wall time from its enqueue. With ``fair=True`` each of
B..K starts within one round (one task of each tenant with work waiting); without it they
wait behind the whole backlog."""

from __future__ import annotations

import json
import math
import string
import time
from dataclasses import dataclass

import durq
from durq.brokers import open_broker
from durq.brokers.base import ClaimParams, EnqueueParams
from durq.limits import resolve_all

QUEUE = "tenants"


@dataclass
class Starts:
    """Where each late tenant's task started: its place among all starts (1 = first) and
    the seconds from its enqueue to the claim that took it."""

    backlog: int
    places: dict[str, int]
    waits: dict[str, float]
    claims: int

    def p99(self, values: list[float]) -> float:
        ordered = sorted(values)
        return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]

    def line(self, kind: str, fair: bool) -> str:
        places = [float(p) for p in self.places.values()]
        return (
            f"[fair backlog] {kind} fair={fair} backlog={self.backlog}: start place p99 "
            f"{self.p99(places):.0f} (max {max(places):.0f}), wait p99 "
            f"{self.p99(list(self.waits.values())) * 1000:.1f} ms, {self.claims} claims"
        )


def _task(limit: durq.Limit, tenant: str, n: int) -> EnqueueParams:
    payload = {"tenant": tenant, "n": n}
    return EnqueueParams(
        id=f"{tenant}-{n}",
        queue=QUEUE,
        type="fair:job",
        payload=json.dumps(payload).encode(),
        limits=resolve_all((limit,), payload),
    )


async def late_tenant_starts(
    url: str, *, backlog: int, tenants: int = 10, fair: bool, per_claim: int = 1
) -> Starts:
    """Run the scenario on a fresh broker at ``url``; claims of ``per_claim`` tasks until
    every late tenant started (or the backlog ran out)."""
    limit = durq.Limit("tenant:{tenant}", concurrency=backlog + tenants, fair=fair)
    late = [c * 2 for c in string.ascii_uppercase[1 : tenants + 1]]  # "BB", "CC"...
    broker = open_broker(url)
    await broker.migrate()
    await broker.connect()
    try:
        for first in range(0, backlog, 1000):
            batch = range(first, min(backlog, first + 1000))
            await broker.enqueue_many([_task(limit, "AA", n) for n in batch])
        enqueued: dict[str, float] = {}
        for tenant in late:
            await broker.enqueue(_task(limit, tenant, 0))
            enqueued[tenant] = time.monotonic()
        places: dict[str, int] = {}
        waits: dict[str, float] = {}
        started = claims = 0
        params = ClaimParams(queues=[QUEUE], limit=per_claim, worker_id="w", lease_seconds=600)
        while len(places) < len(late):
            leases = await broker.claim(params)
            claims += 1
            at = time.monotonic()
            if not leases:
                break
            for lease in leases:
                started += 1
                tenant = lease.task.id.split("-")[0]
                if tenant in enqueued and tenant not in places:
                    places[tenant] = started
                    waits[tenant] = at - enqueued[tenant]
        return Starts(backlog, places, waits, claims)
    finally:
        await broker.close()


async def check_late_tenants(
    url: str, kind: str, *, backlog: int, tenants: int = 10, fair: bool
) -> Starts:
    """The scenario, its figures printed: with ``fair`` every late tenant starts within one
    round (one start of each tenant), without it each starts after the whole backlog."""
    per_claim = 1 if fair else max(1, min(1000, backlog // 8))
    starts = await late_tenant_starts(
        url, backlog=backlog, tenants=tenants, fair=fair, per_claim=per_claim
    )
    print("\n" + starts.line(kind, fair=fair))
    assert len(starts.places) == tenants, starts.places
    if fair:
        assert max(starts.places.values()) <= tenants + 1, starts.places
    else:
        assert min(starts.places.values()) > backlog, starts.places
    return starts
