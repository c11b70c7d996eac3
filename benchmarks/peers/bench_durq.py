"""durq as users run it: the shipped ``durq worker`` command with the README's defaults.

Runs in durq's own virtual environment (``.venv``), through the same ``_common.py`` workloads,
completion counting and clock as every peer. ``BENCH_DURQ_BROKER`` picks the broker (sqlite,
redis, postgresql); ``BENCH_DURQ_WORKER_ARGS`` adds flags to ``durq worker`` (e.g.
``--processes auto``), and the layout column names them."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

from _common import PG_DSN, REDIS_URL, SIGNAL_DIR, Driver, mark, mark_latency

import durq
from durq.options import EnqueueRequest

BROKER = os.environ.get("BENCH_DURQ_BROKER", "redis")
WORKER_ARGS = shlex.split(os.environ.get("BENCH_DURQ_WORKER_ARGS", ""))
URLS = {
    "sqlite": f"sqlite:///{os.path.join(SIGNAL_DIR, 'durq-bench.sqlite3')}",
    "redis": REDIS_URL,
    "postgresql": PG_DSN,
}
app = durq.App(URLS[BROKER])


# retention=0: no result kept, like the peers' no-op tasks (durq's default keeps it an hour).
@app.task("noop", retention=0)
async def noop(payload: dict[str, Any]) -> None:
    mark()


@app.task("probe", retention=0)
async def probe(payload: dict[str, Any]) -> None:
    mark_latency(payload)


class DurqDriver(Driver):
    system = "durq"
    broker = BROKER
    # The README's worker: 1 process, concurrency 10 (the default); --processes auto: 1 per CPU.
    processes = os.cpu_count() or 1 if WORKER_ARGS == ["--processes", "auto"] else 1
    layout = (
        f"`{shlex.join(['durq', 'worker', *WORKER_ARGS])}`: "
        f"{processes} process{'es' if processes > 1 else ''} x 10 async"
    )
    has_bulk = True
    concurrent_callers = "async"

    async def reset(self) -> None:
        if self.broker == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                path = URLS["sqlite"].removeprefix("sqlite:///") + suffix
                if os.path.exists(path):
                    os.remove(path)
            return
        await super().reset()

    async def reset_postgres(self) -> None:
        import psycopg

        async with await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True) as conn:
            await conn.execute("DROP SCHEMA IF EXISTS durq CASCADE")
        await app.close()  # its pooled connections knew the dropped tables
        await super().reset_postgres()

    async def install_schema(self) -> None:
        # `durq migrate`, as the PostgreSQL guide tells users to run once before the workers.
        broker = app.new_broker()
        await broker.migrate()  # type: ignore[attr-defined]
        await broker.close()

    async def close(self) -> None:
        await app.close()

    async def enqueue(self, payload: dict[str, Any], latency: bool = False) -> None:
        await app.enqueue("probe" if latency else "noop", payload)

    async def enqueue_many(self, payloads: list[dict[str, Any]]) -> None:
        await app.enqueue_many([EnqueueRequest("noop", p) for p in payloads])

    def worker_command(self) -> list[str]:
        exe = os.path.join(os.path.dirname(sys.executable), "durq")
        return [exe, "worker", "bench_durq:app", *WORKER_ARGS]

    def worker_env(self) -> dict[str, str]:
        return {"DURQ_BROKER_URL": URLS[BROKER]}


DRIVER = DurqDriver
