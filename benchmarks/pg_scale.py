"""PostgreSQL scale check: does the claim stay fast on a table full of finished tasks?

Builds two isolated schemas:

* ``base``: 100,000 pending tasks and nothing else;
* ``loaded``: the same 100,000 pending tasks plus 1,000,000 completed/archived ones,

(rows written with ``generate_series``, then ``VACUUM ANALYZE``), prints
``EXPLAIN (ANALYZE, BUFFERS)`` of the claim statement on ``loaded`` (inside a rolled-back
transaction), and measures claim throughput in both: batches of ``claim`` +
``complete_many`` (results retained, as in production) through the broker API. Both schemas
are dropped at the end, also on failure.

    .venv/bin/python benchmarks/pg_scale.py [--dsn postgresql://postgres@127.0.0.1:5432/test]
        [--finished 1000000] [--pending 100000] [--claims 20000] [--batch 50] [--json]

``--worker`` measures instead what the issue asks for: the processing rate of one real worker
process (``python -m durq.bench worker``, concurrency ``--concurrency``, the same worker
``durq bench`` times) draining the pending tasks, on the loaded table and on the base table,
alternated; ``--drain`` tasks per run (two runs per table). The pending tasks are then
``bench:noop`` tasks on the bench queue, due at the real time; completions are checked from the
broker (processed total, as ``durq bench`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

from durq.bench.tasks import NOOP, PROCESS_QUEUE
from durq.brokers.base import ClaimParams, CompleteParams
from durq.brokers.postgres import PostgresBroker
from durq.clock import FakeClock

NOW = 1_800_000_000.0

# Finished rows: 90% completed (retained for 30 days), 10% archived; ids and times spread out.
FILL_FINISHED = """
INSERT INTO {schema}.tasks (queue, id, type, payload, state, max_retry, retried, last_error,
                            next_process_at, enqueued_at, started_at, completed_at, result,
                            retention, expires_at)
SELECT 'default', 'done-' || g, 'bench:task', convert_to('{{"i":' || g || '}}', 'UTF8'),
       CASE WHEN g %% 10 = 0 THEN 'archived' ELSE 'completed' END, 25,
       CASE WHEN g %% 10 = 0 THEN 25 ELSE 0 END,
       CASE WHEN g %% 10 = 0 THEN 'boom' END,
       %(now)s - 86400 + g * 0.05, %(now)s - 86400 + g * 0.05, %(now)s - 86400 + g * 0.05,
       CASE WHEN g %% 10 = 0 THEN NULL ELSE %(now)s - 86400 + g * 0.05 END,
       CASE WHEN g %% 10 = 0 THEN NULL ELSE convert_to('"ok"', 'UTF8') END,
       CASE WHEN g %% 10 = 0 THEN 0 ELSE 2592000 END,
       CASE WHEN g %% 10 = 0 THEN NULL ELSE %(now)s + 2592000 END
FROM generate_series(1, %(n)s) AS g
"""

FILL_PENDING = """
INSERT INTO {schema}.tasks (queue, id, type, payload, state, max_retry, next_process_at,
                            enqueued_at)
SELECT %(queue)s, 'todo-' || g, %(type)s, convert_to('{{"i":' || g || '}}', 'UTF8'),
       'pending', 25, %(now)s - 3600 + g * 0.01, %(now)s - 3600 + g * 0.01
FROM generate_series(1, %(n)s) AS g
"""


def run_sql(dsn: str, template: str, schema: str, params: dict[str, Any] | None = None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(template).format(schema=sql.Identifier(schema)), params)  # type: ignore[arg-type]


async def build(
    dsn: str,
    schema: str,
    finished: int,
    pending: int,
    *,
    now: float = NOW,
    queue: str = "default",
    task_type: str = "bench:task",
) -> float:
    broker = PostgresBroker.from_url(f"{dsn}?schema={schema}")
    await broker.migrate()
    await broker.close()
    start = time.perf_counter()
    if finished:
        run_sql(dsn, FILL_FINISHED, schema, {"now": now, "n": finished})
    run_sql(
        dsn, FILL_PENDING, schema, {"now": now, "n": pending, "queue": queue, "type": task_type}
    )
    run_sql(dsn, "INSERT INTO {schema}.queues (name) VALUES (%(q)s)", schema, {"q": queue})
    run_sql(dsn, "VACUUM ANALYZE {schema}.tasks", schema)
    return time.perf_counter() - start


async def explain_claim(dsn: str, schema: str, batch: int) -> str:
    broker = PostgresBroker.from_url(f"{dsn}?schema={schema}")
    query = broker._storage.statements["claim"]  # the exact statement the broker runs
    params = {
        "queues": ["default"],
        "limit": batch,
        "now": NOW,
        "lease_until": NOW + 30,
        "worker_id": "explain",
    }
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(b"EXPLAIN (ANALYZE, BUFFERS) " + query, params)
        plan = "\n".join(row[0] for row in await cur.fetchall())
        await conn.rollback()  # EXPLAIN ANALYZE really ran the UPDATE
    await broker.close()
    return plan


async def throughput(dsn: str, schema: str, claims: int, batch: int) -> dict[str, float]:
    clock = FakeClock(NOW)
    broker = PostgresBroker.from_url(f"{dsn}?schema={schema}", clock=clock)
    await broker.connect()
    params = ClaimParams(queues=["default"], limit=batch, worker_id="bench", lease_seconds=30)
    # Warm up (prepared statements, caches) outside the measurement.
    for _ in range(5):
        leases = await broker.claim(params)
        await broker.complete_many([CompleteParams(x.ref, b'"ok"', 3600) for x in leases])
    done = 0
    claim_s = 0.0
    start = time.perf_counter()
    while done < claims:
        t0 = time.perf_counter()
        leases = await broker.claim(params)
        claim_s += time.perf_counter() - t0
        if not leases:
            break
        ok = await broker.complete_many([CompleteParams(x.ref, b'"ok"', 3600) for x in leases])
        assert all(ok)
        done += len(leases)
    total = time.perf_counter() - start
    await broker.close()
    return {
        "tasks": done,
        "tasks_per_s": round(done / total, 1),
        "claim_ms_per_batch": round(1000 * claim_s / max(1, done / batch), 3),
    }


async def worker_drain(dsn: str, schema: str, n: int, concurrency: int) -> dict[str, float]:
    """One bench worker process drains ``n`` no-op tasks; rate from "go" to "drained"."""
    url = f"{dsn}?schema={schema}"
    broker = PostgresBroker.from_url(url)
    before = (await broker.admin.queue_stats(PROCESS_QUEUE)).processed_total
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "durq.bench", "worker", "--broker", url,
        "--concurrency", str(concurrency), "--process", str(n), "--progress-every", str(n),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None

    async def event(name: str) -> dict[str, Any]:
        assert proc.stdout is not None
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), 600)
            if not line:
                raise RuntimeError(f"the bench worker exited before {name!r}")
            with contextlib.suppress(ValueError):
                message: dict[str, Any] = json.loads(line)
                if message.get("event") == name:
                    return message

    try:
        await event("ready")
        started = time.time()
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        drained = await event("drained")
        elapsed = float(drained["t"]) - started
        proc.stdin.write(b"stop\n")
        await proc.stdin.drain()
        await asyncio.wait_for(proc.wait(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    processed = (await broker.admin.queue_stats(PROCESS_QUEUE)).processed_total - before
    await broker.close()
    # The worker keeps taking tasks between "drained" and "stop": at least n, never fewer.
    if processed < n:
        raise RuntimeError(f"the broker counts {processed} processed, fewer than {n}")
    return {"tasks": n, "tasks_per_s": round(n / elapsed, 1)}


def drop(dsn: str, schema: str) -> None:
    run_sql(dsn, "DROP SCHEMA IF EXISTS {schema} CASCADE", schema)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help="drain with a real worker process")
    parser.add_argument("--drain", type=int, default=50_000, help="tasks per worker run")
    parser.add_argument("--concurrency", type=int, default=100)
    args = parser.parse_args()
    if args.worker:
        await main_worker(args)
        return
    tag = uuid.uuid4().hex[:8]
    base, loaded = f"durq_scale_base_{tag}", f"durq_scale_loaded_{tag}"
    report: dict[str, Any] = {
        "finished": args.finished,
        "pending": args.pending,
        "claims": args.claims,
        "batch": args.batch,
    }
    try:
        report["build_s"] = {
            "base": round(await build(args.dsn, base, 0, args.pending), 1),
            "loaded": round(await build(args.dsn, loaded, args.finished, args.pending), 1),
        }
        report["plan"] = await explain_claim(args.dsn, loaded, args.batch)
        # Alternate the runs so background load hits both alike.
        half = args.claims // 2
        runs: dict[str, list[dict[str, float]]] = {"base": [], "loaded": []}
        for _ in range(2):
            runs["base"].append(await throughput(args.dsn, base, half, args.batch))
            runs["loaded"].append(await throughput(args.dsn, loaded, half, args.batch))
        for name, results in runs.items():
            tasks = sum(r["tasks"] for r in results)
            secs = sum(r["tasks"] / r["tasks_per_s"] for r in results)
            report[name] = {
                "tasks": tasks,
                "tasks_per_s": round(tasks / secs, 1),
                "claim_ms_per_batch": round(
                    sum(r["claim_ms_per_batch"] for r in results) / len(results), 3
                ),
            }
        report["loaded_vs_base"] = round(
            report["loaded"]["tasks_per_s"] / report["base"]["tasks_per_s"], 3
        )
    finally:
        drop(args.dsn, base)
        drop(args.dsn, loaded)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"build: {report['build_s']}")
    print("EXPLAIN (ANALYZE, BUFFERS) of the claim on the loaded table:")
    print(report["plan"])
    for name in ("base", "loaded"):
        print(f"{name}: {report[name]}")
    print(f"loaded / base throughput: {report['loaded_vs_base']}")


async def main_worker(args: argparse.Namespace) -> None:
    """``--worker``: real worker process, loaded vs base table, alternated."""
    tag = uuid.uuid4().hex[:8]
    base, loaded = f"durq_scale_base_{tag}", f"durq_scale_loaded_{tag}"
    now = time.time()
    fill = {"now": now, "queue": PROCESS_QUEUE, "task_type": NOOP}
    report: dict[str, Any] = {
        "mode": "worker",
        "finished": args.finished,
        "pending": args.pending,
        "drain_per_run": args.drain,
        "concurrency": args.concurrency,
    }
    runs: dict[str, list[dict[str, float]]] = {"base": [], "loaded": []}
    try:
        report["build_s"] = {
            "base": round(await build(args.dsn, base, 0, args.pending, **fill), 1),
            "loaded": round(await build(args.dsn, loaded, args.finished, args.pending, **fill), 1),
        }
        for _ in range(2):
            for name, schema in (("base", base), ("loaded", loaded)):
                result = await worker_drain(args.dsn, schema, args.drain, args.concurrency)
                runs[name].append(result)
                if not args.json:
                    print(f"{name}: {result}", flush=True)
    finally:
        drop(args.dsn, base)
        drop(args.dsn, loaded)
    for name, results in runs.items():
        tasks = sum(r["tasks"] for r in results)
        secs = sum(r["tasks"] / r["tasks_per_s"] for r in results)
        report[name] = {"runs": results, "tasks_per_s": round(tasks / secs, 1)}
    report["loaded_vs_base"] = round(
        report["loaded"]["tasks_per_s"] / report["base"]["tasks_per_s"], 3
    )
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"build: {report['build_s']}")
    for name in ("base", "loaded"):
        print(f"{name}: {report[name]['tasks_per_s']} tasks/s")
    print(f"loaded / base processing rate: {report['loaded_vs_base']}")


if __name__ == "__main__":
    asyncio.run(main())
