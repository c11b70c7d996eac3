"""How soon ``app.wait`` returns after a task's handler finished, on each broker.

A real ``durq worker`` process (``python -m durq worker wait_latency:app``, this module's app)
serves an isolated broker (a fresh PostgreSQL schema, Redis key prefix or temporary SQLite
file, removed at the end). This process enqueues one probe at a time and waits for it with
``app.wait``; the probe sleeps ``--handler-ms`` (so the wait is parked on the broker's
notification, not answered by its first read) and returns ``time.time()``. The figure is
the wall-clock time from that return to ``wait`` returning here: the worker's
acknowledgement, the broker's notification of the end, and the waiter's read of the result.
Both ends read the same machine's clock. ``memory://`` has no other process: its worker runs
in this process (labelled so).

    .venv/bin/python benchmarks/wait_latency.py [--brokers sqlite,postgresql,redis,memory]
        [--tasks 200] [--handler-ms 20] [--pg URL] [--redis URL] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import durq
from durq.bench.isolation import Isolated

HERE = Path(__file__).resolve().parent
QUEUE = "waitbench"
PROBE = "wait:probe"

app = durq.App(os.environ.get("DURQ_BROKER_URL", "memory://waitbench"))


@app.task(PROBE, queue=QUEUE, max_retry=0, retention=600)
async def probe(payload: dict[str, Any]) -> dict[str, float]:
    """Sleeps as asked, then returns the moment it finished."""
    await asyncio.sleep(float(payload.get("sleep", 0.0)))
    return {"done_at": time.time()}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def measure(client: durq.App, tasks: int, sleep: float) -> list[float]:
    """Latencies (ms) of ``tasks`` sequential enqueue-then-wait rounds, after a warm-up."""
    for _ in range(5):  # connections, LISTEN/SUBSCRIBE, prepared statements
        info = await client.enqueue(PROBE, {"sleep": sleep}, queue=QUEUE, retention=600)
        await client.wait(info, timeout=60)
    latencies = []
    for _ in range(tasks):
        info = await client.enqueue(PROBE, {"sleep": sleep}, queue=QUEUE, retention=600)
        result = await client.wait(info, timeout=60)
        latencies.append((time.time() - result["done_at"]) * 1000)
    return latencies


async def run_broker(kind: str, base: str | None, tasks: int, sleep: float) -> dict[str, Any]:
    if kind == "memory":
        url = "memory://waitbench"
        app.rebind(url)
        async with app.worker(queues=[QUEUE]):
            latencies = await measure(app, tasks, sleep)
        await app.close()
        return summary(kind, "worker in this process", latencies)
    isolated = Isolated.create(base)
    await isolated.prepare()
    env = {**os.environ, "DURQ_BROKER_URL": isolated.url, "PYTHONPATH": str(HERE)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "durq", "worker", "wait_latency:app", "--queues", QUEUE],
        env=env,
        cwd=HERE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = durq.App(isolated.url)
    try:
        latencies = await measure(client, tasks, sleep)
    finally:
        await client.close()
        worker.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(20)
        if worker.poll() is None:
            worker.kill()
        await isolated.cleanup()
    return summary(kind, "durq worker process", latencies)


def summary(kind: str, layout: str, latencies: list[float]) -> dict[str, Any]:
    return {
        "broker": kind,
        "layout": layout,
        "tasks": len(latencies),
        "p50_ms": round(statistics.median(latencies), 2),
        "p90_ms": round(percentile(latencies, 90), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "max_ms": round(max(latencies), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="sqlite,postgresql,redis,memory")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--handler-ms", type=float, default=20.0)
    parser.add_argument(
        "--pg", default=os.environ.get("DURQ_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
    )
    parser.add_argument(
        "--redis", default=os.environ.get("DURQ_TEST_REDIS", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bases = {"sqlite": None, "postgresql": args.pg, "redis": args.redis, "memory": None}
    rows = []
    for kind in args.brokers.split(","):
        row = asyncio.run(run_broker(kind, bases[kind], args.tasks, args.handler_ms / 1000))
        rows.append(row)
        if not args.json:
            print(
                f"{row['broker']:<11} {row['layout']:<24} n={row['tasks']:<5} "
                f"p50 {row['p50_ms']:7.2f} ms  p90 {row['p90_ms']:7.2f} ms  "
                f"p99 {row['p99_ms']:7.2f} ms  max {row['max_ms']:7.2f} ms",
                flush=True,
            )
    if args.json:
        print(json.dumps({"load": os.getloadavg(), "results": rows}, indent=2))


if __name__ == "__main__":
    main()
