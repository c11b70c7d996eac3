"""saq on PostgreSQL: one worker process, concurrency 100."""

from __future__ import annotations

import bench_saq
from _common import PG_DSN
from saq import Queue


def make_queue() -> Queue:
    return Queue.from_url(PG_DSN, name="bench")


settings = {
    "queue": make_queue(),
    "functions": [bench_saq.noop, bench_saq.probe],
    "concurrency": 100,
}


class SaqPgDriver(bench_saq.SaqDriver):
    broker = "postgresql"

    async def open(self) -> None:
        self.queue = make_queue()
        await self.queue.connect()


DRIVER = SaqPgDriver
