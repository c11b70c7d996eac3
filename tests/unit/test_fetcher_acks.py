"""A busy worker's acks ride in its next claim (one round trip instead of two), and still it
never holds more unacknowledged leases than slots: the re-run bound of docs/guarantees.md."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import durq
from durq.brokers.base import ClaimParams, CompleteParams, FullBroker, Lease
from durq.worker.executor import Executor
from durq.worker.fetcher import Fetcher


class CountingBroker:
    """A memory broker that counts round trips and the leases held without an ack."""

    def __init__(self, inner: FullBroker) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self.unacked = 0
        self.most_unacked = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _leased(self, leases: list[Lease]) -> None:
        self.unacked += len(leases)
        self.most_unacked = max(self.most_unacked, self.unacked)

    async def claim(self, params: ClaimParams) -> list[Lease]:
        self.calls.append("claim")
        leases = await self.inner.claim(params)
        self._leased(leases)
        return leases

    async def complete_many(self, items: Sequence[CompleteParams]) -> list[bool]:
        self.calls.append("complete_many")
        done = await self.inner.complete_many(items)
        self.unacked -= sum(done)
        return done

    async def complete_and_claim(
        self, items: Sequence[CompleteParams], claim: ClaimParams
    ) -> tuple[list[bool], list[Lease]]:
        self.calls.append("complete_and_claim")
        done, leases = await self.inner.complete_and_claim(items, claim)
        self.unacked -= sum(done)  # stored before the claim
        self._leased(leases)
        return done, leases


async def test_acks_ride_in_the_next_claim_within_the_slots() -> None:
    app = durq.App("memory://fetcher-acks")
    finished = asyncio.Event()
    ran: list[int] = []

    @app.task("t:noop")
    async def noop(payload: dict[str, Any]) -> None:
        ran.append(payload["n"])
        if len(ran) == 40:
            finished.set()

    for n in range(40):
        await app.enqueue("t:noop", {"n": n})
    broker = CountingBroker(app.new_broker())
    await broker.connect()
    executor = Executor(app, broker, concurrency=4, worker_id="w", hooks=[])  # type: ignore[arg-type]
    fetcher = Fetcher(
        broker,  # type: ignore[arg-type]
        executor,
        queues={"default": 1},
        strict=True,
        worker_id="w",
        lease_seconds=30,
        poll_interval=0.05,
    )
    fetcher.start()
    await asyncio.wait_for(finished.wait(), 10)
    await asyncio.wait_for(executor.drain(None), 10)
    await fetcher.stop()
    for _ in range(5):  # the last acks go out on their own once the fetcher idles
        await asyncio.sleep(0.01)
    assert sorted(ran) == list(range(40))
    assert broker.most_unacked <= 4
    assert broker.unacked == 0
    # 40 tasks in batches of 4: the acks of one batch travel with the claim of the next.
    assert broker.calls.count("complete_and_claim") >= 9, broker.calls
    assert len(broker.calls) <= 14, broker.calls
    await executor.close()
    await broker.close()
