"""arq on Redis: one process, max_jobs 100."""

from __future__ import annotations

import os
import sys
from typing import Any

from _common import REDIS_URL, Driver, mark, mark_latency
from arq import create_pool
from arq.connections import RedisSettings

SETTINGS = RedisSettings.from_dsn(REDIS_URL)


async def noop(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
    mark()


async def probe(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
    mark_latency(payload)


class WorkerSettings:
    functions = [noop, probe]
    redis_settings = SETTINGS
    max_jobs = 100
    keep_result = 0


class ArqDriver(Driver):
    system = "arq"
    layout = "1 process, 100 async"
    concurrent_callers = "async"

    async def open(self) -> None:
        self.pool = await create_pool(SETTINGS)

    async def close(self) -> None:
        if getattr(self, "pool", None) is not None:
            await self.pool.aclose()
            self.pool = None

    async def enqueue(self, payload: dict[str, Any], latency: bool = False) -> None:
        await self.pool.enqueue_job("probe" if latency else "noop", payload)

    def worker_command(self) -> list[str]:
        exe = os.path.join(os.path.dirname(sys.executable), "arq")
        return [exe, "bench_arq.WorkerSettings"]


DRIVER = ArqDriver
