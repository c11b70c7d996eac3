"""saq on Redis: one worker process, concurrency 100."""

from __future__ import annotations

import os
import sys
from typing import Any

from _common import REDIS_URL, Driver, mark, mark_latency
from saq import Queue


def make_queue() -> Queue:
    return Queue.from_url(REDIS_URL, name="bench")


async def noop(ctx: dict[str, Any], *, payload: dict[str, Any]) -> None:
    mark()


async def probe(ctx: dict[str, Any], *, payload: dict[str, Any]) -> None:
    mark_latency(payload)


settings = {"queue": make_queue(), "functions": [noop, probe], "concurrency": 100}


class SaqDriver(Driver):
    system = "saq"
    layout = "1 process, 100 async"
    concurrent_callers = "async"

    async def open(self) -> None:
        self.queue = make_queue()
        await self.queue.connect()

    async def close(self) -> None:
        if getattr(self, "queue", None) is not None:
            await self.queue.disconnect()
            self.queue = None

    async def enqueue(self, payload: dict[str, Any], latency: bool = False) -> None:
        await self.queue.enqueue("probe" if latency else "noop", payload=payload)

    def worker_command(self) -> list[str]:
        exe = os.path.join(os.path.dirname(sys.executable), "saq")
        return [exe, f"{self.__module__}.settings", "--workers", "1"]


DRIVER = SaqDriver
