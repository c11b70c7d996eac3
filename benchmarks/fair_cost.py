"""What ``fair=True`` costs a limited task, per enqueue and per claim, same run.

On a fresh isolated store per broker, two ways in queues of their own, interleaved in rounds
so the machine's other load falls on each alike:

* ``limited``: ``Limit("tenant:{tenant}", concurrency=1000)``;
* ``fair``: the same limit with ``fair=True``.

Each round enqueues ``-n`` tasks per way with one ``await app.enqueue(...)`` at a time (ten
tenants in turn), then claims them back one task per claim (``broker.claim``, limit 1), as a
worker that finds one task at a time does. Prints enqueues and claims per second (median of
the rounds) and the ratio to ``limited``. In-process client figures: what the option adds to
the call, not a worker's throughput.

    .venv/bin/python benchmarks/fair_cost.py [--brokers sqlite,postgresql,redis] [-n 1000]
"""

from __future__ import annotations

import argparse
import statistics
import time

from _stores import base_url, each_broker

import durq
from durq.bench.isolation import Isolated
from durq.brokers import open_broker
from durq.brokers.base import ClaimParams

WAYS = {
    "limited": durq.Limit("tenant:{tenant}", concurrency=1000),
    "fair": durq.Limit("tenant:{tenant}", concurrency=1000, fair=True),
}


async def measure(broker_name: str, args: argparse.Namespace, tmpdir: str) -> None:
    n, rounds = args.n, args.rounds
    isolated = Isolated.create(base_url(broker_name, tmpdir))
    await isolated.prepare()
    app = durq.App(isolated.url)
    claimer = open_broker(isolated.url)
    await claimer.connect()
    counter = iter(range(10**9))

    async def enqueue(way: str, count: int) -> float:
        t0 = time.perf_counter()
        for _ in range(count):
            i = next(counter)
            await app.enqueue(
                "bench:job", {"tenant": f"t{i % 10}", "n": i}, queue=way, limit=WAYS[way]
            )
        return count / (time.perf_counter() - t0)

    async def claim(way: str, count: int) -> float:
        params = ClaimParams(queues=[way], limit=1, worker_id="bench", lease_seconds=3600)
        t0 = time.perf_counter()
        got = 0
        while got < count:
            leases = await claimer.claim(params)
            assert leases, f"{way}: the backlog ran out at {got} of {count}"
            got += len(leases)
        return count / (time.perf_counter() - t0)

    enqueues: dict[str, list[float]] = {way: [] for way in WAYS}
    claims: dict[str, list[float]] = {way: [] for way in WAYS}
    try:
        for way in WAYS:  # warm: connections, statements, scripts, counters
            await enqueue(way, 50)
            await claim(way, 50)
        for r in range(rounds):
            order = list(WAYS) if r % 2 == 0 else list(reversed(WAYS))
            for way in order:
                enqueues[way].append(await enqueue(way, n))
            for way in order:
                claims[way].append(await claim(way, n))
        for what, rates in (("enqueue", enqueues), ("claim", claims)):
            base = statistics.median(rates["limited"])
            for way, seen in rates.items():
                rate = statistics.median(seen)
                print(
                    f"{broker_name:10} {what:7} {way:8} {rate:8.0f}/s  {rate / base:5.2f}x limited"
                )
    finally:
        await claimer.close()
        await app.close()
        await isolated.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=1000, help="tasks per way per round")
    parser.add_argument("--rounds", type=int, default=3)
    each_broker(parser, measure)


if __name__ == "__main__":
    main()
