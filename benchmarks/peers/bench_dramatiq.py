"""dramatiq on Redis: its default worker layout here is 2 processes x 8 threads."""

from __future__ import annotations

import os
import sys
from typing import Any

import dramatiq
from _common import REDIS_URL, Driver, mark, mark_latency
from dramatiq.brokers.redis import RedisBroker

dramatiq.set_broker(RedisBroker(url=REDIS_URL))


@dramatiq.actor(max_retries=0)
def noop(payload: dict[str, Any]) -> None:
    mark()


@dramatiq.actor(max_retries=0)
def probe(payload: dict[str, Any]) -> None:
    mark_latency(payload)


class DramatiqDriver(Driver):
    system = "dramatiq"
    layout = "2 processes x 8 threads"

    async def enqueue(self, payload: dict[str, Any], latency: bool = False) -> None:
        (probe if latency else noop).send(payload)

    def worker_command(self) -> list[str]:
        exe = os.path.join(os.path.dirname(sys.executable), "dramatiq")
        return [exe, "bench_dramatiq", "--processes", "2", "--threads", "8"]


DRIVER = DramatiqDriver
