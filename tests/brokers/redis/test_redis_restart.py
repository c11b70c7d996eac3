"""Opt-in (DURQ_TEST_REDIS_RESTART=1): a Redis restart with AOF ``appendfsync everysec``.

A throw-away redis-server on port 6390 (never the shared one) is killed with SIGKILL while a
worker holds leases and waits for work, then started again on the same data directory:

* every enqueue acknowledged more than a second before the crash is still there;
* during the outage calls raise BrokerUnavailableError promptly, never hang;
* after the restart the very next call works (the pool reconnects), held leases can still be
  completed with their fencing tokens, and the wake-up subscription comes back.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from durq.brokers.base import ClaimParams, CompleteParams, EnqueueParams
from durq.brokers.redis import RedisBroker
from durq.errors import BrokerUnavailableError
from durq.states import TaskState

pytestmark = pytest.mark.skipif(
    os.environ.get("DURQ_TEST_REDIS_RESTART") != "1",
    reason="opt-in: set DURQ_TEST_REDIS_RESTART=1 (starts its own redis-server on 6390)",
)
PORT = 6390
N = 500


def task(i: int) -> EnqueueParams:
    return EnqueueParams(id=f"t{i}", queue="default", type="test:task", payload=b'{"i":1}')


def claim_params(limit: int) -> ClaimParams:
    return ClaimParams(queues=["default"], limit=limit, worker_id="w1", lease_seconds=60)


async def test_restart_with_aof_everysec_loses_no_acknowledged_enqueue(private_redis) -> None:
    server = private_redis("--appendonly", "yes", "--appendfsync", "everysec", port=PORT)
    client = RedisBroker.from_url(f"{server.url}?prefix=restart")
    worker = RedisBroker.from_url(f"{server.url}?prefix=restart")
    try:
        await client.migrate()
        outcomes = await client.enqueue_many([task(i) for i in range(N - 10)])
        assert all(o.created for o in outcomes)
        for i in range(N - 10, N):
            await client.enqueue(task(i))
        leases = await worker.claim(claim_params(5))
        assert len(leases) == 5
        await asyncio.sleep(1.5)  # everysec: what was acknowledged a second ago is on disk

        server.kill()
        start = time.monotonic()
        with pytest.raises(BrokerUnavailableError) as err:
            await client.enqueue(task(N + 1))
        assert err.value.operation == "redis.enqueue"
        with pytest.raises(BrokerUnavailableError):
            await worker.claim(claim_params(1))
        outage_errors_took = time.monotonic() - start
        assert outage_errors_took < 4.0
        # A waiting worker falls back to its timeout while the server is down.
        assert await worker.wait_for_work(["default"], timeout=0.3) in (True, False)

        server.start()
        started = time.monotonic()
        stats = await client.admin.queue_stats("default")  # the very next call works
        assert stats.sizes[TaskState.PENDING] + stats.sizes[TaskState.ACTIVE] == N
        assert stats.sizes[TaskState.ACTIVE] == 5
        assert await worker.complete_many([CompleteParams(x.ref) for x in leases]) == [True] * 5
        reconnect_took = time.monotonic() - started

        # The wake-up subscription is back: a claim-then-wait is woken by a new enqueue.
        deadline = time.monotonic() + 5
        while await worker.wait_for_work(["default"], timeout=0.5):
            assert time.monotonic() < deadline  # only the one wake-up after resubscribing
            await worker.claim(claim_params(0))
        waiting = asyncio.create_task(worker.wait_for_work(["default"], timeout=5))
        await asyncio.sleep(0.05)
        await client.enqueue(task(N + 2))
        woke = time.monotonic()
        assert await waiting
        assert time.monotonic() - woke < 0.5
        print(
            f"\nrestart: {N} acknowledged enqueues survived; outage errors in "
            f"{outage_errors_took:.2f}s; first calls after restart in {reconnect_took:.2f}s"
        )
    finally:
        await client.close()
        await worker.close()
