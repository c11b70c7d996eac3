"""pgqueuer on PostgreSQL (asyncpg): one process; bulk is one multi-row INSERT."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from _common import PG_DSN, Driver, mark, mark_latency
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries


@contextlib.asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    connection = await asyncpg.connect(PG_DSN)
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        mark()

    @pgq.entrypoint("probe")
    async def probe(job: Job) -> None:
        mark_latency(json.loads(job.payload or b"{}"))

    try:
        yield pgq
    finally:
        await connection.close()


class PgqueuerDriver(Driver):
    system = "pgqueuer"
    broker = "postgresql"
    layout = "1 process, async"
    concurrent_callers = "async"
    has_bulk = True

    async def install_schema(self) -> None:
        conn = await asyncpg.connect(PG_DSN)
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()

    async def open(self) -> None:
        # A pool, as a web process shares it between concurrent requests.
        self.pool = await asyncpg.create_pool(PG_DSN, min_size=1, max_size=10)
        self.queries = Queries(AsyncpgPoolDriver(self.pool))

    async def close(self) -> None:
        if getattr(self, "pool", None) is not None:
            await self.pool.close()
            self.pool = None

    async def enqueue(self, payload: dict[str, Any], latency: bool = False) -> None:
        await self.queries.enqueue("probe" if latency else "noop", json.dumps(payload).encode())

    async def enqueue_many(self, payloads: list[dict[str, Any]]) -> None:
        await self.queries.enqueue(
            ["noop"] * len(payloads),
            [json.dumps(p).encode() for p in payloads],
            [0] * len(payloads),
        )

    def worker_command(self) -> list[str]:
        # pgqueuer.run (the function behind `pgq run`): this pgq CLI fails on its own
        # --log-level default with the installed typer.
        return [
            sys.executable,
            "-c",
            "import asyncio, pgqueuer, bench_pgqueuer; "
            "asyncio.run(pgqueuer.run(bench_pgqueuer.main))",
        ]


DRIVER = PgqueuerDriver
