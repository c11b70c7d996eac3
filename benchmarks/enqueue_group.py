"""Group enqueue throughput: ``app.enqueue_group`` of groups of N tasks (default 100) with a
follow-up, sequentially from one coroutine, on each broker, on fresh isolated storage.

    .venv/bin/python benchmarks/enqueue_group.py [--groups 50] [--size 100]
        [--brokers sqlite,postgres,redis,memory]

Prints one JSON object per broker: groups per second and member tasks per second, with
``app.enqueue_many`` of the same tasks (no group) beside it as the reference. PostgreSQL and
Redis are the shared local servers (``DURQ_TEST_PG``, ``DURQ_TEST_REDIS`` or
127.0.0.1 defaults); each run uses its own schema or key prefix and removes it afterwards."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
import uuid
from typing import Any

import durq

PG_DSN = os.environ.get("DURQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("DURQ_TEST_REDIS", "redis://127.0.0.1:6379/9")


def url_for(kind: str, tmp: str, tag: str) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp}/bench-{tag}.sqlite3"
    if kind == "postgres":
        sep = "&" if "?" in PG_DSN else "?"
        return f"{PG_DSN}{sep}schema=durq_bench_{tag}"
    if kind == "redis":
        sep = "&" if "?" in REDIS_URL else "?"
        return f"{REDIS_URL}{sep}prefix=durqbench_{tag}"
    return f"memory://bench_{tag}"


async def cleanup(kind: str, url: str, tag: str) -> None:
    if kind == "postgres":
        import psycopg

        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "durq_bench_{tag}" CASCADE')
    elif kind == "redis":
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(REDIS_URL)
        async for key in client.scan_iter(match=f"durqbench_{tag}:*", count=1000):
            await client.delete(key)
        await client.aclose()


async def measure(kind: str, groups: int, size: int, tmp: str) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:10]
    url = url_for(kind, tmp, tag)
    app = durq.App(url)
    try:
        migrator = app.new_broker()
        await migrator.migrate()
        await migrator.close()
        broker = await app.broker()

        def requests(g: int) -> list[durq.EnqueueRequest]:
            return [durq.EnqueueRequest("bench:part", {"g": g, "i": i}) for i in range(size)]

        await app.enqueue_group(requests(-1), then="bench:merge")  # warm: scripts, statements
        start = time.perf_counter()
        for g in range(groups):
            await app.enqueue_group(requests(g), then="bench:merge")
        grouped = time.perf_counter() - start
        start = time.perf_counter()
        for g in range(groups):
            await app.enqueue_many(requests(groups + g))
        plain = time.perf_counter() - start
        return {
            "broker": broker.name,
            "groups": groups,
            "size": size,
            "groups_per_s": round(groups / grouped, 1),
            "tasks_per_s": round(groups * size / grouped, 1),
            "enqueue_many_tasks_per_s": round(groups * size / plain, 1),
            "python": platform.python_version(),
        }
    finally:
        await app.close()
        await cleanup(kind, url, tag)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=50)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--brokers", default="sqlite,postgres,redis,memory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.brokers.split(","):
            print(json.dumps(await measure(kind.strip(), args.groups, args.size, tmp)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
