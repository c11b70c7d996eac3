"""The Redis broker on uvloop's event loop (what uvicorn picks when uvloop is installed):
its transports are not ``asyncio.Transport`` subclasses, and the broker must not care."""

from __future__ import annotations

import pytest

from durq.brokers import open_broker
from durq.brokers.base import ClaimParams, EnqueueParams

uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed (the web extra has it)")


def test_enqueue_and_claim_on_uvloop(redis_url: str) -> None:
    async def run() -> list[str]:
        broker = open_broker(redis_url)
        try:
            await broker.migrate()
            await broker.enqueue(EnqueueParams(queue="q", type="t", payload=b"{}", id="on-uvloop"))
            await broker.promote_due()
            leases = await broker.claim(ClaimParams(["q"], 1, "w1", 30.0))
            return [lease.task.id for lease in leases]
        finally:
            await broker.close()

    assert uvloop.run(run()) == ["on-uvloop"]
