"""huey on Redis: RedisHuey with blocking pops; consumer with 2 worker processes."""

from __future__ import annotations

from typing import Any

from _common import REDIS_URL, Driver, mark, mark_latency
from huey import RedisHuey

huey = RedisHuey("durqbench", url=REDIS_URL, blocking=True, results=False)


@huey.task()
def noop(payload: dict[str, Any]) -> None:
    mark()


@huey.task()
def probe(payload: dict[str, Any]) -> None:
    mark_latency(payload)


class HueyDriver(Driver):
    system = "huey"
    layout = "2 processes"

    async def enqueue(self, payload: dict[str, Any], latency: bool = False) -> None:
        (probe if latency else noop)(payload)

    def worker_command(self) -> list[str]:
        import os
        import sys

        consumer = os.path.join(os.path.dirname(sys.executable), "huey_consumer")
        return [consumer, "bench_huey.huey", "-w", "2", "-k", "process", "-q"]


DRIVER = HueyDriver
