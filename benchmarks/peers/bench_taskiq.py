"""taskiq with taskiq-redis (ListQueueBroker): one worker process, 100 async tasks."""

from __future__ import annotations

import os
import sys
from typing import Any

from _common import REDIS_URL, Driver, mark, mark_latency
from taskiq_redis import ListQueueBroker

broker = ListQueueBroker(REDIS_URL)


@broker.task(task_name="noop")
async def noop(payload: dict[str, Any]) -> None:
    mark()


@broker.task(task_name="probe")
async def probe(payload: dict[str, Any]) -> None:
    mark_latency(payload)


class TaskiqDriver(Driver):
    system = "taskiq"
    layout = "1 process, 100 async"
    concurrent_callers = "async"

    async def open(self) -> None:
        await broker.startup()

    async def close(self) -> None:
        await broker.shutdown()

    async def enqueue(self, payload: dict[str, Any], latency: bool = False) -> None:
        await (probe if latency else noop).kiq(payload)

    def worker_command(self) -> list[str]:
        exe = os.path.join(os.path.dirname(sys.executable), "taskiq")
        return [
            exe,
            "worker",
            "bench_taskiq:broker",
            "--workers",
            "1",
            "--max-async-tasks",
            "100",
            "--no-configure-logging",
        ]


DRIVER = TaskiqDriver
