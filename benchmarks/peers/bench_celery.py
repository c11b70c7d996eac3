"""celery on Redis: prefork pool with 2 children."""

from __future__ import annotations

import os
import sys
from typing import Any

from _common import REDIS_URL, Driver, mark, mark_latency
from celery import Celery

app = Celery("bench_celery", broker=REDIS_URL)
app.conf.task_ignore_result = True
app.conf.worker_hijack_root_logger = False


@app.task(name="noop")
def noop(payload: dict[str, Any]) -> None:
    mark()


@app.task(name="probe")
def probe(payload: dict[str, Any]) -> None:
    mark_latency(payload)


class CeleryDriver(Driver):
    system = "celery"
    layout = "prefork, 2 children"

    async def enqueue(self, payload: dict[str, Any], latency: bool = False) -> None:
        (probe if latency else noop).delay(payload)

    def worker_command(self) -> list[str]:
        exe = os.path.join(os.path.dirname(sys.executable), "celery")
        return [
            exe,
            "-A",
            "bench_celery",
            "worker",
            "--pool",
            "prefork",
            "-c",
            "2",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
        ]


DRIVER = CeleryDriver
