"""rq on Redis: SimpleWorker (no fork per job), one process; bulk with Queue.enqueue_many."""

from __future__ import annotations

import os
import sys
from typing import Any

from _common import REDIS_URL, Driver, mark, mark_latency
from redis import Redis
from rq import Queue


def noop(payload: dict[str, Any]) -> None:
    mark()


def probe(payload: dict[str, Any]) -> None:
    mark_latency(payload)


class RqDriver(Driver):
    system = "rq"
    layout = "SimpleWorker, 1 process"
    has_bulk = True

    async def open(self) -> None:
        self.queue = Queue("bench", connection=Redis.from_url(REDIS_URL))

    async def enqueue(self, payload: dict[str, Any], latency: bool = False) -> None:
        self.queue.enqueue(probe if latency else noop, payload)

    async def enqueue_many(self, payloads: list[dict[str, Any]]) -> None:
        self.queue.enqueue_many([Queue.prepare_data(noop, (p,)) for p in payloads])

    def worker_command(self) -> list[str]:
        rq = os.path.join(os.path.dirname(sys.executable), "rq")
        return [rq, "worker", "--url", REDIS_URL, "-w", "rq.worker.SimpleWorker", "-q", "bench"]


DRIVER = RqDriver
