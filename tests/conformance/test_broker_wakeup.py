"""Wake-ups (W11): an idle worker learns of new work within milliseconds, not a ticker.

These use real time (an asyncio timeout) with generous bounds; spurious wake-ups are allowed
by the contract, so only "woken in time" is asserted, never "not woken"."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import pytest
from brokerkit import X, claim, params, put

from durq import lifecycle
from durq.brokers import FullBroker
from durq.brokers.base import CAP_CROSS_PROCESS_NOTIFY
from durq.clock import FakeClock

#: Far longer than any wake-up should take; the wait itself is asked for longer still.
BOUND = 2.0


async def woken_by(waiter: FullBroker, queues: list[str], action) -> tuple[bool, float]:
    """Start waiting, run ``action`` once the waiter is parked, return (woken, seconds)."""
    task = asyncio.create_task(waiter.wait_for_work(queues, timeout=30))
    await asyncio.sleep(0.05)  # let the waiter park (a wake-up before that is allowed too)
    start = time.monotonic()
    await action()
    woken = await asyncio.wait_for(task, BOUND)
    return woken, time.monotonic() - start


async def test_W11_enqueue_wakes_a_waiter_of_another_broker(make_broker, clock: FakeClock) -> None:
    waiter, client = await make_broker(), await make_broker()
    woken, took = await woken_by(waiter, ["default"], lambda: client.enqueue(params("t")))
    assert woken and took < BOUND


async def test_W11_enqueue_wakes_a_waiter_of_the_same_broker(broker: FullBroker) -> None:
    woken, took = await woken_by(broker, ["default"], lambda: broker.enqueue(params("t")))
    assert woken and took < BOUND


async def test_W11_bulk_enqueue_wakes(make_broker) -> None:
    waiter, client = await make_broker(), await make_broker()
    woken, _ = await woken_by(
        waiter, ["low", "default"], lambda: client.enqueue_many([params("a"), params("b")])
    )
    assert woken


async def test_W11_many_waiters_all_wake(make_broker) -> None:
    brokers = [await make_broker() for _ in range(3)]
    client = await make_broker()
    waits = [asyncio.create_task(b.wait_for_work(["default"], timeout=30)) for b in brokers]
    await asyncio.sleep(0.05)
    await client.enqueue(params("t"))
    assert await asyncio.wait_for(asyncio.gather(*waits), BOUND) == [True, True, True]


async def test_W11_wait_returns_by_its_timeout(broker: FullBroker) -> None:
    start = time.monotonic()
    await asyncio.wait_for(broker.wait_for_work(["default"], timeout=0.2), BOUND)
    assert time.monotonic() - start < BOUND


async def test_W11_requeue_and_run_wake(make_broker, clock: FakeClock) -> None:
    waiter, admin = await make_broker(), await make_broker()
    await put(admin, clock, {"x": X})
    woken, _ = await woken_by(
        waiter, ["default"], lambda: lifecycle.run_task(admin.admin, "default", "x")
    )
    assert woken
    (lease,) = await claim(admin)
    woken, _ = await woken_by(waiter, ["default"], lambda: admin.requeue(lease.ref))
    assert woken


_ENQUEUER = textwrap.dedent(
    """
    import asyncio, sys, json
    from durq.brokers import open_broker
    from durq.brokers.base import EnqueueParams

    async def main():
        broker = open_broker(sys.argv[1])
        await broker.connect()
        await broker.enqueue(EnqueueParams(id="from-child", queue="default", type="test:task",
                                           payload=b"{}"))
        await broker.close()

    asyncio.run(main())
    """
)


async def test_W11_enqueue_from_another_process_wakes(make_broker, broker_url: str) -> None:
    waiter = await make_broker()
    if CAP_CROSS_PROCESS_NOTIFY not in waiter.capabilities:
        pytest.skip(f"{waiter.name} lacks capability {CAP_CROSS_PROCESS_NOTIFY!r}")
    task = asyncio.create_task(waiter.wait_for_work(["default"], timeout=60))
    await asyncio.sleep(0.05)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _ENQUEUER, broker_url, stdout=subprocess.DEVNULL
    )
    assert await asyncio.wait_for(child.wait(), 30) == 0
    start = time.monotonic()
    assert await asyncio.wait_for(task, BOUND)
    assert time.monotonic() - start < BOUND


async def test_W11_unpause_wakes(make_broker, clock: FakeClock) -> None:
    # A paused queue's pending tasks become claimable when it is resumed: its idle workers
    # must learn it then, not at the end of their wait.
    waiter, other = await make_broker(), await make_broker()
    await other.enqueue(params("t"))
    await other.admin.pause_queue("default")
    for _ in range(10):  # settle: the enqueue's wake-up and any first-wait one are spent
        assert await claim(waiter) == []
        if not await waiter.wait_for_work(["default"], timeout=0.2):
            break
    woken, took = await woken_by(waiter, ["default"], lambda: other.admin.unpause_queue("default"))
    assert woken and took < BOUND
