"""A burst of orders on the embedded SQLite default: concurrent writers (requests, the worker
in the API process or in another process) take turns for the write lock; none gets a 5xx or
a dropped connection, and a lock held beyond the budget is a 503 with Retry-After."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections import Counter
from typing import Any

import httpx
import pytest
from examples.insurance.config import Settings
from examples.insurance.store import sqlite_path

from insurance.kit import ALICE, ITEMS, Service, counts, wait_for

#: More concurrent requests than the default thread pool has threads (the old deadlock).
CONCURRENCY = 16
ORDERS = 48


async def post_burst(url: str, prefix: str) -> tuple[Counter[Any], list[str]]:
    """``ORDERS`` orders with distinct Idempotency-Keys at ``CONCURRENCY``: the status codes
    (or the transport error's class) and the Locations of the accepted ones."""
    outcomes: Counter[Any] = Counter()
    locations: list[str] = []
    gate = asyncio.Semaphore(CONCURRENCY)
    headers = {"Authorization": f"Bearer {ALICE}"}
    limits = httpx.Limits(max_connections=CONCURRENCY)

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits) as c:

        async def one(i: int) -> None:
            async with gate:
                try:
                    r = await c.post(
                        "/orders", json=ITEMS, headers={"Idempotency-Key": f"{prefix}{i}"}
                    )
                except httpx.TransportError as exc:  # a dropped connection
                    outcomes[type(exc).__name__] += 1
                    return
                outcomes[r.status_code] += 1
                if r.status_code == 202:
                    locations.append(r.headers["Location"])

        await asyncio.gather(*(one(i) for i in range(ORDERS)))
    return outcomes, locations


def all_final(service: Service, locations: list[str]) -> bool:
    return all(service.order(loc)["status"] in ("COVERED", "FAILED") for loc in locations)


@pytest.mark.parametrize("mode", ["monolith", "split"])
def test_a_burst_of_orders_on_sqlite_gets_no_5xx_and_no_dropped_connection(
    start_service: Any, settings: Settings, split_worker: Any, mode: str
) -> None:
    settings = settings.with_(monolith=mode == "monolith")
    service: Service = start_service(settings)
    if mode == "split":  # a second process writes the same file
        split_worker([sys.executable, "-m", "examples.insurance.worker"], settings)
    outcomes, locations = asyncio.run(post_burst(service.url, f"burst-{mode}-"))
    assert outcomes == Counter({202: ORDERS})
    wait_for(lambda: all_final(service, locations), timeout=60, interval=0.2)
    assert {service.order(loc)["status"] for loc in locations} == {"COVERED"}
    assert counts(service) == (ORDERS, ORDERS)


def test_a_write_lock_held_beyond_the_budget_is_503_with_retry_after(
    start_service: Any, settings: Settings
) -> None:
    service: Service = start_service(settings.with_(lock_budget=0.3, monolith=False))
    other = sqlite3.connect(sqlite_path(settings.database_url), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        busy = service.alice.post("/orders", json=ITEMS, headers={"Idempotency-Key": "held"})
        assert busy.status_code == 503
        assert int(busy.headers["Retry-After"]) > 0
        assert busy.json()["error"]["code"] == "broker_unavailable"
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert counts(service) == (0, 0)  # nothing was saved
    again = service.alice.post("/orders", json=ITEMS, headers={"Idempotency-Key": "held"})
    assert again.status_code == 202
    assert counts(service) == (1, 1)
