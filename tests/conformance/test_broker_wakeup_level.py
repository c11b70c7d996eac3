"""W11, level-triggered: an enqueue that lands between a short claim and the next wait is not
lost; the wait returns at once instead of after its timeout (a full poll interval)."""

from __future__ import annotations

import asyncio
import time

from brokerkit import claim, params

from durq.brokers import FullBroker


async def test_W11_enqueue_between_claim_and_wait_is_not_lost(make_broker) -> None:
    waiter: FullBroker = await make_broker()
    client: FullBroker = await make_broker()
    for attempt in range(3):
        assert await claim(waiter, limit=5) == []  # a claim that came back short
        await client.enqueue(params(f"t{attempt}"))  # lands before the wait starts
        await asyncio.sleep(0.05)  # and its notification has been delivered by now
        started = time.monotonic()
        woken = await waiter.wait_for_work(["default"], timeout=5)
        assert woken and time.monotonic() - started < 1.0
        assert [lease.task.id for lease in await claim(waiter, limit=5)] == [f"t{attempt}"]
