"""Bytes of Redis memory per pending task (issue: memory).

Enqueues N pending tasks with a P-byte JSON payload under a fresh key prefix and reads
``INFO memory`` ``used_memory`` before and after; the keys are deleted at the end.

    .venv/bin/python benchmarks/redis_memory.py --tasks 100000 --payload 200 [--url redis://...]

Other clients writing to the same server during the run add noise; run it on a quiet server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid

import redis.asyncio

from durq.brokers.base import EnqueueParams
from durq.brokers.redis import RedisBroker

BATCH = 1000


def payload_of(size: int, i: int) -> bytes:
    """A JSON object of exactly ``size`` bytes (distinct per task)."""
    head = json.dumps({"n": i, "pad": ""}, separators=(",", ":")).encode()
    return json.dumps(
        {"n": i, "pad": "x" * max(0, size - len(head))}, separators=(",", ":")
    ).encode()


def raw(broker: RedisBroker) -> redis.asyncio.Redis:
    """A redis-py client on the broker's server, for what the benchmark reads directly."""
    return redis.asyncio.Redis(connection_pool=broker._storage.pool)


async def used_memory(broker: RedisBroker) -> int:
    info = await raw(broker).info("memory")
    return int(info["used_memory"])


async def measure(url: str, tasks: int, payload: int, queue: str = "default") -> dict[str, object]:
    """Enqueue ``tasks`` pending tasks under a throw-away prefix; return the figures."""
    prefix = f"durqmem_{uuid.uuid4().hex[:10]}"
    sep = "&" if "?" in url else "?"
    broker = RedisBroker.from_url(f"{url}{sep}prefix={prefix}")
    await broker.connect()
    try:
        # The first enqueue creates the per-queue structures; measure from there.
        await broker.enqueue(EnqueueParams(id="warm", queue=queue, type="bench:mem", payload=b"{}"))
        before = await used_memory(broker)
        for start in range(0, tasks, BATCH):
            items = [
                EnqueueParams(
                    id=uuid.uuid4().hex,
                    queue=queue,
                    type="bench:mem",
                    payload=payload_of(payload, i),
                )
                for i in range(start, min(start + BATCH, tasks))
            ]
            outcomes = await broker.enqueue_many(items)
            assert all(o.created for o in outcomes)
        after = await used_memory(broker)
        return {
            "tasks": tasks,
            "payload_bytes": payload,
            "used_memory_before": before,
            "used_memory_after": after,
            "bytes_per_task": round((after - before) / tasks, 1),
            "overhead_per_task": round((after - before) / tasks - payload, 1),
        }
    finally:
        keys = [k async for k in raw(broker).scan_iter(match=f"{prefix}:*", count=5000)]
        for i in range(0, len(keys), 5000):
            await raw(broker).unlink(*keys[i : i + 5000])
        await broker.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--payload", type=int, default=200)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(measure(args.url, args.tasks, args.payload))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
