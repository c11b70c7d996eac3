"""A PostgreSQL claim's round trip as its queue's history grows, with the plan made on an
empty table.

A worker's pooled connection prepares the claim on one generic plan, usually soon after
``durq migrate``: the table is empty and has no statistics then, and the plan stays until
the server analyzes the table (autovacuum, about a minute after enough change). This tool
reproduces that: one connection (``pool_max=1``), autovacuum off for the tasks table, the
claim planned on the empty queue; then the queue gets ``--steps`` finished tasks (inserted
as completed rows), and at each step ``--claims`` tasks are enqueued and claimed one at a
time. It prints the median claim round trip (client to server and back) per step.

Storage is private to this tool: the PostgreSQL database ``durq_history`` (created again,
dropped at the end).

    .venv/bin/python benchmarks/claim_history.py [--steps 0,1000,5000,20000] [--claims 300]

Run it with another build's interpreter (``PYTHONPATH=<checkout>/src``) to compare builds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

# This directory is on sys.path when run as a script.
from compare import dropped_at_the_end
from psycopg import sql
from run import recreate_pg_database

from durq.brokers.base import ClaimParams, EnqueueParams
from durq.brokers.postgres import PostgresBroker

PG_DB = "durq_history"
URL = f"postgresql://postgres@127.0.0.1:5432/{PG_DB}?pool_max=1"


async def measure(steps: list[int], claims: int) -> list[tuple[int, float]]:
    broker = PostgresBroker.from_url(URL)
    claim = ClaimParams(["q"], 1, "w", 60.0)
    rows: list[tuple[int, float]] = []
    try:
        await broker.migrate()
        async with broker._storage.connection("history") as conn:
            await conn.execute("ALTER TABLE durq.tasks SET (autovacuum_enabled = false)")
        for _ in range(8):  # psycopg prepares a statement at its fifth call on a connection
            await broker.claim(claim)
        history = 0
        for step in steps:
            async with broker._storage.connection("history") as conn:
                await conn.execute(
                    sql.SQL(
                        "INSERT INTO durq.tasks (queue, id, type, payload, state, max_retry,"
                        " next_process_at, enqueued_at, expires_at)"
                        " SELECT 'q', 'done-' || i, 't', '\\x7b7d', 'completed', 0, 0, 0, 1e12"
                        " FROM generate_series({}::integer, {}::integer) AS i"
                    ).format(history + 1, step)
                )
            history = max(history, step)
            times = []
            for _ in range(claims):
                await broker.enqueue(EnqueueParams(uuid.uuid4().hex, "q", "t", b"{}"))
                started = time.perf_counter()
                leases = await broker.claim(claim)
                times.append(time.perf_counter() - started)
                assert len(leases) == 1
            rows.append((history, statistics.median(times) * 1e6))
    finally:
        await broker.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="0,1000,5000,20000", help="finished tasks, rising")
    parser.add_argument("--claims", type=int, default=300, help="claims timed per step")
    args = parser.parse_args()
    steps = sorted(int(x) for x in args.steps.split(","))
    recreate_pg_database(name=PG_DB)
    with dropped_at_the_end("postgresql", PG_DB):
        rows = asyncio.run(measure(steps, args.claims))
    print("finished tasks in the queue | claim round trip, median µs")
    for history, micros in rows:
        print(f"{history:>27,} | {micros:,.0f}")


if __name__ == "__main__":
    main()
