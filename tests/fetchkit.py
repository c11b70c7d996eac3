"""A fetcher on a real broker, with its round trips counted (importable from any test
package): which calls a worker's claims and acks take."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import durq
from durq.brokers.base import ClaimParams, CompleteAndClaim, CompleteParams, FullBroker, Lease
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
        done, leases = await cast(CompleteAndClaim, self.inner).complete_and_claim(items, claim)
        self.unacked -= sum(done)  # stored before the claim
        self._leased(leases)
        return done, leases


async def fetcher_on(
    app: durq.App, broker: CountingBroker, *, concurrency: int, poll_interval: float
) -> tuple[Executor, Fetcher]:
    """A started fetcher of the ``default`` queue on ``broker``, and its executor."""
    await broker.connect()
    executor = Executor(app, broker, concurrency=concurrency, worker_id="w", hooks=[])  # type: ignore[arg-type]
    fetcher = Fetcher(
        broker,  # type: ignore[arg-type]
        executor,
        queues={"default": 1},
        strict=True,
        worker_id="w",
        lease_seconds=30,
        poll_interval=poll_interval,
    )
    fetcher.start()
    return executor, fetcher


async def run_fetcher(
    app: durq.App, broker: CountingBroker, finished: asyncio.Event, *, poll_interval: float
) -> Executor:
    """Run a fetcher with 4 slots on ``broker`` until ``finished``, then drain and stop it."""
    executor, fetcher = await fetcher_on(app, broker, concurrency=4, poll_interval=poll_interval)
    await asyncio.wait_for(finished.wait(), 10)
    await asyncio.wait_for(executor.drain(None), 10)
    await fetcher.stop()
    return executor


async def enqueue_counted(
    app: durq.App, n: int, *, seconds: float = 0.0, **options: Any
) -> tuple[list[int], asyncio.Event]:
    """Register ``t:counted`` on ``app`` (``options`` as for ``app.task``; each run takes
    ``seconds``) and enqueue ``n`` of them: the numbers run, in order of their ends, and an
    event set when all ``n`` have run."""
    ran: list[int] = []
    done = asyncio.Event()

    @app.task("t:counted", **options)
    async def counted(payload: dict[str, Any]) -> None:
        if seconds:
            await asyncio.sleep(seconds)
        ran.append(payload["n"])
        if len(ran) == n:
            done.set()

    for i in range(n):
        await app.enqueue("t:counted", {"n": i})
    return ran, done


async def assert_acks_hand_a_limited_slot_on(url: str) -> None:
    """Five tasks on a key of concurrency 1, a worker of four slots with a long poll: the
    acks ride in the claims that take the next tasks, so the acks themselves start the held
    tasks long before the poll would. On a loaded machine the first task may end while the
    worker's second claim is still on the wire; its ack then goes alone, once."""
    app = durq.App(url)
    ran, done = await enqueue_counted(
        app, 5, limit=durq.Limit("partner", concurrency=1), seconds=0.01
    )
    broker = CountingBroker(app.new_broker())
    executor = await run_fetcher(app, broker, done, poll_interval=30)
    assert ran == list(range(5))
    assert broker.calls[:-1].count("complete_many") <= 1, broker.calls
    assert broker.calls.count("complete_and_claim") >= 3, broker.calls
    await executor.close()
    await broker.close()
    await app.close()
