"""Memory: task hashes stay listpack-encoded (the 2x saving the chunked layout exists for),
and the benchmark helper cleans up after itself."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from durq.brokers.base import ClaimParams, CompleteParams, EnqueueParams
from durq.brokers.redis import RedisBroker
from servers import raw_redis

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
from redis_memory import measure, payload_of


@pytest.mark.parametrize("size", [0, 64, 65, 200, 4000])
async def test_task_hashes_stay_listpacks_and_round_trip(rbroker: RedisBroker, size: int) -> None:
    payload = payload_of(size, 7) if size else b"{}"
    headers = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}  # > 64 bytes as JSON
    await rbroker.enqueue(
        EnqueueParams(id="t", queue="default", type="x", payload=payload, headers=headers)
    )
    key = f"{rbroker.prefix}:{{default}}:t:t"
    assert await raw_redis(rbroker).object("encoding", key) == b"listpack"
    info = await rbroker.admin.get_task("default", "t")
    assert info.raw_payload == payload and info.headers == headers
    (lease,) = await rbroker.claim(ClaimParams(["default"], 1, "w", 30))
    assert lease.task.raw_payload == payload
    result = b'"' + b"r" * 300 + b'"'
    assert await rbroker.complete(CompleteParams(lease.ref, result, retention=60))
    assert (await rbroker.admin.get_task("default", "t")).raw_result == result
    assert await raw_redis(rbroker).object("encoding", key) == b"listpack"


async def test_very_large_payloads_are_stored_whole(rbroker: RedisBroker) -> None:
    payload = payload_of(100_000, 1)
    await rbroker.enqueue(EnqueueParams(id="big", queue="default", type="x", payload=payload))
    assert (await rbroker.admin.get_task("default", "big")).raw_payload == payload
    assert await raw_redis(rbroker).hlen(f"{rbroker.prefix}:{{default}}:t:big") < 20


async def test_memory_benchmark_reports_and_cleans_up() -> None:
    from servers import REDIS_URL, require_server

    require_server("redis")
    figures = await measure(REDIS_URL, 500, 200)
    assert figures["tasks"] == 500 and "bytes_per_task" in figures
    assert len(payload_of(200, 12345)) == 200
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        assert [k async for k in client.scan_iter(match="durqmem_*", count=1000)] == []
    finally:
        await client.aclose()
