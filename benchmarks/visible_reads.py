"""What the inspector's reads of fair partitions and unique keys cost on a big queue.

On a fresh isolated store per broker: ``--tasks`` pending tasks (default 100,000) spread
over ``--partitions`` partitions of one fair limit (default 10,000; ``tenant:{tenant}``),
each holding a unique key, and ``--running`` of them claimed (active). Then each read runs
``--rounds`` times and the median wall time is printed:

* ``fair_partitions``: ``Inspector.fair_partitions(queue, top=20)`` (``durq queue
  partitions``, ``GET /api/queues/{queue}/partitions``, the queue page, the gauge);
* ``list_unique``: ``Inspector.list_unique(queue, limit=50)`` (``durq queue unique``).

    .venv/bin/python benchmarks/visible_reads.py [--brokers memory,sqlite,postgresql,redis]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _stores import base_url, each_broker

import durq
from durq.bench.isolation import Isolated
from durq.brokers.base import ClaimParams, EnqueueParams
from durq.limits import resolve_all

QUEUE = "tenants"
TENANT = durq.Limit("tenant:{tenant}", concurrency=1000, fair=True)
BATCH = 1000


async def measure(broker_name: str, args: argparse.Namespace, tmpdir: str) -> None:
    memory = broker_name == "memory"
    isolated = None if memory else Isolated.create(base_url(broker_name, tmpdir))
    if isolated is not None:
        await isolated.prepare()
    app = durq.App("memory://visible-reads" if isolated is None else isolated.url)
    try:
        broker = await app.broker()
        if memory:
            await broker.migrate()
        t0 = time.perf_counter()
        for start in range(0, args.tasks, BATCH):
            batch = []
            for i in range(start, min(start + BATCH, args.tasks)):
                payload = {"tenant": f"t{i % args.partitions}", "n": i}
                batch.append(
                    EnqueueParams(
                        id=f"task-{i}", queue=QUEUE, type="bench:job",
                        payload=json.dumps(payload).encode(), unique_key=f"key-{i}",
                        unique_ttl=10**6, limits=resolve_all((TENANT,), payload),
                    )
                )  # fmt: skip
            await broker.enqueue_many(batch)
        filled = time.perf_counter() - t0
        claimed = 0
        while claimed < args.running:
            want = min(500, args.running - claimed)
            claimed += len(await broker.claim(ClaimParams([QUEUE], want, "bench", 3600)))
        inspector = app.inspector
        reads: dict[str, Callable[[], Awaitable[Any]]] = {
            "fair_partitions": lambda: inspector.fair_partitions(QUEUE, 20),
            "list_unique": lambda: inspector.list_unique(QUEUE, limit=50),
        }
        for name, read in reads.items():
            await read()  # warm: statements, scripts
            times = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                seen = await read()
                times.append(time.perf_counter() - t0)
            check = _check(seen)
            print(
                f"{broker_name:10} {name:16} {statistics.median(times) * 1000:9.1f} ms "
                f"(min {min(times) * 1000:.1f}; {args.tasks} tasks, {args.partitions} "
                f"partitions, {claimed} running; filled in {filled:.0f} s) {check}",
                flush=True,
            )
    finally:
        await app.close()
        if isolated is not None:
            await isolated.cleanup()


def _check(seen: Any) -> str:
    """One line that shows the read saw the whole queue."""
    if hasattr(seen, "templates"):
        (t,) = seen.templates
        return f"[{t.partitions} partitions, {t.pending} pending, {t.running} running]"
    return f"[{seen.total} keys held, complete={seen.complete}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--running", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    each_broker(parser, measure)


if __name__ == "__main__":
    main()
