"""A worker process's connections: one broker for the worker, its handlers and the app.

The count test reads the real server (PostgreSQL ``pg_stat_activity`` by ``application_name``,
Redis ``CLIENT LIST`` by ``client_name``); the numbers per process are in docs/deployment.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest

import durq
from conformance.apps import FAST, hang_report, wait_until
from servers import PG_DSN, REDIS_URL, unique_name

#: Pool size of the PostgreSQL worker under test: its budget is this plus one listener.
POOL_MAX = 2


async def test_handlers_enqueue_through_the_worker_broker(app: durq.App) -> None:
    seen: list[object] = []

    @app.task("conn:leaf")
    async def leaf(payload: dict[str, Any]) -> None:
        return None

    @app.task("conn:fan")
    async def fan(payload: dict[str, Any]) -> None:
        seen.append(await app.broker())
        await leaf.enqueue({})

    worker = app.worker(**FAST)
    async with worker:
        await fan.enqueue({})
        await wait_until(lambda: _true(len(seen) == 1))
        assert seen[0] is worker.broker
    # Stopped: the app no longer hands out the worker's (closed) broker.
    assert await app.broker() is not worker.broker


async def _true(value: bool) -> bool:
    return value


class ServerConnections:
    """Counts the server connections named ``tag``, sampling the peak in the background."""

    def __init__(self, kind: str, tag: str, url: str = "") -> None:
        self.kind, self.tag, self.url = kind, tag, url
        self.peak = 0
        self._clients: list[Any] = []

    async def count(self) -> int:
        if self.kind == "postgres":
            import psycopg

            async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    (self.tag,),
                )
                row = await cur.fetchone()
                return int(row[0]) if row else 0
        import redis.asyncio as aioredis

        if not self._clients:  # kept while sampling: no new connection every 50 ms
            self._clients = [
                aioredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
                for url in self.redis_urls
            ]
        total = 0
        for client in self._clients:
            total += sum(1 for c in await client.client_list() if c.get("name") == self.tag)
        return total

    @property
    def redis_urls(self) -> list[str]:
        """The shared Redis, or every node of the cluster (its URL lists them all)."""
        if self.kind != "redis-cluster":
            return [REDIS_URL]
        nodes = urlsplit(self.url).netloc.split(",")
        return [f"redis://{node}/0" for node in nodes]

    @contextlib.asynccontextmanager
    async def sampling(self) -> AsyncIterator[None]:
        async def sample() -> None:
            while True:
                self.peak = max(self.peak, await self.count())
                await asyncio.sleep(0.05)

        sampler = asyncio.create_task(sample())
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            self.peak = max(self.peak, await self.count())
            for client in self._clients:
                await client.aclose()


async def test_worker_process_connections_on_the_server(broker_kind: str, broker_url: str) -> None:
    if broker_kind not in ("postgres", "redis", "redis-cluster"):
        pytest.skip(f"{broker_kind}: no server connections to count")
    tag = unique_name("durqconn")
    if broker_kind == "postgres":
        url = f"{broker_url}&application_name={tag}&pool_max={POOL_MAX}"
        budget = POOL_MAX + 1  # the pool and the LISTEN connection
    elif broker_kind == "redis":
        url = f"{broker_url}&client_name={tag}"
        budget = 2  # commands, and the connection its idle wait blocks on
    else:
        url = f"{broker_url}&client_name={tag}"
        budget = 3 + 1  # one per master (3) and the wake-up subscription
    producer = durq.App(broker_url)  # another process's connections: not named ``tag``
    await producer.new_broker().migrate()
    app = durq.App(url)
    done: list[str] = []

    @app.task("conn:leaf", queue="conn")
    async def leaf(payload: dict[str, Any]) -> None:
        done.append("leaf")

    @app.task("conn:fan", queue="conn")
    async def fan(payload: dict[str, Any]) -> None:
        await asyncio.sleep(0.05)  # overlap the handlers, so their enqueues are concurrent
        await leaf.enqueue({})

    counter = ServerConnections(broker_kind, tag, broker_url)
    try:
        # Once hung past pytest's timeout on a loaded machine (Redis Cluster): say where.
        async with (
            hang_report(90),
            counter.sampling(),
            app.worker(queues=["conn"], concurrency=8, **FAST),
        ):
            await producer.enqueue_many(
                [durq.EnqueueRequest("conn:fan", {}, queue="conn") for _ in range(40)]
            )
            await wait_until(lambda: _true(len(done) == 40), timeout=60)
    finally:
        await app.close()
        await producer.close()
    assert 2 <= counter.peak <= budget, f"{counter.peak} connections, budget {budget}"
