"""The testing kit's cost per task: enqueue one no-op task and drain it, on ``memory://``.

Each round is what a unit test does: ``await app.enqueue(...)`` then ``await w.drain()``
(claim, run through the worker's executor, acknowledge, and the empty claim that ends the
drain). Reported: the median and p90 of the per-round time, in microseconds, after a warm-up.

    .venv/bin/python benchmarks/testing_kit.py [--rounds 5000] [--broker memory://] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from typing import Any

import durq
import durq.testing


async def measure(broker: str, rounds: int, warmup: int) -> list[float]:
    app = durq.App(broker)

    @app.task("bench:noop")
    async def noop(payload: dict[str, Any]) -> None:
        return None

    timings: list[float] = []
    async with durq.testing.worker(app, keep_completed=False) as w:
        for i in range(rounds + warmup):
            started = time.perf_counter()
            await app.enqueue("bench:noop", {})
            ran = await w.drain()
            elapsed = time.perf_counter() - started
            assert len(ran) == 1 and ran[0].outcome == "completed"
            if i >= warmup:
                timings.append(elapsed * 1e6)
    await app.close()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--broker", default="memory://")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    timings = asyncio.run(measure(args.broker, args.rounds, args.warmup))
    report = {
        "broker": args.broker.split("://")[0],
        "rounds": len(timings),
        "median_us": round(statistics.median(timings), 1),
        "p90_us": round(statistics.quantiles(timings, n=10)[-1], 1),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{report['broker']}: enqueue + drain of one no-op task, {report['rounds']} rounds: "
            f"median {report['median_us']} µs, p90 {report['p90_us']} µs "
            f"(Python {report['python']}, {report['cpus']} CPUs)"
        )


if __name__ == "__main__":
    main()
