"""procrastinate on PostgreSQL (psycopg): one worker process, concurrency 50; bulk with
batch_defer_async."""

from __future__ import annotations

import os
import sys
from typing import Any

from _common import PG_DSN, Driver, mark, mark_latency
from procrastinate import App, PsycopgConnector

app = App(connector=PsycopgConnector(conninfo=PG_DSN))


@app.task(name="noop", queue="bench")
async def noop(payload: dict[str, Any]) -> None:
    mark()


@app.task(name="probe", queue="bench")
async def probe(payload: dict[str, Any]) -> None:
    mark_latency(payload)


class ProcrastinateDriver(Driver):
    system = "procrastinate"
    broker = "postgresql"
    layout = "1 process, 50 async"
    concurrent_callers = "async"
    has_bulk = True

    async def install_schema(self) -> None:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def open(self) -> None:
        await app.open_async()

    async def close(self) -> None:
        await app.close_async()

    async def enqueue(self, payload: dict[str, Any], latency: bool = False) -> None:
        await (probe if latency else noop).defer_async(payload=payload)

    async def enqueue_many(self, payloads: list[dict[str, Any]]) -> None:
        await noop.batch_defer_async(*({"payload": p} for p in payloads))

    def worker_command(self) -> list[str]:
        exe = os.path.join(os.path.dirname(sys.executable), "procrastinate")
        return [exe, "--app=bench_procrastinate.app", "worker", "--concurrency", "50"]


DRIVER = ProcrastinateDriver
